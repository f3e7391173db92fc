"""Pytest fixtures for chaos tests: one toxiproxy server per xdist worker.

``toxiproxy`` (session scope, so once per pytest-xdist worker process) is a
``chaos.proxy.Toxiproxy`` handle: a real server from ``TOXIPROXY_URL``,
``TOXIPROXY_SERVER`` or PATH, else the embedded one. It is stopped at the end of the session. After
every test that used it, its proxies get their toxics removed and are
enabled again (``Toxiproxy.reset``), so a fault never leaks into the next
test; proxies themselves stay (module-scoped topologies may own them).

Load with ``from chaos.fixtures import toxiproxy, toxiproxy_reset`` in a
``conftest.py`` (or list ``chaos.fixtures`` in a root ``pytest_plugins``).
When no server can be started, tests using the fixture fail if
``TOXIPROXY_URL`` or ``TOXIPROXY_SERVER`` is set (asking for a server that
is not there is a configuration error), and otherwise end in a run error
(:class:`conformance.errors.RunError`, exit status 3): the embedded server
ships with the suite, so when it does not start (on an overloaded host its
interpreter can miss the start-up limit) the chaos clauses were not run,
and a gate must never pass them by skipping.

A fault proxy that stops mid-run is a run error, never a verdict: every API
call to it raises :class:`chaos.proxy.FaultProxyStopped` (a pytest skip that
no harness can catch as a failure), and when this module is a plugin (the
conformance plugin registers it with ``--zmq-chaos``) a test that used the
handle and *failed* in any other way (its traffic through the dead proxy
broke first) is checked too: if the proxy no longer answers, the failure
becomes the same run error ("the fault proxy at ... stopped: exit status
..., last log lines ..."), with the original failure's first line added.

As a plugin it also starts the worker's server early: when collection meets
the first test that uses ``toxiproxy``, the embedded server's process is
spawned (:class:`chaos.launcher.Launch`), so its interpreter starts beside
the rest of the collection instead of inside the first chaos test; the
fixture then only waits for it. The start limit still counts the server's
own time from its spawn, and a server that cannot start is still the same
run error, raised where the fixture is first used. When no selected test
uses the fixture after all (``-k``, deselection) the process is stopped at
the end of collection; one no test claimed is stopped at the session's end,
and, like every server the launcher starts, it never outlives the worker.
Runs that collect no chaos test never start one; ``--collect-only`` neither.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator

import pytest

from chaos.launcher import Launch, ToxiproxyUnavailable, requested
from chaos.proxy import Toxiproxy
from conformance.errors import RUN_ERROR_PREFIX, RunError

_FIXTURE = "toxiproxy"
#: The server spawned during collection, until the fixture claims it.
_early: Launch | None = None


@pytest.fixture(scope="session")
def toxiproxy() -> Iterator[Toxiproxy]:
    """The worker's toxiproxy handle (see the module docstring)."""
    handle = start_or_stop_the_test()
    try:
        yield handle
    finally:
        handle.stop()


def start_or_stop_the_test() -> Toxiproxy:
    """Start the worker's server (or wait for the one spawned during collection), or end
    the test: a failure when a server was asked for by the environment, a run error
    otherwise (see the module docstring)."""
    global _early
    early, _early = _early, None
    try:
        if early is not None:
            lease = early.ready()
            return Toxiproxy(lease.host, lease.port, lease=lease)
        return Toxiproxy.start()
    except ToxiproxyUnavailable as exc:
        if requested():
            pytest.fail(str(exc), pytrace=False)
        raise RunError(f"the fault proxy could not start, so no chaos test ran: {exc}") from exc


def pytest_itemcollected(item: pytest.Item) -> None:
    """Spawn the worker's server at the first collected test that will need it."""
    global _early
    if (_early is None and _FIXTURE in getattr(item, "fixturenames", ())
            and not item.config.option.collectonly):
        _early = Launch()


def pytest_collection_finish(session: pytest.Session) -> None:
    """No selected test uses the server after all: stop the one spawned early."""
    if _early is not None and not any(
            _FIXTURE in getattr(item, "fixturenames", ()) for item in session.items):
        _cancel_early()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A server spawned early that no test claimed ends with the session."""
    _cancel_early()


def _cancel_early() -> None:
    global _early
    early, _early = _early, None
    if early is not None:
        early.cancel()


@pytest.fixture(autouse=True)
def toxiproxy_reset(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that used ``toxiproxy``, reset that handle's proxies."""
    handle: Toxiproxy | None = None
    if "toxiproxy" in request.fixturenames:
        handle = request.getfixturevalue("toxiproxy")
    yield
    if handle is not None:
        handle.reset()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failure of a test whose toxiproxy no longer answers becomes a run error."""
    report = yield
    handle = getattr(item, "funcargs", {}).get("toxiproxy")
    if report.failed and isinstance(handle, Toxiproxy):
        problem = handle.problem()
        if problem is not None:
            _as_run_error(report, problem, call)
    return report


def _as_run_error(report: pytest.TestReport, problem: str, call: pytest.CallInfo[None]) -> None:
    """Turn a failed phase report into the skip of a run error (see the module docstring)."""
    failure = ""
    if call.excinfo is not None:
        lines = str(call.excinfo.value).strip().splitlines()
        failure = f" (the test had failed with {call.excinfo.typename}: {lines[0][:200]})" \
            if lines else f" (the test had failed with {call.excinfo.typename})"
    path, lineno, _ = report.location
    report.outcome = "skipped"
    report.longrepr = (str(path), (lineno or 0) + 1,
                       f"Skipped: {RUN_ERROR_PREFIX}: {problem}{failure}.")
