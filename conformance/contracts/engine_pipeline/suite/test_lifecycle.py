"""Lives and deaths: PIPE-5 (death), PIPE-6 (shutdown), PIPE-9 (startup), PIPE-10
(addresses), PIPE-11 (restart), PIPE-12 (utility calls).

Engines run in processes of their own and are killed, paused, terminated
and replaced; bounds are the declared ``death_bound_ms`` and
``shutdown_bound_ms`` plus :data:`SLACK_S`.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from conformance.contracts.engine_pipeline.harness import (
    EXIT_ALLOWANCE_S,
    PROCESS_READY_S,
    SLACK_S,
    Rig,
    Streams,
    exit_in_own_time,
    guarded,
    request_id,
)
from conformance.contracts.engine_pipeline.peers import RawEngine
from conformance.contracts.engine_pipeline.squatter import PortSquatter, reported_but_free
from conformance.errors import CallBlocked
from conformance.testing.net import free_port
from reference_impl.engine_pipeline import profiles, wire


def _dead_within(client: Any, bound_s: float, clause: str, what: str,
                 since: float | None = None) -> float:
    """Read outputs until the client raises; returns how long that took, counted from
    ``since`` (a ``time.monotonic()`` of the death; default: now)."""
    started = time.monotonic() if since is None else since
    while True:
        try:
            guarded("outputs()", lambda: client.outputs(50), 5.0)
        except Exception:
            took = time.monotonic() - started
            assert took <= bound_s + SLACK_S, (
                f"{clause}: {what}: death seen after {took:.2f} s; bound {bound_s:.2f} s")
            return took
        if time.monotonic() - started > bound_s + SLACK_S:
            raise AssertionError(f"{clause}: {what}: the client still reads outputs (no error) "
                                 f"{bound_s + SLACK_S:.2f} s after the engine's death; alive="
                                 f"{client.alive}")


def _pending_call(client: Any) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run() -> None:
        started = time.monotonic()
        try:
            box["value"] = client.call("sleep", 60_000, timeout_ms=30_000)
        except BaseException as exc:
            box["error"] = exc
        box["took"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def _later_calls_raise_at_once(client: Any, clause: str) -> None:
    started = time.monotonic()
    with pytest.raises(Exception) as info:
        guarded("add()", lambda: client.add(request_id("late"), [1], 1), 5.0)
    assert not isinstance(info.value, AssertionError)
    with pytest.raises(Exception):  # noqa: B017 - any error will do
        guarded("call()", lambda: client.call("echo", 1, timeout_ms=5000), 8.0)
    took = time.monotonic() - started
    assert took < 1.0, f"{clause}: calls after the death took {took:.2f} s to raise"
    assert not client.alive, f"{clause}: alive is still True after the engine's death"


@pytest.mark.clause("PIPE-5")
@pytest.mark.parametrize("how", ["sigkill", "fatal step error", "exit 0"])
def test_engine_death_is_seen_and_releases_every_waiter(rig: Rig, how: str) -> None:
    model = {"raise_at_step": 40} if how == "fatal step error" else (
        {"exit_at_step": 40} if how == "exit 0" else {})
    model["stall_ms"] = 10
    client, process = rig.pipeline(clause="PIPE-5", model=model)
    rid = request_id("dying")
    client.add(rid, [1], 100_000)
    streams = Streams()
    while len(streams.tokens(rid)) < 2:
        streams.take(guarded("outputs()", lambda: client.outputs(200), 5.0))
    if how == "sigkill":
        thread, box = _pending_call(client)
        time.sleep(0.1)
        process.kill()
    else:
        thread, box = None, {}
    _dead_within(client, rig.death_bound_s + (0.6 if how != "sigkill" else 0), "PIPE-5", how)
    if thread is not None:
        thread.join(rig.death_bound_s + SLACK_S)
        assert not thread.is_alive(), (
            f"PIPE-5: a pending utility call was not released within {rig.death_bound_s} s of "
            "the engine's death (vLLM PR #56416)")
        assert "error" in box, f"PIPE-5: the pending call returned {box.get('value')!r}"
    _later_calls_raise_at_once(client, "PIPE-5")


@pytest.mark.clause("PIPE-5")
def test_paused_engine_is_dead_with_detects_hang(rig: Rig) -> None:
    if not rig.caps.detects_hang:
        pytest.skip("PIPE-5: detects_hang not declared: a paused engine cannot be told from a "
                    "slow one (as vLLM today)")
    client, process = rig.pipeline(clause="PIPE-5")
    process.pause()
    _dead_within(client, rig.death_bound_s, "PIPE-5", "SIGSTOP")
    process.resume()


@pytest.mark.clause("PIPE-5")
def test_engine_stopped_in_its_output_handshake_is_not_alive_past_the_bound(rig: Rig) -> None:
    """An engine stopped after its output connection's TCP connect but before its ZMTP
    greeting is a paused engine (a SIGSTOP right after READY lands there when the PUSH's
    handshake ends after the DEALER's registration), and no heartbeat runs on a connection
    still in its handshake. The suite's engine says READY and registers its DEALER; its
    output connection is a plain socket that never greets. ``wait_ready()`` fails (an
    engine whose outputs cannot arrive is not ready), or the death is seen within the
    death bound of the engine's READY. The ready deadline, one death bound, is far more
    than the suite engine's handshake takes (milliseconds), so a client that takes the TCP
    connection for the engine's is ready before it."""
    if not rig.caps.detects_hang:
        pytest.skip("PIPE-5: detects_hang not declared: a stopped engine cannot be told from "
                    "a slow one (as vLLM today)")
    ready_ms = rig.caps.death_bound_ms
    client = rig.client(clause="PIPE-5", ready_timeout_ms=ready_ms)
    engine = RawEngine(client.handshake_address, wire=rig.caps.wire)
    rig.closers.append(engine.close)
    ready = rig.ready_in_background(client, clause="PIPE-5", may_fail=True)
    engine.join(silent_output=True)
    stopped_at = time.monotonic()
    if not ready():
        return  # not ready: the engine was never taken for alive
    _dead_within(client, rig.death_bound_s, "PIPE-5",
                 "an engine stopped before its output connection's ZMTP greeting",
                 since=stopped_at)


@pytest.mark.clause("PIPE-5")
def test_slow_engine_is_no_false_death(rig: Rig) -> None:
    client, _ = rig.pipeline(clause="PIPE-5", model={"stall_ms": 150})
    rid = request_id("slow")
    client.add(rid, [1], 12)
    streams = rig.collect(client, [rid], clause="PIPE-5")
    streams.check(rid, "PIPE-5", max_tokens=12)
    assert client.alive, "PIPE-5: a slow but live engine was declared dead"


@pytest.mark.clause("PIPE-5")
def test_death_during_startup_ends_wait_ready(rig: Rig) -> None:
    client = rig.client(clause="PIPE-5", ready_timeout_ms=rig.caps.death_bound_ms)
    process = rig.engine([client.handshake_address], clause="PIPE-5", model={})
    time.sleep(0.05)
    process.kill()
    started = time.monotonic()
    with pytest.raises(Exception) as info:
        guarded("wait_ready()", client.wait_ready, rig.death_bound_s + 5)
    assert not isinstance(info.value, AssertionError)
    took = time.monotonic() - started
    assert took <= rig.death_bound_s + SLACK_S, (
        f"PIPE-5: wait_ready() took {took:.2f} s to fail for an engine killed during startup")


@pytest.mark.clause("PIPE-5")
@pytest.mark.parametrize("how", ["sigkill", "exit0"])
def test_death_between_hello_and_ready_ends_wait_ready(rig: Rig, how: str) -> None:
    """An engine process greeted (HELLO answered, DEALER registered) that dies before READY:
    ``wait_ready()`` fails within the death bound of the death, with an error. The engine
    starts first (its HELLO waits for the client's bind), so the handshake takes
    milliseconds of the ready deadline, four death bounds: waiting it out is no pass."""
    ready_ms = 4 * rig.caps.death_bound_ms
    port = free_port()
    addresses = {"handshake": f"tcp://127.0.0.1:{port}", "input": "tcp://127.0.0.1:0",
                 "output": "tcp://127.0.0.1:0"}
    process = rig.engine_dying_in_startup(addresses["handshake"], how=how)
    assert process.wait_line("CONNECTING", PROCESS_READY_S), (
        f"PIPE-5: the dying engine process never started; {process.describe()}")
    client = rig.client(addresses, clause="PIPE-5", ready_timeout_ms=ready_ms)
    box: dict[str, Any] = {}

    def wait() -> None:
        try:
            client.wait_ready()
            box["value"] = "returned"
        except BaseException as exc:
            box["error"] = exc
        box["at"] = time.monotonic()

    waiter = threading.Thread(target=wait, daemon=True, name="wait_ready")
    waiter.start()
    assert process.wait_line("WELCOMED", ready_ms / 1000), (
        f"PIPE-5: the client never answered the dying engine's HELLO; {process.describe()}")
    if how == "sigkill":
        died_at = process.kill().in_place_at
    else:
        assert process.exit_status(PROCESS_READY_S) == 0, process.describe()
        died_at = time.monotonic()
    waiter.join(ready_ms / 1000 + 5)
    if waiter.is_alive():
        raise CallBlocked("wait_ready()", ready_ms / 1000 + 5)
    assert "error" in box, (f"PIPE-5: wait_ready() {box.get('value')} although the only "
                            f"engine died ({how}) between its HELLO and its READY")
    assert not isinstance(box["error"], AssertionError), box["error"]
    took = box["at"] - died_at
    assert took <= rig.death_bound_s + SLACK_S, (
        f"PIPE-5: wait_ready() failed {took:.2f} s after the engine died ({how}) between HELLO "
        f"and READY; death bound {rig.death_bound_s:.2f} s (ready deadline {ready_ms} ms): "
        f"{type(box['error']).__name__}: {box['error']}")


@pytest.mark.clause("PIPE-6")
def test_engine_sigterm_with_requests_in_flight_exits_zero_in_bound(rig: Rig) -> None:
    client, process = rig.pipeline(clause="PIPE-6", model={"stall_ms": 5})
    for _ in range(10):
        client.add(request_id("term"), [1], 100_000)
    time.sleep(0.1)
    process.terminate()
    # Judged on the engine's own time, as PIPE-9's exit (exit_in_own_time's docstring):
    # an engine that sleeps or blocks on a lock past the bound fails at once.
    status, took, host_delay = exit_in_own_time(process, rig.shutdown_bound_s + SLACK_S)
    assert status is not None, (f"PIPE-6: the engine did not exit within "
                                f"{rig.shutdown_bound_s} s of SIGTERM ({took:.2f} s, "
                                f"{host_delay:.2f} s of it waiting for a CPU); "
                                f"{process.describe()}")
    assert status == 0, f"PIPE-6: SIGTERM ended the engine with status {status} ({took:.2f} s)"


@pytest.mark.clause("PIPE-6")
def test_engine_failure_is_a_non_zero_exit(rig: Rig) -> None:
    client, process = rig.pipeline(clause="PIPE-6", model={"raise_at_step": 3})
    client.add(request_id("fail"), [1], 10)
    status = process.exit_status(rig.death_bound_s + rig.shutdown_bound_s)
    assert status is not None, f"PIPE-6: a failed engine did not exit; {process.describe()}"
    assert status != 0, ("PIPE-6: the engine's step raised and the process exited 0 (a failure "
                         "must be a non-zero exit, vLLM #48966)")


@pytest.mark.clause("PIPE-6")
def test_client_close_is_bounded_and_leaves_nothing(rig: Rig) -> None:
    threads_before = {t.ident for t in threading.enumerate()}
    client, _ = rig.pipeline(clause="PIPE-6", addresses="ipc", model={"stall_ms": 5})
    paths = [a[len("ipc://"):] for a in client.addresses.values()]
    assert all(os.path.exists(p) for p in paths), f"PIPE-10: ipc files missing: {paths}"
    for _ in range(10):
        client.add(request_id("inflight"), [1], 100_000)
    started = time.monotonic()
    guarded("close()", client.close, rig.shutdown_bound_s + 5)
    took = time.monotonic() - started
    assert took <= rig.shutdown_bound_s, f"PIPE-6: close() took {took:.2f} s"
    left = [p for p in paths if os.path.exists(p)]
    assert not left, f"PIPE-6: ipc files left after close(): {left}"
    # A client in a driver process leaves its threads there, not here (docs/drivers.md).
    in_driver: Callable[[], list[str]] = getattr(client, "threads_left", list)
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        extra = [t.name for t in threading.enumerate() if t.ident not in threads_before
                 and not t.name.startswith("guard:") and t.is_alive()] + in_driver()
        if not extra:
            break
        time.sleep(0.02)
    assert not extra, f"PIPE-6: threads left after close(): {extra}"


@pytest.mark.clause("PIPE-6")
def test_a_killed_client_takes_its_engines_with_it(rig: Rig) -> None:
    port = free_port()
    addresses = {"handshake": f"tcp://127.0.0.1:{port}", "input": "tcp://127.0.0.1:0",
                 "output": "tcp://127.0.0.1:0"}
    host = rig.client_process(addresses, engine_indices=[0])
    engine = rig.engine([addresses["handshake"]], clause="PIPE-6")
    assert host.wait_line("READY", PROCESS_READY_S), (
        f"PIPE-6: the client never got ready; {host.describe()}")
    host.kill()
    status = engine.exit_status(rig.shutdown_bound_s + SLACK_S)
    assert status is not None, (
        f"PIPE-6: the engine still runs {rig.shutdown_bound_s} s after its client was killed "
        "(orphaned engines, vLLM #55510)")


@pytest.mark.clause("PIPE-9")
@pytest.mark.parametrize("engine_first", [True, False], ids=["engine-first", "client-first"])
def test_any_start_order_and_first_request_answered(rig: Rig, engine_first: bool) -> None:
    port = free_port()
    addresses = {"handshake": f"tcp://127.0.0.1:{port}", "input": "tcp://127.0.0.1:0",
                 "output": "tcp://127.0.0.1:0"}
    process = None
    if engine_first:
        process = rig.engine([addresses["handshake"]], clause="PIPE-9")
        time.sleep(0.3)
    client = rig.client(addresses, clause="PIPE-9")
    if process is None:
        process = rig.engine([addresses["handshake"]], clause="PIPE-9")
    rig.ready(client, process, clause="PIPE-9")
    rid = request_id("first")
    client.add(rid, [1], 3)
    rig.collect(client, [rid], clause="PIPE-9").check(rid, "PIPE-9", max_tokens=3)


@pytest.mark.clause("PIPE-9")
def test_ready_deadline_is_honoured(rig: Rig) -> None:
    ready_ms = 400
    client = rig.client(clause="PIPE-9", ready_timeout_ms=ready_ms)
    started = time.monotonic()
    with pytest.raises(Exception) as info:
        guarded("wait_ready()", client.wait_ready, ready_ms / 1000 + 5)
    assert not isinstance(info.value, AssertionError)
    took = time.monotonic() - started
    assert ready_ms / 1000 - 0.05 <= took <= ready_ms / 1000 + SLACK_S, (
        f"PIPE-9: wait_ready() with no engine failed after {took:.2f} s; ready timeout "
        f"{ready_ms} ms (#17676)")


@pytest.mark.clause("PIPE-9")
def test_handshake_deadline_is_honoured(rig: Rig) -> None:
    port = free_port()
    process = rig.engine([f"tcp://127.0.0.1:{port}"], clause="PIPE-9",
                         handshake_timeout_ms=500)
    assert process.wait_line("SERVING", PROCESS_READY_S), (
        f"PIPE-9: the engine process never started serving; {process.describe()}")
    bound_s = 0.5 + SLACK_S + EXIT_ALLOWANCE_S
    status, took, host_delay = exit_in_own_time(process, bound_s)
    assert status is not None, (
        f"PIPE-9: an engine with no client still waits for its HELLO answer {took:.2f} s "
        f"after it started serving ({host_delay:.2f} s of it waiting for a CPU), long after "
        "its 500 ms handshake timeout")
    assert status != 0, "PIPE-9: an engine that never shook hands exited 0"


@pytest.mark.clause("PIPE-9")
def test_unknown_and_duplicate_engines_are_refused(rig: Rig) -> None:
    client, _ = rig.pipeline(clause="PIPE-9")
    for index, what in ((7, "unknown"), (0, "duplicate")):
        stranger = RawEngine(client.handshake_address, engine_index=index, wire=rig.caps.wire)
        rig.closers.append(stranger.close)
        answer = stranger.hello(2.0)
        assert answer is not None and answer.get("status") != "WELCOME", (
            f"PIPE-9: a {what} engine (index {index}) was welcomed: {answer}")
    rid = request_id("still")
    client.add(rid, [1], 2)
    rig.collect(client, [rid], clause="PIPE-9").check(rid, "PIPE-9", max_tokens=2)


@pytest.mark.clause("PIPE-10")
@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_concurrent_pipelines_never_collide(rig: Rig, transport: str) -> None:
    """Two pipelines at once; on tcp, every port a client's Python socket frees while the
    clients are built is taken by the suite at once (:mod:`..squatter`: the race of
    probe-then-bind, vLLM #24756, made certain), and every address a client reports must
    be held by then."""
    squatter = PortSquatter()
    with squatter if transport == "tcp" else contextlib.nullcontext():
        try:
            clients = [rig.client(transport, clause="PIPE-10") for _ in range(2)]
        except AssertionError as exc:
            if not squatter.taken:
                raise
            raise AssertionError(
                f"PIPE-10: the client freed port(s) {squatter.taken} while it was being built "
                "and, when the suite took them at once (as another process may), failed: it "
                f"probes a free port and binds it later (vLLM #24756); {exc}") from exc
    reported = [a for client in clients for a in client.addresses.values()]
    free = [a for a in reported if reported_but_free(a)]
    assert not free, (f"PIPE-10: the client reports {free} but does not hold them once built: "
                      "anyone may take them before it binds (probe-then-bind, vLLM #24756)")
    pipes = []
    for client in clients:
        process = rig.engine([client.handshake_address], clause="PIPE-10")
        rig.ready(client, process, clause="PIPE-10")
        pipes.append((client, process))
    addresses = [a for client, _ in pipes for a in client.addresses.values()]
    assert len(set(addresses)) == len(addresses), f"PIPE-10: shared addresses: {addresses}"
    if transport == "ipc":
        for a in addresses:
            assert len(a[len("ipc://"):].encode()) <= 107, f"PIPE-10: ipc path too long: {a}"
    rids = []
    for client, _ in pipes:
        rid = request_id("pipe")
        client.add(rid, [1], 3)
        rids.append(rid)
    for (client, _), rid in zip(pipes, rids, strict=True):
        streams = rig.collect(client, [rid], clause="PIPE-10")
        assert set(streams.outputs) == {rid}, (
            f"PIPE-10: a pipeline received another's outputs: {sorted(streams.outputs)}")


@pytest.mark.clause("PIPE-10")
def test_live_ipc_path_is_never_taken_over_and_stale_one_reused(rig: Rig) -> None:
    base = rig.tmp_path.parent / f"p{os.getpid() % 10000}"
    base.mkdir(exist_ok=True)
    addresses = {role: f"ipc://{base}/{role[:2]}" for role in ("handshake", "input", "output")}
    client, _ = rig.pipeline(clause="PIPE-10", addresses=addresses)
    factory = rig.spec.require("client", "PIPE-10")
    with pytest.raises(Exception) as info:  # any error will do
        second = guarded("client factory", lambda: factory(
            addresses, client_index=0, client_count=1, engine_indices=[0]), 10)
        rig.clients.append(second)
    assert not isinstance(info.value, AssertionError), (
        "PIPE-10: a second client took over the ipc paths of a live pipeline")
    rid = request_id("owner")
    client.add(rid, [1], 2)
    rig.collect(client, [rid], clause="PIPE-10").check(rid, "PIPE-10", max_tokens=2)
    # A pipeline killed with SIGKILL leaves its ipc files; a new one on the same paths starts.
    other = {role: f"ipc://{base}/k{role[:1]}" for role in ("handshake", "input", "output")}
    host = rig.client_process(other, engine_indices=[0])
    rig.engine([other["handshake"]], clause="PIPE-10")
    assert host.wait_line("READY", PROCESS_READY_S), (
        f"PIPE-10: client process not ready; {host.describe()}")
    host.kill()
    for process in rig.processes:
        process.end()
    client2, _ = rig.pipeline(clause="PIPE-10", addresses=other)
    rid = request_id("reborn")
    client2.add(rid, [1], 2)
    rig.collect(client2, [rid], clause="PIPE-10").check(rid, "PIPE-10", max_tokens=2)


def _zombie_output(rig: Rig, client: Any, rid: str) -> None:
    """Push, as engine 0, an output of request ``rid`` to the client's output socket: what a
    dead incarnation's late or queued output looks like. Returns once the connection's
    ZMTP handshake is done and the message is sent, so it reaches the client before
    anything a live engine produces afterwards."""
    push_to = client.addresses["output"] if hasattr(client, "addresses") else None
    if push_to is None:
        return
    import zmq
    from zmq.utils.monitor import recv_monitor_message

    from reference_impl.engine_pipeline.model import token_of

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    monitor = push.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    rig.closers.append(push.close)
    push.connect(push_to)
    shaken = monitor.poll(5000) and recv_monitor_message(monitor)
    push.disable_monitor()
    monitor.close(linger=0)
    assert shaken, f"PIPE-11: the suite could not connect to the client's output {push_to}"
    out = wire.EngineOutputs(0, [wire.EngineOutput(rid, [token_of(rid, 99)])])
    push.send(bytes(profiles.codec(rig.caps.wire).Encoder().encode(out)[0]))


@pytest.mark.clause("PIPE-11")
@pytest.mark.parametrize("policy", ["none", "adopt"])
def test_no_output_of_a_dead_incarnation(rig: Rig, policy: str) -> None:
    options = rig.caps.restart_option(policy, "PIPE-11")
    client, process = rig.pipeline(clause="PIPE-11", model={"stall_ms": 10}, **options)
    rid = request_id("old")
    client.add(rid, [1], 100_000)
    streams = Streams()
    while len(streams.tokens(rid)) < 2:
        streams.take(guarded("outputs()", lambda: client.outputs(200), 5.0))
    process.kill()
    _dead_within(client, rig.death_bound_s, "PIPE-11", "SIGKILL")
    if policy == "adopt":
        _adopts_a_replacement(rig, client, rid)
        return
    # A replacement under the same index: refused (restart none), and what it pushes is
    # never delivered.
    replacement = RawEngine(client.handshake_address, engine_index=0, wire=rig.caps.wire)
    rig.closers.append(replacement.close)
    answer = replacement.hello(1.0)
    assert answer is None or answer.get("status") != "WELCOME", (
        "PIPE-11: a dead client (restart none) welcomed a replacement engine")
    _zombie_output(rig, client, rid)
    time.sleep(0.3)
    try:
        late = guarded("outputs()", lambda: client.outputs(100), 5.0)
    except Exception:
        late = []
    assert not late, (f"PIPE-11: after the engine's death the client delivered "
                      f"{len(late)} output(s) of a dead or foreign incarnation")
    _later_calls_raise_at_once(client, "PIPE-11")


def _adopts_a_replacement(rig: Rig, client: Any, old_rid: str) -> None:
    """restart adopt: dead with typed errors until a replacement engine (same index, a real
    process) is adopted; a first replacement that dies between HELLO and READY is not
    adopted and leaves the way free for the next; once adopted: alive, answering, and
    nothing of the dead incarnation."""
    _later_calls_raise_at_once(client, "PIPE-11")
    doomed = rig.engine_dying_in_startup(client.handshake_address, how="exit0")
    assert doomed.wait_line("CONNECTING", PROCESS_READY_S), doomed.describe()
    assert doomed.wait_line("WELCOMED", PROCESS_READY_S), (
        f"PIPE-11: restart adopt declared, but the dead client did not welcome a replacement "
        f"engine; {doomed.describe()}")
    assert doomed.exit_status(PROCESS_READY_S) == 0, doomed.describe()
    assert not guarded("alive", lambda: client.alive, 5.0), (
        "PIPE-11: a replacement that died before its READY was adopted")
    replacement = rig.engine([client.handshake_address], clause="PIPE-11",
                             model={"stall_ms": 10})
    deadline = time.monotonic() + PROCESS_READY_S
    while not guarded("alive", lambda: client.alive, 5.0):
        assert replacement.running, (
            f"PIPE-11: the replacement engine ended instead of being adopted; "
            f"{replacement.describe()}")
        assert time.monotonic() < deadline, (
            f"PIPE-11: restart adopt declared, but a replacement engine was not adopted "
            f"within {PROCESS_READY_S:.0f} s; {replacement.describe()}")
        time.sleep(0.02)
    _zombie_output(rig, client, old_rid)
    rid = request_id("adopted")
    guarded("add()", lambda: client.add(rid, [1], 10), 5.0)
    streams = rig.collect(client, [rid], clause="PIPE-11")
    streams.take(guarded("outputs()", lambda: client.outputs(100), 5.0))
    foreign = sorted(set(streams.outputs) - {rid})
    assert not foreign, (f"PIPE-11: after adopting a replacement the client delivered outputs "
                         f"of the dead incarnation's request(s) {foreign}")
    streams.check(rid, "PIPE-11", max_tokens=10)
    value = guarded("call()", lambda: client.call("pid", timeout_ms=5000), 8.0)
    assert value == replacement.pid, (
        f"PIPE-11: a utility call after the adoption was answered by pid {value!r}, not by "
        f"the replacement (pid {replacement.pid})")


@pytest.mark.clause("PIPE-12")
def test_utility_calls_matched_failed_and_timed_out(rig: Rig) -> None:
    client, _ = rig.pipeline(clause="PIPE-12")
    assert guarded("call()", lambda: client.call("echo", "a", 1, timeout_ms=3000), 5) == ["a", 1]
    results: dict[int, Any] = {}

    def caller(n: int) -> None:
        results[n] = client.call("echo", n, timeout_ms=5000)

    threads = [threading.Thread(target=caller, args=(n,), daemon=True) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(8)
    assert results == {n: [n] for n in range(8)}, (
        f"PIPE-12: concurrent calls got mismatched results: {results}")
    with pytest.raises(Exception) as info:
        guarded("call()", lambda: client.call("fail", timeout_ms=3000), 5)
    assert "raised on purpose" in str(info.value), (
        f"PIPE-12: the engine's failure message was not propagated: {info.value!r}")
    started = time.monotonic()
    with pytest.raises(Exception):  # noqa: B017 - any error will do
        guarded("call()", lambda: client.call("sleep", 600, timeout_ms=150), 5)
    took = time.monotonic() - started
    assert 0.1 <= took <= 0.15 + SLACK_S, f"PIPE-12: a 150 ms call timeout took {took:.2f} s"
    # The late reply of the timed-out call must not answer the next call.
    value = guarded("call()", lambda: client.call("echo", "next", timeout_ms=3000), 5)
    assert value == ["next"], f"PIPE-12: the next call returned {value!r} (a late reply)"
    rid = request_id("after-late")
    client.add(rid, [1], 2)
    rig.collect(client, [rid], clause="PIPE-12").check(rid, "PIPE-12", max_tokens=2)


@pytest.mark.clause("PIPE-12")
def test_calls_rejected_during_shutdown(rig: Rig) -> None:
    client, _ = rig.pipeline(clause="PIPE-12")
    thread, box = _pending_call(client)
    time.sleep(0.1)
    guarded("close()", client.close, rig.shutdown_bound_s + 5)
    thread.join(rig.shutdown_bound_s + SLACK_S)
    assert not thread.is_alive(), "PIPE-12: a pending call outlived close()"
    assert "error" in box, f"PIPE-12: a pending call returned {box.get('value')!r} on close()"
    with pytest.raises(Exception):  # noqa: B017 - any error will do
        guarded("call()", lambda: client.call("echo", 1, timeout_ms=1000), 5)
