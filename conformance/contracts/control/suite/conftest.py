"""Fixtures of the control suite."""

from __future__ import annotations

from conformance.contracts.control.fixtures import client_spec, control_spec, server_spec

__all__ = ["client_spec", "control_spec", "server_spec"]
