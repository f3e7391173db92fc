"""Fixtures of the engine-pipeline chaos suite; ``toxiproxy`` comes from :mod:`chaos.fixtures`."""

from __future__ import annotations

from conformance.contracts.engine_pipeline.fixtures import pipeline_spec, rig

__all__ = ["pipeline_spec", "rig"]
