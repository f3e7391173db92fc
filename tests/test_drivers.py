"""The driver bridge (docs/drivers.md): every failure of a driver ends in its verdict.

Each failure mode has a tiny, deliberately broken driver
(``tests/drivers/broken.py MODE``, written from the protocol document
alone), and each test also checks that no process is left behind. Other
tests run the Python driver with the reference and with mutants, to show
that the bridge carries what the suite judges: content and errors, crashes
and the descriptors a driver leaks.
"""

from __future__ import annotations

import os
import shlex
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from plugin_project import load_json, make_project, run_cli, verdicts

from conformance import contracts
from conformance.drivers import (
    DriverCrashed,
    DriverStartError,
    driver_spec,
    end_test,
    live_pids,
    shutdown,
)
from conformance.drivers import process as driver_processes
from conformance.errors import CallBlocked
from conformance.supervision import watchdog
from conformance.testing import resources
from conformance.testing.net import free_port
from reference_impl.p2p.interface import DuplicateConnectionError

BROKEN = Path(__file__).parent / "drivers" / "broken.py"
PYTHON_DRIVER = f"{shlex.quote(sys.executable)} -m conformance.drivers.python"


def broken(mode: str) -> str:
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(BROKEN))} {mode}"


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:  # a zombie not yet reaped counts as gone
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"


def _group_members(pgid: int) -> list[int]:
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(name))
    return members


