"""Fixtures of the control suites: the implementation under test (``control_spec``).

``control_spec`` is the implementation the session configured
(``--zmq-contract control --zmq-transport MODULE:ATTR``, or the user's
``zmq_transport_factory`` fixture); ``ZMQ_CONFORMANCE_CONTROL``
(``MODULE:ATTR``) overrides it; without either it is the reference.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from conformance.config.fixtures import contract_spec
from conformance.contracts.control.spec import ControlSpec, load
from conformance.errors import ConfigError

#: Environment variable naming an implementation, beating the configuration.
ENV_TARGET = "ZMQ_CONFORMANCE_CONTROL"
CONTRACT = "control"


@pytest.fixture
def control_spec(request: pytest.FixtureRequest, zmq_transport_factory: Any) -> ControlSpec:
    """The control implementation under test."""
    override = os.environ.get(ENV_TARGET)
    if override:
        try:
            return load(override, option=ENV_TARGET)
        except ConfigError as exc:
            pytest.fail(str(exc), pytrace=False)
    spec: ControlSpec = contract_spec(request, zmq_transport_factory, CONTRACT)
    return spec
