"""Fixtures the plugin provides to the suite (and to users' own tests)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from conformance import process_nodes
from conformance.errors import ConfigError
from conformance.selection import configured_capabilities, spec_from_config
from conformance.spec import TransportSpec, make_spec


@pytest.fixture
def zmq_transport_factory() -> Callable[..., Any] | TransportSpec | None:
    """Override in your ``conftest.py`` to test your transport.

    Return a callable ``factory(local_id, host, port)`` (or a ready
    :class:`~conformance.spec.TransportSpec`); it beats every command-line,
    ini and environment setting. Capabilities given with
    ``--zmq-capability``/``zmq_capabilities`` still apply to a callable.
    The default ``None`` means "use the configured transport".

    The suite's tests live outside your test directories, so put the
    override in the ``conftest.py`` at your rootdir (next to ``pytest.ini``
    or ``pyproject.toml``), where it is visible to every test.
    """
    return None


@pytest.fixture
def zmq_transport_spec(
    request: pytest.FixtureRequest,
    zmq_transport_factory: Callable[..., Any] | TransportSpec | None,
) -> TransportSpec:
    """The transport under test with its declared capabilities.

    A configuration error fails the test with a one-line message naming the
    setting (the plugin already validated the configured transport at start
    when the suite was opted in).
    """
    try:
        if zmq_transport_factory is None:
            return spec_from_config(request.config)
        if isinstance(zmq_transport_factory, TransportSpec):
            spec = zmq_transport_factory
        else:
            spec = make_spec(
                zmq_transport_factory,
                overrides=configured_capabilities(request.config),
                origin="--zmq-capability",
            )
        spec = process_nodes.nodes_spec(spec, request.config.getoption("zmq_nodes", None),
                                        option="--zmq-nodes")
    except ConfigError as exc:
        pytest.fail(str(exc), pytrace=False)
    request.node.user_properties.append(("zmq_transport", f"fixture {spec.name}"))
    return spec
