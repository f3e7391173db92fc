"""Fixtures the plugin provides to the suite (and to users' own tests)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

from conformance.config.loading import check_fits
from conformance.config.selection import (
    configured_capabilities,
    configured_contract,
    spec_from_config,
    with_nodes,
)
from conformance.errors import ConfigError


@pytest.fixture
def zmq_transport_factory() -> Callable[..., Any] | Any | None:
    """Override in your ``conftest.py`` to test your transport.

    Return a callable factory of the session's contract (``p2p``:
    ``factory(local_id, host, port)``, see ``docs/contracts.md`` for the
    others) or a ready spec (a :class:`~conformance.contracts.p2p.spec.TransportSpec` for
    ``p2p``); it beats every command-line,
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
    zmq_transport_factory: Callable[..., Any] | Any | None,
) -> Any:
    """The implementation under test of the session's contract, with its capabilities
    (for ``p2p`` a :class:`~conformance.contracts.p2p.spec.TransportSpec`).

    A configuration error fails the test with a one-line message naming the
    setting (the plugin already validated the configured implementation at
    start when the suite was opted in).
    """
    return contract_spec(request, zmq_transport_factory, None)


def contract_spec(
    request: pytest.FixtureRequest,
    override: Callable[..., Any] | Any | None,
    contract: str | None,
    *,
    env: str | None = None,
    load: Callable[..., Any] | None = None,
) -> Any:
    """The spec a suite of ``contract`` (``None``: the session's) tests.

    ``override`` is the user's ``zmq_transport_factory``: it applies when
    ``contract`` is the session's contract. Family fixtures call this. A
    family that lets an environment variable name its implementation passes
    ``env`` and its ``load(path, option=env)``: a set variable beats both.
    """
    target = os.environ.get(env) if env else None
    if target and load is not None:
        try:
            return load(target, option=env)
        except ConfigError as exc:
            pytest.fail(str(exc), pytrace=False)
    try:
        session = configured_contract(request.config)
        if override is None or (contract is not None and contract != session.name):
            return spec_from_config(request.config, contract)
        # A ready spec is data, never callable (no contract's spec type is).
        if callable(override):
            module = getattr(override, "__module__", "?")
            name = f"{module}:{getattr(override, '__qualname__', '?')}"
            check_fits(override, session, path=name, option="zmq_transport_factory")
            spec = session.spec_builder()(
                override,
                overrides=configured_capabilities(request.config),
                origin="--zmq-capability",
            )
        else:
            spec = override
        spec = with_nodes(request.config, session, spec)
    except ConfigError as exc:
        pytest.fail(str(exc), pytrace=False)
    request.node.user_properties.append(("zmq_transport", f"fixture {spec.name}"))
    return spec
