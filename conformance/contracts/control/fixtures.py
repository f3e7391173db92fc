"""Fixtures of the control suites: the implementation under test (``control_spec``)."""

from __future__ import annotations

import os

import pytest

from conformance.contracts.control.spec import DEFAULT_TARGET, ControlSpec, load
from conformance.errors import ConfigError

#: Environment variable naming the implementation (``MODULE:ATTR``) until an option does.
ENV_TARGET = "ZMQ_CONFORMANCE_CONTROL"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ctl_clause(*ids): control-channel clauses")


@pytest.fixture(scope="session")
def control_spec() -> ControlSpec:
    """The control implementation under test (default: the reference pair)."""
    path = os.environ.get(ENV_TARGET) or DEFAULT_TARGET
    try:
        return load(path, option=ENV_TARGET if os.environ.get(ENV_TARGET) else "default")
    except ConfigError as exc:
        pytest.fail(str(exc), pytrace=False)
