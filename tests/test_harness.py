"""The harness's own logic: ports, the watchdog, wait_until, strategies, resources.

Behavioural parts use real ZeroMQ sockets on 127.0.0.1; fake transports
appear only where the point is the harness's reaction to a misbehaving
implementation (a hang, a bind that keeps failing).
"""

from __future__ import annotations

import errno
import math
import socket
import time
from typing import Any

import msgspec
import pytest
import zmq
from hypothesis import given, settings

from conformance.contracts.p2p.harness import Cluster, expect_error, handshake, wait_until
from conformance.contracts.p2p.spec import make_spec
from conformance.contracts.p2p.strategies import (
    encoded_size,
    hostile_frames,
    hostile_identities,
    is_plausible_peer_id,
    message_of_size,
    messages,
)
from conformance.errors import CallBlocked
from conformance.supervision import watchdog
from conformance.testing import resources
from conformance.testing.net import free_port, is_address_in_use, unreachable_address
from conformance.testing.values import first_difference

# -- fakes for the harness's reactions -------------------------------------


class _FakeConnection:
    def __init__(self, peer_id: str) -> None:
        self.peer_id = peer_id
        self.alive = True

    def send(self, msg: dict[str, Any]) -> None:
        time.sleep(60)  # a send that hangs

    def recv(self) -> list[Any]:
        return ["not a dict"]

    def mark_dead(self) -> None:
        self.alive = False

    def close(self) -> None:
        self.alive = False


class _FakeTransport:
    """Binds a real socket, so port clashes are real; sends hang."""

    def __init__(self, local_id: str, host: str, port: int) -> None:
        self.sock = socket.socket()
        try:
            self.sock.bind((host, port))
        except OSError:
            self.sock.close()
            raise
        self.sock.listen(1)

    def connect(self, peer_id: str) -> _FakeConnection:
        return _FakeConnection(peer_id)

    def poll(self) -> list[Any]:
        return []

    def close(self) -> None:
        self.sock.close()


# -- ports -----------------------------------------------------------------


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_is_address_in_use_follows_the_exception_chain() -> None:
    inner = zmq.ZMQError(zmq.EADDRINUSE)
    try:
        try:
            raise inner
        except zmq.ZMQError as exc:
            raise RuntimeError("bind failed") from exc
    except RuntimeError as outer:
        assert is_address_in_use(outer)
    assert is_address_in_use(OSError(errno.EADDRINUSE, "in use"))
    assert not is_address_in_use(ValueError("bad peer id"))


def test_add_node_retries_on_a_taken_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first candidate port is held by someone else; the cluster moves on."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(1)
        taken = squatter.getsockname()[1]
        candidates = iter([taken, taken, free_port()])
        monkeypatch.setattr(
            "conformance.contracts.p2p.harness.free_port", lambda host="": next(candidates)
        )
        with Cluster(make_spec(_FakeTransport)) as cluster:
            node = cluster.add_node("n")
            assert node.port != taken
            assert node.local_id == f"127.0.0.1:{node.port}"


def test_add_node_keeps_a_given_local_id() -> None:
    with Cluster(make_spec(_FakeTransport)) as cluster:
        node = cluster.add_node("behind-proxy", local_id="127.0.0.1:1")
        assert node.local_id == "127.0.0.1:1" and node.port != 1


def test_fixed_port_that_stays_taken_fails_clearly() -> None:
    with socket.socket() as squatter, Cluster(make_spec(_FakeTransport)) as cluster:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(1)
        with pytest.raises(AssertionError, match="could not bind node"):
            cluster.add_node("n", port=squatter.getsockname()[1])


def test_restart_rebinds_the_same_port_with_a_real_transport() -> None:
    from reference_impl import ZmqTransport

    with Cluster(make_spec(ZmqTransport)) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        out, _ = handshake(a, b)
        port, ident = b.port, b.local_id
        cluster.restart(b)
        assert (b.port, b.local_id, b.generation, b.inbound) == (port, ident, 1, [])
        out.mark_dead()
        handshake(a, b)  # the restarted node is reachable at the same address


# -- watchdog --------------------------------------------------------------


