"""pytest plugin: the suite's face inside pytest (auto-loaded via ``pytest11``)."""

from __future__ import annotations

import pytest

from conformance.fixtures import zmq_transport_factory, zmq_transport_spec

__all__ = ["zmq_transport_factory", "zmq_transport_spec"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "clause(*ids): the contract clauses (DESIGN.md IDs) this test checks"
    )
