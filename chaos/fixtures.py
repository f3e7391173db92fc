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
"""

from __future__ import annotations

from collections.abc import Generator, Iterator

import pytest

from chaos.launcher import ToxiproxyUnavailable, requested
from chaos.proxy import Toxiproxy
from conformance.errors import RUN_ERROR_PREFIX, RunError


@pytest.fixture(scope="session")
def toxiproxy() -> Iterator[Toxiproxy]:
    """The worker's toxiproxy handle (see the module docstring)."""
    handle = start_or_stop_the_test()
    try:
        yield handle
    finally:
        handle.stop()


def start_or_stop_the_test() -> Toxiproxy:
    """Start the worker's server, or end the test: a failure when a server was asked
    for by the environment, a run error otherwise (see the module docstring)."""
    try:
        return Toxiproxy.start()
    except ToxiproxyUnavailable as exc:
        if requested():
            pytest.fail(str(exc), pytrace=False)
        raise RunError(f"the fault proxy could not start, so no chaos test ran: {exc}") from exc


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
