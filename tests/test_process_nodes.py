"""Process nodes (conformance.contracts.p2p.process_nodes): real transports in child processes.

Every test here drives the reference transport in node processes over real
TCP. What is checked is the proxy layer: calls and errors cross intact, a
dead or paused node gives a clear error instead of a hang, the process
faults do what they say, and no node process outlives its test process,
however that process ends.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import zmq

from conformance.contracts.p2p import process_nodes
from conformance.contracts.p2p.harness import Cluster, expect_error, handshake, receive, wait_until
from conformance.contracts.p2p.process_faults import ProcessCluster
from conformance.contracts.p2p.process_nodes import (
    NodePaused,
    NodeProcessDied,
    ProcessTransport,
    is_process_spec,
    nodes_spec,
    process_spec,
)
from conformance.contracts.p2p.spec import TransportSpec, make_spec, spec_from_path
from conformance.errors import CallBlocked, ConfigError
from conformance.supervision import watchdog
from conformance.testing.net import is_address_in_use
from reference_impl import ZmqTransport as ZmqTransportForTests
from reference_impl.p2p.interface import ConnectionDeadError

REPO_ROOT = Path(process_nodes.__file__).resolve().parent.parent


@pytest.fixture
def spec() -> TransportSpec:
    return process_spec(spec_from_path("reference_impl:ZmqTransport"))


@pytest.fixture
def short_watchdog() -> Iterator[None]:
    before = watchdog.default_limit()
    watchdog.set_default_limit(0.5)
    try:
        yield
    finally:
        watchdog.set_default_limit(before)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if not _gone(p)]
        if not alive:
            return []
        time.sleep(0.02)
    return [p for p in pids if not _gone(p)]


def test_nodes_run_in_their_own_processes_and_talk_over_tcp(spec: TransportSpec) -> None:
    with Cluster(spec) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        pids = {a.transport.pid, b.transport.pid}
        assert os.getpid() not in pids and len(pids) == 2
        for pid in pids:
            assert psutil.Process(pid).ppid() == os.getpid()
        out, inbound = handshake(a, b)
        inbound.send({"n": 1, "big": 2**40, "blob": b"\x00\xff"})
        assert receive(out, 1, nodes=[b]) == [{"n": 1, "big": 2**40, "blob": b"\x00\xff"}]
        # One proxy per remote connection: POLL-1's identity checks hold.
        assert b.poll() == [] and b.inbound == [inbound]


def test_errors_cross_as_their_own_class(spec: TransportSpec) -> None:
    with Cluster(spec) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        out, _ = handshake(a, b)
        err = expect_error(lambda: out.send(object()), what="send(object())")  # type: ignore[arg-type]
        assert isinstance(err, TypeError), repr(err)
        out.mark_dead()
        err = expect_error(lambda: out.send({"x": 1}), what="send() on a dead connection")
        assert isinstance(err, ConnectionDeadError), repr(err)
        assert any("raised in the node process" in note for note in err.__notes__)
        # EADDRINUSE comes back as a ZMQError with its errno, so Cluster can retry ports.
        clash = expect_error(lambda: spec.build("127.0.0.1:1", "127.0.0.1", b.port),
                             what="bind a taken port")
        assert isinstance(clash, zmq.ZMQError) and clash.errno == zmq.EADDRINUSE, repr(clash)
        assert is_address_in_use(clash)


def test_killed_node_is_reported_with_its_signal_not_a_hang(spec: TransportSpec) -> None:
    with Cluster(spec) as cluster:
        a = cluster.add_node("a")
        transport = a.transport
        assert isinstance(transport, ProcessTransport)
        os.kill(transport.pid, signal.SIGKILL)  # not through the fault API: a real crash
        started = time.monotonic()
        with pytest.raises(NodeProcessDied, match="SIGKILL") as info:
            a.poll()
        assert time.monotonic() - started < 3.0
        assert a.local_id in str(info.value)
        assert isinstance(info.value, CallBlocked)  # expect_error never takes it as "raised"
        a.closed = True  # nothing left to close


def test_paused_node_gives_a_clear_error_and_recovers(
    spec: TransportSpec, short_watchdog: None
) -> None:
    with Cluster(spec, call_limit=30.0) as cluster:  # starting a process takes longer
        a = cluster.add_node("a")
        transport = a.transport
        assert isinstance(transport, ProcessTransport)
        transport.pause()
        assert transport.state() == "stopped"
        started = time.monotonic()
        with pytest.raises(CallBlocked) as info:
            transport.poll()  # unguarded: the per-call timeout alone must end the wait
        waited = time.monotonic() - started
        assert isinstance(info.value, NodePaused), repr(info.value)
        assert "paused" in str(info.value) and waited < 0.5 + 2.0 + 1.0
        transport.resume()
        # The late answer to the abandoned call is skipped, not taken for the next one.
        assert transport.state() == "running"
        wait_until(lambda: a.poll() == [], what="a answers polls again after SIGCONT")


def test_restart_after_kill_reuses_the_port(spec: TransportSpec) -> None:
    base = spec_from_path("reference_impl:ZmqTransport")
    with ProcessCluster(base) as cluster:
        a, b = cluster.add_node("a"), cluster.add_target("b")
        out, _ = handshake(a, b)
        old_pid, port = b.transport.pid, b.port
        fault = cluster.faults.kill(b)
        assert fault.in_place_at >= fault.started_at and _gone(old_pid)
        wait_until(lambda: not out.alive, nodes=[a], what="a to notice the killed b")
        cluster.faults.restart(b)
        assert b.port == port and b.transport.pid != old_pid and b.generation == 1
        handshake(a, b)


def test_idle_processes_are_reused_and_shutdown_ends_them(spec: TransportSpec) -> None:
    with Cluster(spec) as cluster:
        first = cluster.add_node("a").transport.pid
    with Cluster(spec) as cluster:
        again = cluster.add_node("a").transport.pid
    assert again == first, "a cleanly closed node's process was not reused"
    process_nodes.shutdown()
    assert _wait_gone([first]) == []
    assert process_nodes.live_pids() == []


def test_node_modes_and_unimportable_factories_are_config_errors() -> None:
    base = spec_from_path("reference_impl:ZmqTransport")
    assert nodes_spec(base, None) is base and nodes_spec(base, "inprocess") is base
    assert is_process_spec(nodes_spec(base, "process"))
    with pytest.raises(ConfigError, match="--nodes='threads'"):
        nodes_spec(base, "threads")

    def local_factory(local_id: str, host: str, port: int) -> object:
        raise AssertionError("never built")

    with pytest.raises(ConfigError, match="not importable"):
        process_spec(make_spec(local_factory))


_CHILD = textwrap.dedent("""
    import sys, time
    from conformance.contracts.p2p.harness import Cluster
    from conformance.contracts.p2p.process_nodes import live_pids, process_spec
    from conformance.contracts.p2p.spec import spec_from_path
    cluster = Cluster(process_spec(spec_from_path("reference_impl:ZmqTransport")))
    cluster.add_node("a"); cluster.add_node("b")
    print(" ".join(map(str, live_pids())), flush=True)
    if sys.argv[1] == "exit":
        sys.exit(0)  # no close(): the atexit shutdown must end them
    time.sleep(60)
