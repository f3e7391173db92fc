"""Pytest fixtures for chaos tests: one toxiproxy server per xdist worker.

``toxiproxy`` (session scope, so once per pytest-xdist worker process) is a
``chaos.proxy.Toxiproxy`` handle: a real server from ``TOXIPROXY_URL``,
``TOXIPROXY_SERVER`` or PATH, else the embedded one. It is stopped at the end of the session. After
every test that used it, its proxies get their toxics removed and are
enabled again (``Toxiproxy.reset``), so a fault never leaks into the next
test; proxies themselves stay (module-scoped topologies may own them).

Load with ``from chaos.fixtures import toxiproxy, toxiproxy_reset`` in a
``conftest.py`` (or list ``chaos.fixtures`` in a root ``pytest_plugins``).
When no server can be started, tests using the fixture are skipped with
the reason, unless ``TOXIPROXY_URL`` or ``TOXIPROXY_SERVER`` is set, in
which case they fail: asking for a server that is not there is an error.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from chaos.launcher import ToxiproxyUnavailable, requested
from chaos.proxy import Toxiproxy


@pytest.fixture(scope="session")
def toxiproxy() -> Iterator[Toxiproxy]:
    """The worker's toxiproxy handle (see the module docstring)."""
    try:
        handle = Toxiproxy.start()
    except ToxiproxyUnavailable as exc:
        if requested():
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(f"no toxiproxy server: {exc}")
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture(autouse=True)
def toxiproxy_reset(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that used ``toxiproxy``, reset that handle's proxies."""
    handle: Toxiproxy | None = None
    if "toxiproxy" in request.fixturenames:
        handle = request.getfixturevalue("toxiproxy")
    yield
    if handle is not None:
        handle.reset()
