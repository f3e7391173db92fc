"""Process-node start-up has its own bound, apart from the call watchdog.

Under heavy load an interpreter and its imports can take longer than the 5 s
watchdog of a call into the implementation; that used to give a false
``blocked`` verdict (PROC, SEC-1) for a correct transport. Here the watchdog
is cut to 0.5 s and a factory module's import is slowed down in the node
process only (the test process imports it at once): a start slower than the
watchdog still builds the node, and a start slower than the start-up bound
(``ZMQ_CONFORMANCE_NODE_STARTUP_S``) is a run error naming that bound. A
factory that itself hangs is still the implementation's blocked call.
"""

from __future__ import annotations

import itertools
import os
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance.contracts.p2p.harness import Cluster
from conformance.contracts.p2p.process_nodes import ENV_STARTUP, NodeNeverStarted, process_spec
from conformance.contracts.p2p.spec import TransportSpec, spec_from_path
from conformance.errors import RUN_ERROR_PREFIX, CallBlocked
from conformance.supervision import watchdog

_names = itertools.count()

_SLOW_MODULE = '''
import os
import time

from reference_impl import ZmqTransport

if os.getpid() != {parent}:  # only in a node process: the test process imports it at once
    time.sleep({import_s})


def Factory(local_id, host, port, **kwargs):
    time.sleep({factory_s})
    return ZmqTransport(local_id, host, port, **kwargs)
'''


@pytest.fixture
def short_watchdog() -> Iterator[None]:
    before = watchdog.default_limit()
    watchdog.set_default_limit(0.5)
    try:
        yield
    finally:
        watchdog.set_default_limit(before)


def _slow_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, import_s: float,
               factory_s: float = 0.0) -> TransportSpec:
    """Process nodes whose factory module takes ``import_s`` to import in the node."""
    name = f"slow_factory_{os.getpid()}_{next(_names)}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(_SLOW_MODULE.format(
        parent=os.getpid(), import_s=import_s, factory_s=factory_s)))
    monkeypatch.syspath_prepend(str(tmp_path))
    return process_spec(spec_from_path(f"{name}:Factory"))


def test_suspended_time_does_not_count_against_an_open_guard() -> None:
    with watchdog.guard("the implementation's call", 0.3):
        with watchdog.suspended():
            time.sleep(0.5)  # the suite's own work, longer than the guard's limit
        time.sleep(0.1)  # the call's own time: within its limit
    with pytest.raises(CallBlocked), watchdog.guard("the implementation's call", 0.3):
        with watchdog.suspended():
            time.sleep(0.1)
        time.sleep(1.0)  # the call's own time still has its bound


@pytest.mark.usefixtures("short_watchdog")
def test_a_start_slower_than_the_call_watchdog_builds_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _slow_spec(tmp_path, monkeypatch, import_s=1.5)
    with Cluster(spec) as cluster:
        node = cluster.add_node("slow")
        assert node.transport.state() == "running"


@pytest.mark.usefixtures("short_watchdog")
def test_a_node_that_never_starts_is_a_run_error_naming_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_STARTUP, "1")
    spec = _slow_spec(tmp_path, monkeypatch, import_s=4.0)
    with Cluster(spec) as cluster, pytest.raises(NodeNeverStarted) as caught:
        cluster.add_node("never")
    message = str(caught.value)
    assert message.startswith(f"{RUN_ERROR_PREFIX}: build() of the node process")
    assert f"start-up bound of 1 s ({ENV_STARTUP}" in message
    assert not isinstance(caught.value, Exception)  # no harness can make it a verdict


@pytest.mark.usefixtures("short_watchdog")
def test_a_factory_that_hangs_is_still_the_implementations_blocked_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _slow_spec(tmp_path, monkeypatch, import_s=0.0, factory_s=3.0)
    with Cluster(spec) as cluster, pytest.raises(CallBlocked, match="factory"):
        cluster.add_node("hangs")


def test_a_bad_start_up_bound_is_a_config_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from conformance.contracts.p2p.process_nodes import startup_limit
    from conformance.errors import ConfigError

    monkeypatch.setenv(ENV_STARTUP, "soon")
    with pytest.raises(ConfigError, match=ENV_STARTUP):
        startup_limit()
