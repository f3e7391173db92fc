"""Fixtures of the control suite."""

from __future__ import annotations

from conformance.contracts.control.fixtures import control_spec

__all__ = ["control_spec"]
