"""Fixtures of the engine-pipeline suite."""

from __future__ import annotations

from conformance.contracts.engine_pipeline.fixtures import pipeline_spec, rig

__all__ = ["pipeline_spec", "rig"]