def _running(marker: str) -> list[int]:
    """Pids of live processes whose command line contains ``marker``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if marker in cmdline and not _gone(int(name)):
            found.append(int(name))
    return found


@pytest.fixture(autouse=True)
def _no_driver_left() -> Iterator[None]:
    yield
    pids = [p.pid for p in driver_processes.processes()]
    shutdown()
    for pid in pids:
        assert _gone(pid), f"driver process {pid} outlived the test"


def _transport(command: str) -> tuple[object, int]:
    spec = driver_spec(contracts.get("p2p"), command)
    port = free_port()
    node = spec.build(f"127.0.0.1:{port}", "127.0.0.1", port)
    return node, node.pid


# -- failure modes ---------------------------------------------------------------------


def test_a_call_that_never_answers_is_blocked_and_its_process_ended() -> None:
    node, pid = _transport(broken("hang"))
    with pytest.raises(CallBlocked) as info, watchdog.guard("connect()", 0.3):
        node.connect("127.0.0.1:1")  # type: ignore[attr-defined]
    assert not isinstance(info.value, DriverCrashed)
    end_test()  # the test's object was never closed: its process is ended
    assert _gone(pid)


def test_a_hang_off_the_main_thread_is_blocked_by_the_fallback_deadline() -> None:
    node, _ = _transport(broken("hang"))
    caught: list[BaseException] = []
    previous = watchdog.default_limit()
    watchdog.set_default_limit(0.2)
    try:
        def call() -> None:
            try:
                node.connect("127.0.0.1:1")  # type: ignore[attr-defined]
            except BaseException as exc:
                caught.append(exc)

        started = time.monotonic()
        worker = threading.Thread(target=call)
        worker.start()
        worker.join(10)
    finally:
        watchdog.set_default_limit(previous)
    assert caught and isinstance(caught[0], CallBlocked), caught
    assert time.monotonic() - started < 5.0


def test_a_driver_that_dies_is_crashed_with_its_signal_and_stderr() -> None:
    node, pid = _transport(broken("die"))
    with pytest.raises(DriverCrashed) as info:
        node.connect("127.0.0.1:1")  # type: ignore[attr-defined]
    message = str(info.value)
    assert "connect()" in message and f"pid {pid}" in message
    assert "killed by SIGSEGV" in message
    assert "about to crash in connect()" in message  # the tail of its stderr
    with pytest.raises(DriverCrashed):  # and it stays crashed
        node.poll()  # type: ignore[attr-defined]
    assert _gone(pid)


def test_junk_on_stdout_during_a_test_is_crashed_naming_the_bytes() -> None:
    node, _ = _transport(broken("junk-later"))
    with pytest.raises(DriverCrashed, match=r"broke the protocol.*connecting"):
        node.connect("127.0.0.1:1")  # type: ignore[attr-defined]


@pytest.mark.parametrize(("mode", "expected"), [
    ("junk", r"not a protocol frame.*Starting the driver"),
    ("version", r"speaks protocol version 2; this suite speaks version 1"),
    ("exit", r"exited with status 3 before answering the hello; its stderr ends: "
             r"broken driver: cannot load libimpl.so"),
])
def test_a_bad_start_is_one_line_naming_the_problem(mode: str, expected: str) -> None:
    with pytest.raises(DriverStartError, match=expected) as info:
        driver_spec(contracts.get("p2p"), broken(mode), option="--driver")
    assert "\n" not in str(info.value)
    assert str(info.value).startswith("--driver: driver ")
    assert live_pids() == []


def test_a_command_that_does_not_exist_is_one_line() -> None:
    with pytest.raises(DriverStartError, match="cannot start 'no-such-driver-here'"):
        driver_spec(contracts.get("p2p"), "no-such-driver-here --flag")


def test_what_a_driver_forks_ends_with_it() -> None:
    _node, pid = _transport(broken("fork-hang"))
    deadline = time.monotonic() + 5
    while len(_group_members(pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(_group_members(pid)) == 2, "the driver's grandchild did not start"
    end_test()
    deadline = time.monotonic() + 5
    while _group_members(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _group_members(pid) == []


def test_cli_wrong_version_exits_2_with_one_line_and_runs_nothing(tmp_path: Path) -> None:
    project = make_project(tmp_path / "proj")
    result = run_cli(project, "run", "--driver", broken("version"), "--json", "r.json")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "speaks protocol version 2" in lines[0], result.stderr
    assert not (project / "r.json").exists()
    assert _running(f"{BROKEN} version") == []


# -- the Python driver -------------------------------------------------------------------


def test_python_driver_carries_content_and_errors() -> None:
    spec = driver_spec(contracts.get("p2p"), f"{PYTHON_DRIVER} reference_impl:ZmqTransport")
    assert spec.heartbeat_configurable  # the reference takes the heartbeat keywords
    ports = free_port(), free_port()
    a, b = (spec.build(f"127.0.0.1:{p}", "127.0.0.1", p) for p in ports)
    try:
        out = a.connect(f"127.0.0.1:{ports[1]}")
        message = {"bin": b"\x00\xff", "big": 2**64 - 1, "neg": -(2**63), "f": 0.1,
                   "nested": {"l": [None, True, "s"]}}
        out.send(message)
        with pytest.raises(DuplicateConnectionError):
            a.connect(f"127.0.0.1:{ports[1]}")
        deadline = time.monotonic() + 5
        inbound: list[Any] = []
        while not inbound and time.monotonic() < deadline:
            inbound = b.poll()
        assert inbound and inbound[0].recv() == [message]
    finally:
        a.close()
        b.close()


def test_driver_descriptors_are_counted_where_they_live() -> None:
    """A driver process's descriptors count in snapshots; the suite's pipes do not."""
    before = resources.snapshot()
    spec = driver_spec(contracts.get("p2p"), f"{PYTHON_DRIVER} reference_impl:ZmqTransport")
    assert resources.snapshot().fd_count == before.fd_count  # an idle driver adds nothing
    port = free_port()
    node = spec.build(f"127.0.0.1:{port}", "127.0.0.1", port)
    grown = resources.snapshot()
    assert any(isinstance(fd, str) and fd.startswith(f"{node.pid}:") for fd in grown.fds)
    # The count from listings alone (fd_count, the wait loops) agrees with the snapshot's
    # readlinks, also while the driver opens more (settled: libzmq opens them in its thread).
    assert resources.fd_count() == grown.fd_count > before.fd_count
    peer_port = free_port()
    peer = spec.build(f"127.0.0.1:{peer_port}", "127.0.0.1", peer_port)
    node.connect(peer.local_id).send({"hello": 1})
    settled = resources.wait_until_stable(quiet=0.1, timeout=3.0)
    assert resources.fd_count() == settled.fd_count > grown.fd_count
    peer.close()
    node.close()
    resources.wait_for_release(before, what="a closed driver transport", timeout=5.0)


def _run(project: Path, command: str, *args: str) -> dict[str, str]:
    result = run_cli(project, "run", "--driver", command, "--json", "r.json", "-n", "0",
                     "--reruns", "0", *args)
    assert result.returncode in (0, 1), result.stderr
    return verdicts(load_json(project / "r.json"))


def test_crashed_and_leaks_reach_the_verdicts_through_the_python_driver(tmp_path: Path) -> None:
    project = make_project(tmp_path / "proj")
    mutants = "conformance.contracts.p2p.transports"
    crashed = _run(project, f"{PYTHON_DRIVER} {mutants}:AbortsInSend",
                   "-k", "test_duplicate_connect_raises_and_keeps_existing")
    assert crashed["CONN-2"] == "crashed"
    assert _running(f"{mutants}:AbortsInSend") == []  # nothing outlived the run
    report = load_json(project / "r.json")["clauses"]["CONN-2"]
    assert "SIGABRT" in str(report), report
    leaky = _run(project, f"{PYTHON_DRIVER} {mutants}:CloseLeaksMonitor",
                 "-k", "test_close_is_idempotent_and_releases_descriptors")
    assert leaky["CONN-5"] == "failed"
    clean = _run(project, f"{PYTHON_DRIVER} reference_impl:ZmqTransport",
                 "-k", "test_close_is_idempotent_and_releases_descriptors")
    assert clean["CONN-5"] == "passed"


def test_a_paused_driver_is_reported_paused_not_crashed() -> None:
    spec = driver_spec(contracts.get("p2p"), f"{PYTHON_DRIVER} reference_impl:ZmqTransport")
    port = free_port()
    node = spec.build(f"127.0.0.1:{port}", "127.0.0.1", port)
    node.pause()
    try:
        with pytest.raises(CallBlocked) as info, watchdog.guard("poll()", 0.3):
            node.poll()
        assert not isinstance(info.value, DriverCrashed)
    finally:
        node.resume()
    assert node.poll() == []  # the late reply of the blocked poll() is skipped
    node.kill()
    assert node.state() == "dead"
    node.close()  # a killed driver is reaped, not asked


@pytest.mark.parametrize("one_by_one", [False, True], ids=["send_many", "one-send-each"])
def test_a_run_of_sends_arrives_in_order_and_stops_at_the_first_error(one_by_one: bool) -> None:
    """``send_many`` (docs/drivers.md, section 5): the messages arrive once, in order;
    without ``keep_going`` the first send that fails raises its own error and the later
    ones are not sent, with it every failure is returned. A driver that lacks the call
    (here: the proxy told so) gets the same result one ``send`` at a time."""
    from conformance.contracts.p2p.harness import Cluster, handshake, receive
    from reference_impl.p2p.interface import ConnectionDeadError

    spec = driver_spec(contracts.get("p2p"), f"{PYTHON_DRIVER} reference_impl:ZmqTransport")
    with Cluster(spec) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        out, inbound = handshake(a, b)
        out.raw._one_by_one = one_by_one
        requests = out.raw._process.calls
        assert out.send_many([{"n": n} for n in range(300)]) == []
        assert out.raw._process.calls - requests == (300 if one_by_one else 1)
        assert [m["n"] for m in receive(inbound, 300, nodes=[a])] == list(range(300))
        out.raw.mark_dead()
        with pytest.raises(ConnectionDeadError):
            out.send_many([{"n": n} for n in range(3)])
        errors = out.send_many([{"n": n} for n in range(3)], keep_going=True)
        assert [type(e) for e in errors] == [ConnectionDeadError] * 3
        assert out.raw._one_by_one is one_by_one


def test_the_lock_is_handed_over_only_where_another_thread_could_want_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``let_waiting_threads_run`` (docs/drivers.md, section 11) sleeps a zero sleep, which
    lets a thread waiting for the interpreter lock take it, only while another Python
    thread runs: with the main thread alone nobody can wait, and the sleep costs a p2p
    round trip through the driver two thirds of its time (Linux's timer slack)."""
    from conformance.drivers import serving

    sleeps: list[float] = []
    monkeypatch.setattr(serving.time, "sleep", sleeps.append)
    monkeypatch.setattr(serving.threading, "active_count", lambda: 1)
    serving.let_waiting_threads_run()
    assert sleeps == []
    monkeypatch.setattr(serving.threading, "active_count", lambda: 2)
    serving.let_waiting_threads_run()
    assert sleeps == [0]
