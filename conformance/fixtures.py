"""Fixtures the plugin provides to the suite (and to users' own tests)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from conformance.selection import spec_from_config
from conformance.spec import TransportSpec, make_spec


@pytest.fixture
def zmq_transport_factory() -> Callable[..., Any] | None:
    """Override in your ``conftest.py`` to test your transport.

    Return a callable ``factory(local_id, host, port)``; it beats every
    command-line, ini and environment setting. The default ``None`` means
    "use the configured transport".
    """
    return None


@pytest.fixture
def zmq_transport_spec(
    request: pytest.FixtureRequest, zmq_transport_factory: Callable[..., Any] | None
) -> TransportSpec:
    """The transport under test with its declared capabilities."""
    if zmq_transport_factory is not None:
        return make_spec(zmq_transport_factory)
    return spec_from_config(request.config)
