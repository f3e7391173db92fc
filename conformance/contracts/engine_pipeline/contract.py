"""The ``engine-pipeline`` contract's registry entry: its clauses and where its parts live."""

from __future__ import annotations

from typing import Final

from conformance.contract import Contract
from conformance.contracts.engine_pipeline.clauses import CLAUSES

__all__ = ["CONTRACTS"]

CONTRACTS: Final = (
    Contract(
        name="engine-pipeline",
        title="API server <-> EngineCore pipeline (vllm-v1: ROUTER/DEALER, PUSH/PULL, aux frames)",
        clauses=CLAUSES,
        suite=("conformance.contracts.engine_pipeline.suite",),
        chaos_suite=("conformance.contracts.engine_pipeline.chaos_suite",),
        default_factory="reference_impl.engine_pipeline:REFERENCE",
        mutants="conformance.contracts.engine_pipeline.mutants:CATALOG",
        fixture="pipeline_spec",
        make_spec="conformance.contracts.engine_pipeline.spec:make_spec",
        capabilities="conformance.contracts.engine_pipeline.spec:PipelineCapabilities",
        factory_shape="an object with factories engine(addresses, *, engine_index, model) "
        "and/or client(addresses, *, client_index, client_count, engine_indices), or a "
        "callable of no arguments returning one",
        probe=((), {}),
        preflight="conformance.contracts.engine_pipeline.preflight:check_profile",
        driver="conformance.contracts.engine_pipeline.driver:PipelineDriver",
        python_service="conformance.contracts.engine_pipeline.service:PipelineService",
    ),
)
