"""Fixtures of the control suite."""

from __future__ import annotations

import pytest

from conformance.contracts.control.fixtures import control_spec

__all__ = ["control_spec"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ctl_clause(*ids): control-channel clauses")
