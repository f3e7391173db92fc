"""The engine-pipeline state machine (see :mod:`conformance.contracts.engine_pipeline.machine`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from conformance.contracts.engine_pipeline.machine import PipelineMachine, machine_settings, run
from conformance.contracts.engine_pipeline.spec import PipelineSpec


@pytest.mark.clause("PIPE-2", "PIPE-5", "PIPE-11", "PIPE-12")
def test_pipeline_machine(pipeline_spec: PipelineSpec, tmp_path: Path,
                          record_property: Callable[[str, object], None]) -> None:
    """Adds, aborts, calls, drains, slow readers, kills, pauses and restarts against the model."""
    pipeline_spec.require("client", "PIPE-2")
    pipeline_spec.require("engine", "PIPE-2")
    built: list[PipelineMachine] = []

    def build() -> PipelineMachine:
        where = tmp_path / f"m{len(built)}"
        where.mkdir()
        built.append(PipelineMachine(pipeline_spec, where))
        return built[-1]

    try:
        run(build, machine_settings())
    finally:
        record_property("examples", len(built))
