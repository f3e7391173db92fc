"""Fixtures of the control suites: the implementation under test (``control_spec``).

``server_spec`` and ``client_spec`` are the same spec for a test of one
side's clauses: when the implementation lacks that side the test is skipped
in setup, before Hypothesis runs it, with one sentence naming the clause
(the test's first ``clause`` mark) and the missing side.

``control_spec`` is the implementation the session configured
(``--zmq-contract control --zmq-transport MODULE:ATTR``, or the user's
``zmq_transport_factory`` fixture); ``ZMQ_CONFORMANCE_CONTROL``
(``MODULE:ATTR``) overrides it; without either it is the reference.
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance.config.fixtures import contract_spec
from conformance.contracts.control.spec import ControlSpec, load

#: Environment variable naming an implementation, beating the configuration.
ENV_TARGET = "ZMQ_CONFORMANCE_CONTROL"
CONTRACT = "control"


@pytest.fixture
def control_spec(request: pytest.FixtureRequest, zmq_transport_factory: Any) -> ControlSpec:
    """The control implementation under test."""
    spec: ControlSpec = contract_spec(request, zmq_transport_factory, CONTRACT,
                                   env=ENV_TARGET, load=load)
    return spec


def _first_clause(request: pytest.FixtureRequest) -> str:
    mark = request.node.get_closest_marker("clause")
    return str(mark.args[0]) if mark is not None and mark.args else "this clause"


@pytest.fixture
def server_spec(request: pytest.FixtureRequest, control_spec: ControlSpec) -> ControlSpec:
    """``control_spec`` of an implementation with a server (else the test is skipped)."""
    control_spec.require("server", _first_clause(request))
    return control_spec


@pytest.fixture
def client_spec(request: pytest.FixtureRequest, control_spec: ControlSpec) -> ControlSpec:
    """``control_spec`` of an implementation with a client (else the test is skipped); a
    client that cannot send the suite's own request types is skipped too."""
    clause = _first_clause(request)
    control_spec.require("client", clause)
    control_spec.require_suite_types(clause)
    return control_spec