""")


@pytest.mark.parametrize("ending", ["exit", "SIGKILL", "SIGTERM"])
def test_no_node_process_outlives_its_parent(ending: str) -> None:
    """However the test process ends, its node processes end too (atexit, PR_SET_PDEATHSIG)."""
    child = subprocess.Popen([sys.executable, "-c", _CHILD, ending], stdout=subprocess.PIPE,
                             text=True, cwd=REPO_ROOT)
    try:
        assert child.stdout is not None
        pids = [int(p) for p in child.stdout.readline().split()]
        assert len(pids) == 2, pids
        if ending != "exit":
            child.send_signal(getattr(signal, ending))
        child.wait(timeout=30)
        assert _wait_gone(pids) == [], f"node processes {pids} outlived their parent ({ending})"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_interrupted_pytest_run_with_process_nodes_leaves_nothing(tmp_path: Path) -> None:
    test_file = tmp_path / "test_hang.py"
    test_file.write_text(textwrap.dedent("""
        import time
        from conformance.contracts.p2p.harness import Cluster
        from conformance.contracts.p2p.process_nodes import live_pids

        def test_hang(zmq_transport_spec):
            with Cluster(zmq_transport_spec) as cluster:
                cluster.add_node("a"); cluster.add_node("b")
                print("PIDS", " ".join(map(str, live_pids())), flush=True)
                time.sleep(60)
    """))
    # Python keeps an inherited "ignore SIGINT" (a job started in the background of a
    # non-interactive shell has one): the child's conftest restores Ctrl-C.
    (tmp_path / "conftest.py").write_text(
        "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-s", "-q", "-p", "no:cacheprovider",
         "--zmq-nodes", "process", str(test_file)],
        stdout=subprocess.PIPE, text=True, cwd=tmp_path,
    )
    try:
        assert proc.stdout is not None
        pids: list[int] = []
        for line in proc.stdout:
            if "PIDS" in line:
                pids = [int(p) for p in line.split("PIDS", 1)[1].split()]
                break
        assert len(pids) == 2
        # Read what the interrupted run prints from here on: a full pipe would block
        # its writes (pytest's, the nodes' logs) and keep it from exiting.
        rest: list[str] = []
        reader = threading.Thread(target=lambda: rest.extend(proc.stdout or ()), daemon=True)
        reader.start()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError("the interrupted run did not exit within 30 s; its output "
                                 f"after SIGINT ended: {''.join(rest)[-2000:]}") from None
        assert _wait_gone(pids) == [], f"node processes {pids} outlived the interrupted run"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_suite_runs_under_remote_style_xdist_workers(tmp_path: Path) -> None:
    """``--tx 2*popen//python=...``: each worker its own toxiproxy, ports and node processes.

    The same command with ``--tx ssh=host//python=...`` runs on a pool of
    machines (see docs/chaos.md).
    """
    report = tmp_path / "r.json"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v",
         "--zmq-conformance-only", "--zmq-chaos", "--zmq-nodes", "process",
         "--dist", "load", "--tx", f"2*popen//python={sys.executable}",
         "-k", "test_hb1_ or test_hb4_ or test_proc1_paused or test_connect_returns_live",
         "--zmq-report-json", str(report)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "5 passed" in out, out
    # Both workers ran tests (each with its own toxiproxy server, ports, node processes).
    assert re.search(r"\[gw0\].*PASSED", out) and re.search(r"\[gw1\].*PASSED", out), out
    clauses = json.loads(report.read_text())["clauses"]
    for clause in ("CONN-1", "HB-1", "HB-4", "PROC-1"):
        assert clauses[clause]["verdict"] == "passed", clauses[clause]


class SlowPoll(ZmqTransportForTests):
    """poll() sleeps 60 s: a transport that blocks (importable by the node process)."""

    def poll(self) -> list[Any]:
        time.sleep(60)
        return []


def test_blocking_call_in_the_node_is_a_blocked_verdict_and_the_node_survives(
    short_watchdog: None,
) -> None:
    spec = process_spec(make_spec(SlowPoll, name=f"{__name__}:SlowPoll"))
    with Cluster(spec, call_limit=30.0) as cluster:  # starting a process takes longer
        a = cluster.add_node("a")
        started = time.monotonic()
        with pytest.raises(CallBlocked, match="poll"):
            a.poll()
        assert time.monotonic() - started < 2.0
        assert a.connect(unreachable_peer()).alive  # the node process answers again


def unreachable_peer() -> str:
    return "127.0.0.1:9"


def test_cli_rejects_an_unknown_node_mode(capsys: pytest.CaptureFixture[str]) -> None:
    from conformance import cli

    with pytest.raises(SystemExit) as info:
        cli.main(["run", "--nodes", "threads"])
    assert info.value.code == 2
    assert "--nodes" in capsys.readouterr().err


def test_closing_a_paused_node_ends_its_process_at_once(spec: TransportSpec) -> None:
    with Cluster(spec) as cluster:
        a = cluster.add_node("a")
        transport = a.transport
        assert isinstance(transport, ProcessTransport)
        pid = transport.pause() and transport.pid
        started = time.monotonic()
        a.close()
        assert time.monotonic() - started < 2.0
        assert _wait_gone([pid]) == []
