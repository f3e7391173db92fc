"""The engine-pipeline state machine (see :mod:`conformance.contracts.engine_pipeline.machine`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from conformance.contracts.engine_pipeline.machine import PipelineMachine, machine_settings, run
from conformance.contracts.engine_pipeline.spec import PipelineSpec


@pytest.mark.clause("PIPE-2", "PIPE-5", "PIPE-11", "PIPE-12")
@pytest.mark.parametrize("policy", ["none", "adopt"], ids=["restart-none", "restart-adopt"])
def test_pipeline_machine(pipeline_spec: PipelineSpec, tmp_path: Path, policy: str,
                          record_property: Callable[[str, object], None]) -> None:
    """Adds, aborts, calls, drains, slow readers, kills, pauses and restarts against the model,
    once per declared restart policy."""
    pipeline_spec.require("client", "PIPE-2")
    pipeline_spec.require("engine", "PIPE-2")
    pipeline_spec.capabilities.restart_option(policy, "PIPE-11")
    built: list[PipelineMachine] = []

    def build() -> PipelineMachine:
        where = tmp_path / f"m{len(built)}"
        where.mkdir()
        built.append(PipelineMachine(pipeline_spec, where, policy))
        return built[-1]

    try:
        run(build, machine_settings(len(pipeline_spec.capabilities.restart_policies)))
    finally:
        record_property("examples", len(built))