def test_watchdog_interrupts_a_hanging_fake_send() -> None:
    with Cluster(make_spec(_FakeTransport)) as cluster:
        conn = cluster.add_node("n").connect("127.0.0.1:9")
        start = time.monotonic()
        with pytest.raises(CallBlocked) as info:
            conn.send({"x": 1}, limit=0.2)
        assert time.monotonic() - start < 2.0
        assert "send()" in str(info.value) and info.value.seconds == pytest.approx(0.2)


def test_watchdog_interrupts_a_blocking_zmq_send() -> None:
    """A blocking DEALER send to nobody blocks after SNDHWM messages; the guard ends it."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.sndhwm = 10
    try:
        with unreachable_address() as nowhere:
            sock.connect(f"tcp://{nowhere}")
            sent = 0
            with pytest.raises(CallBlocked):
                for _ in range(1000):
                    with watchdog.guard("dealer send", 0.3):
                        sock.send(b"x")
                    sent += 1
            assert 10 <= sent < 1000
    finally:
        sock.close(linger=0)
        ctx.term()


def test_watchdog_nests_and_names_the_expired_call() -> None:
    with pytest.raises(CallBlocked) as info, watchdog.guard("outer", 5.0), \
            watchdog.guard("inner", 0.1):
        time.sleep(3)
    assert info.value.call == "inner"
    with pytest.raises(CallBlocked) as info, watchdog.guard("outer", 0.1), \
            watchdog.guard("inner", 5.0):
        time.sleep(3)
    assert info.value.call == "outer"


def test_a_call_over_only_the_cut_limit_is_reported_as_the_first_block() -> None:
    """After a block, later calls get 0.2 s; one that overruns only that (a slow but
    correct factory, a round trip to a node process on a loaded host) names the test's
    first full-limit block, never itself, as the call that blocked."""
    watchdog.new_test()
    try:
        with pytest.raises(CallBlocked) as first, watchdog.guard("stuck send()", 0.3):
            time.sleep(3)
        assert first.value.call == "stuck send()" and first.value.then is None
        started = time.monotonic()
        with pytest.raises(CallBlocked) as later, watchdog.guard("factory() for b", 5.0):
            time.sleep(3)
        assert time.monotonic() - started < 2.0, "the limit was not cut after a block"
        assert later.value.call == "stuck send()"
        assert later.value.seconds == pytest.approx(0.3)
        assert later.value.then is not None and "factory() for b" in later.value.then
        assert "no verdict of its own" in str(later.value)
    finally:
        watchdog.new_test()
    with watchdog.guard("factory() for b", 5.0):
        time.sleep(0.3)  # whole limits again in the next test


def test_watchdog_restores_a_foreign_timer() -> None:
    import signal

    fired: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with watchdog.guard("short", 1.0):
            pass
        deadline = time.monotonic() + 2
        while not fired and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fired, "the timer armed before the guard was lost"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_guard_rejects_a_bad_limit() -> None:
    with pytest.raises(ValueError, match="positive"), watchdog.guard("x", 0):
        pass
    with pytest.raises(ValueError, match="positive"):
        watchdog.set_default_limit(-1)


# -- wait_until and proxies --------------------------------------------------


def test_wait_until_times_out_with_the_message() -> None:
    start = time.monotonic()
    with pytest.raises(AssertionError, match=r"timed out after 0\.2 s waiting for: the moon"):
        wait_until(lambda: False, timeout=0.2, what="the moon")
    assert time.monotonic() - start < 1.5


def test_wait_until_returns_the_truthy_value() -> None:
    calls = iter([None, 0, "found"])
    assert wait_until(lambda: next(calls), timeout=2, what="x") == "found"


def test_recv_proxy_rejects_non_dict_messages() -> None:
    with Cluster(make_spec(_FakeTransport)) as cluster:
        conn = cluster.add_node("n").connect("127.0.0.1:9")
        with pytest.raises(AssertionError, match="POLL-3"):
            conn.recv()


def test_expect_error_does_not_swallow_call_blocked() -> None:
    def blocked() -> None:
        raise CallBlocked("x", 1.0)

    with pytest.raises(CallBlocked):
        expect_error(blocked, what="x")
    with pytest.raises(AssertionError, match="did not raise"):
        expect_error(lambda: None, what="nothing")
    assert isinstance(expect_error(lambda: 1 / 0, what="div"), ZeroDivisionError)


def test_cluster_close_attempts_every_node_and_reports_blocked() -> None:
    closed: list[str] = []

    class Hangs(_FakeTransport):
        def close(self) -> None:
            super().close()
            time.sleep(60)

    class Records(_FakeTransport):
        def close(self) -> None:
            super().close()
            closed.append("ok")

    cluster = Cluster(make_spec(Hangs), call_limit=0.2)
    cluster.add_node("hangs")
    cluster.spec = make_spec(Records)
    cluster.add_node("records")
    watchdog.set_default_limit(0.2)
    try:
        with pytest.raises(CallBlocked):
            cluster.close()
    finally:
        watchdog.set_default_limit(5.0)
    assert closed == ["ok"]


# -- strategies --------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(messages())
def test_generated_messages_round_trip_through_msgpack(msg: dict[str, Any]) -> None:
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(msg))
    assert first_difference(msg, decoded) is None
    assert encoded_size(msg) < 64 * 1024


@settings(max_examples=300, deadline=None)
@given(hostile_frames(), hostile_identities())
def test_hostile_input_is_sendable(frames: list[bytes], identity: bytes | None) -> None:
    assert all(isinstance(f, bytes) for f in frames) and len(frames) <= 4
    assert identity is None or (0 < len(identity) <= 255 and identity[0] != 0)


def test_first_difference_is_strict() -> None:
    assert first_difference({"a": 1}, {"a": True}) is not None
    assert first_difference({"a": 1}, {"a": 1.0}) is not None
    assert first_difference({"a": 0.0}, {"a": -0.0}) is not None
    assert first_difference({"a": "x"}, {"a": b"x"}) is not None
    assert first_difference({"a": math.nan}, {"a": math.nan}) is None
    assert first_difference({"a": [1, {"b": b"x"}]}, {"a": [1, {"b": b"x"}]}) is None
    diff = first_difference({"a": [1, 2]}, {"a": [1, 3]})
    assert diff is not None and "msg['a'][1]" in diff


@pytest.mark.parametrize("size", [10, 255, 256, 300, 65_535, 65_536, 70_000, 1 << 20])
def test_message_of_size_is_exact(size: int) -> None:
    assert encoded_size(message_of_size(size)) == size


@pytest.mark.parametrize(
    ("identity", "plausible"),
    [(b"127.0.0.1:5555", True), (b"h:1", True), (b"\xff:1", False), (b"localhost", False),
     (b"host:notaport", False), (b"127.0.0.1:99999", False), (b":1", False),
     ("127.0.0.1:\u00b2".encode(), False), (b"127.0.0.1:0", False)],
)
def test_is_plausible_peer_id(identity: bytes, plausible: bool) -> None:
    assert is_plausible_peer_id(identity) is plausible


# -- resources ---------------------------------------------------------------


def test_resources_see_a_socket_open_and_close() -> None:
    if not resources.supported():
        pytest.skip("no descriptor counting here")
    before = resources.snapshot()
    sock = socket.socket()
    during = resources.snapshot()
    assert during.fd_count == before.fd_count + 1
    assert "socket" in during.describe_growth(before)
    sock.close()
    resources.wait_for_release(before, what="a closed socket", timeout=1.0)
    held = socket.socket()
    try:
        with pytest.raises(AssertionError, match="a held socket: resources not released"):
            resources.wait_for_release(before, what="a held socket", timeout=0.05)
    finally:
        held.close()


def test_the_cheap_descriptor_count_agrees_with_a_snapshot() -> None:
    """fd_count() (a listing) counts what snapshot() (a listing and readlinks) counts,
    the listing's own descriptor left out by both."""
    if not resources.supported():
        pytest.skip("no descriptor counting here")
    assert resources.fd_count() == resources.snapshot().fd_count
    first, second = socket.socketpair()
    try:
        assert resources.fd_count() == resources.snapshot().fd_count
        count = resources.fd_count()
    finally:
        first.close()
        second.close()
    assert resources.fd_count() == count - 2
