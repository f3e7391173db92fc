"""Reference-transport specifics that the duck-typed suite cannot see.

The conformance suite (run against the reference in ``test_suite_on_reference``)
proves the clauses; these tests pin what the reference documents beyond them:
its exception types, its drop counters, its option validation and its
behaviour on a failed bind.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import msgspec
import pytest
import zmq

from reference_impl import (
    ConnectionDeadError,
    DuplicateConnectionError,
    MessageTooLargeError,
    SendQueueFullError,
    TransportError,
    ZmqConnection,
    ZmqTransport,
)
from reference_impl._monitor import monitor_event
from reference_impl.p2p.transport import parse_peer_id, parse_routing_id

FAST = {"heartbeat_ivl_ms": 100, "heartbeat_timeout_ms": 500, "heartbeat_ttl_ms": 500}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _node(**options: int) -> ZmqTransport:
    for _ in range(20):
        port = _free_port()
        try:
            return ZmqTransport(f"127.0.0.1:{port}", "127.0.0.1", port, **{**FAST, **options})
        except zmq.ZMQError as exc:  # another process took the port in between
            if exc.errno != zmq.EADDRINUSE:
                raise
    raise RuntimeError("no free port found")


def _poll_until(
    condition: Callable[[], bool], nodes: Sequence[ZmqTransport], timeout: float = 5.0
) -> list[ZmqConnection]:
    """Poll ``nodes`` until ``condition()``; return every new inbound connection."""
    accepted: list[ZmqConnection] = []
    deadline = time.monotonic() + timeout
    while True:
        for node in nodes:
            accepted.extend(node.poll())
        if condition():
            return accepted
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(0.001)


@pytest.fixture
def pair() -> Iterator[tuple[ZmqTransport, ZmqTransport]]:
    a, b = _node(), _node()
    yield a, b
    a.close()
    b.close()


def _accept(b: ZmqTransport, a: ZmqTransport) -> ZmqConnection:
    """Poll ``b`` (and ``a``) until ``b`` reports an inbound connection."""
    accepted = _poll_until(lambda: bool(b.stats().get("accepted")), [a, b])
    return next(conn for conn in accepted if conn.peer_id == a.local_id)


def _receive(conn: ZmqConnection, nodes: Sequence[ZmqTransport]) -> list[dict[str, object]]:
    """Poll ``nodes`` until ``conn`` has received something; return it all."""
    got: list[dict[str, object]] = []

    def arrived() -> bool:
        got.extend(conn.recv())
        return bool(got)

    _poll_until(arrived, nodes)
    return got


def test_round_trip_both_ways(pair: tuple[ZmqTransport, ZmqTransport]) -> None:
    a, b = pair
    out = a.connect(b.local_id)
    out.send({"hello": [1, 2.5, b"\x00", None, True]})
    inbound = _accept(b, a)
    assert inbound.peer_id == a.local_id
    assert inbound.recv() == [{"hello": [1, 2.5, b"\x00", None, True]}]
    inbound.send({"reply": 1})
    assert _receive(out, [a, b]) == [{"reply": 1}]
    assert b.stats()["accepted"] == 1


def test_duplicate_connect_raises_and_keeps_the_original(
    pair: tuple[ZmqTransport, ZmqTransport],
) -> None:
    a, b = pair
    first = a.connect(b.local_id)
    with pytest.raises(DuplicateConnectionError):
        a.connect(b.local_id)
    assert first.alive
    first.send({"still": "works"})
    assert _accept(b, a).recv() == [{"still": "works"}]


def test_send_errors_are_typed(pair: tuple[ZmqTransport, ZmqTransport]) -> None:
    a, b = pair
    conn = a.connect(b.local_id)
    with pytest.raises(TypeError, match="must be a dict"):
        conn.send(["not", "a", "dict"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="keys must be strings"):
        conn.send({1: "int key"})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="not MessagePack-encodable"):
        conn.send({"x": object()})
    conn.mark_dead()
    with pytest.raises(ConnectionDeadError, match="dead"):
        conn.send({})
    conn.close()
    with pytest.raises(ConnectionDeadError, match="closed"):
        conn.send({})


def test_size_limit_refused_by_send() -> None:
    a, b = _node(max_message_bytes=1024), _node(max_message_bytes=1024)
    try:
        conn = a.connect(b.local_id)
        with pytest.raises(MessageTooLargeError, match="max_message_bytes"):
            conn.send({"blob": b"x" * 2000})
        conn.send({"blob": b"x" * 900})
        assert _accept(b, a).recv() == [{"blob": b"x" * 900}]
    finally:
        a.close()
        b.close()


def test_full_send_queue_raises_at_once() -> None:
    a = _node(send_hwm=50)
    try:
        conn = a.connect(f"127.0.0.1:{_free_port()}")  # nobody listens there
        started = time.monotonic()
        with pytest.raises(SendQueueFullError, match="full"):
            for i in range(10_000):
                conn.send({"i": i})
        assert time.monotonic() - started < 5.0, "send() took seconds: it must not block"
        assert conn.alive
    finally:
        a.close()


def test_hostile_frames_are_counted_and_dropped(pair: tuple[ZmqTransport, ZmqTransport]) -> None:
    a, b = pair
    ctx = zmq.Context()
    try:
        keep: list[zmq.Socket[bytes]] = []  # a collected socket drops its queue

        def raw(identity: bytes | None) -> zmq.Socket[bytes]:
            sock: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            if identity is not None:
                sock.setsockopt(zmq.ROUTING_ID, identity)
            sock.connect(f"tcp://{b.local_id}")
            keep.append(sock)
            return sock

        good = msgspec.msgpack.encode({"ok": 1})
        raw(None).send(good)  # anonymous: 5-byte id starting with 0x00
        raw(b"no-colon").send(good)
        raw(b"127.0.0.1:9").send_multipart([b"a", b"b"])  # three frames at the ROUTER
        raw(b"127.0.0.1:10").send(b"\xc1\xc1garbage")
        raw(b"127.0.0.1:11").send(msgspec.msgpack.encode([1, 2, 3]))
        raw(b"127.0.0.1:13").send(b"\x81\x01\x02")  # {1: 2}: keys must be strings
        expected = {
            "dropped_identity": 2,
            "dropped_frames": 1,
            "dropped_undecodable": 1,
            "dropped_not_dict": 2,
        }

        def all_counted() -> bool:
            stats = b.stats()
            return all(stats.get(k, 0) >= v for k, v in expected.items())

        _poll_until(all_counted, [b])
        honest = a.connect(b.local_id)
        honest.send({"fine": True})
        assert _accept(b, a).recv() == [{"fine": True}]
        assert b.stats().get("accepted") == 1
    finally:
        ctx.destroy(linger=0)


def test_failed_bind_releases_everything() -> None:
    a = _node()
    before = len(os.listdir("/proc/self/fd"))
    try:
        with pytest.raises(zmq.ZMQError):
            ZmqTransport(a.local_id, "127.0.0.1", a.port)
        assert len(os.listdir("/proc/self/fd")) == before
    finally:
        a.close()


def test_closed_transport_refuses_work() -> None:
    a = _node()
    a.close()
    a.close()  # idempotent
    assert a.closed
    with pytest.raises(TransportError, match="closed"):
        a.poll()
    with pytest.raises(TransportError, match="closed"):
        a.connect("127.0.0.1:1")


@pytest.mark.parametrize(
    ("option", "value"),
    [("heartbeat_ivl_ms", 0), ("max_message_bytes", -1), ("send_hwm", True),
     ("heartbeat_ttl_ms", 7_000_000)],
)
def test_bad_options_name_the_option(option: str, value: int) -> None:
    with pytest.raises(ValueError, match=option):
        ZmqTransport("127.0.0.1:1", "127.0.0.1", 0, **{option: value})


def test_local_id_too_long_for_a_tagged_identity_names_the_option() -> None:
    ZmqTransport("h" * 215 + ":5555", "127.0.0.1", 0).close()  # 220 bytes: fits
    with pytest.raises(ValueError, match="local_id"):
        ZmqTransport("h" * 220 + ":5555", "127.0.0.1", 0)


@pytest.mark.parametrize("bad", ["", "nohost", "host:", ":80", "h:0", "h:70000", "h:x1"])
def test_parse_peer_id_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_peer_id(bad)


def test_parse_peer_id_accepts_ipv6_literal() -> None:
    assert parse_peer_id("[::1]:5555") == ("[::1]", 5555)


def test_connect_validates_peer(pair: tuple[ZmqTransport, ZmqTransport]) -> None:
    a, _ = pair
    with pytest.raises(ValueError, match="host:port"):
        a.connect("nonsense")
    with pytest.raises(ValueError, match="self"):
        a.connect(a.local_id)


def test_oversize_frame_from_a_raw_peer_is_dropped() -> None:
    """ZMQ_MAXMSGSIZE cuts the sender off before the payload is buffered."""
    a, b = _node(max_message_bytes=1024), _node(max_message_bytes=1024)
    ctx = zmq.Context()
    try:
        hostile: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
        hostile.setsockopt(zmq.LINGER, 0)
        hostile.setsockopt(zmq.ROUTING_ID, b"127.0.0.1:12")
        events = hostile.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        hostile.connect(f"tcp://{b.local_id}")
        hostile.send(msgspec.msgpack.encode({"blob": b"x" * 4096}))
        # The ROUTER hanging up on the hostile peer proves the frame arrived.
        _poll_until(lambda: events.poll(0) != 0, [b])
        honest = a.connect(b.local_id)
        honest.send({"after": 1})
        inbound = _accept(b, a)
        assert inbound.peer_id == a.local_id
        assert inbound.recv() == [{"after": 1}]
        # One more honest round trip after the hostile frame had time to land.
        honest.send({"after": 2})
        assert _receive(inbound, [a, b]) == [{"after": 2}]
        assert b.stats().get("accepted") == 1, "the oversize sender must not be accepted"
    finally:
        ctx.destroy(linger=0)
        a.close()
        b.close()


@pytest.mark.parametrize(
    ("identity", "expected"),
    [
        (b"127.0.0.1:5555", ("127.0.0.1:5555", "", 0)),
        (b"[::1]:80", ("[::1]:80", "", 0)),
        (b"127.0.0.1:5555#0123456789ab.7", ("127.0.0.1:5555", "0123456789ab", 7)),
        (b"h#x:9", ("h#x:9", "", 0)),  # a plain host:port whose host holds '#'
    ],
)
def test_parse_routing_id_accepts_plain_and_tagged(
    identity: bytes, expected: tuple[str, str, int]
) -> None:
    assert parse_routing_id(identity) == expected


@pytest.mark.parametrize(
    "bad",
    [b"\x00abcd", b"\xff:1", b"nohost", b"127.0.0.1:5555#", b"127.0.0.1:5555#0123456789ab",
     b"127.0.0.1:5555#0123456789ab.", b"127.0.0.1:5555#0123456789ab.0",
     b"127.0.0.1:5555#0123456789ab.01", b"127.0.0.1:5555#0123456789AB.1",
     b"127.0.0.1:5555#012345.1", b"127.0.0.1:99999#0123456789ab.1",
     b"#0123456789ab.1", b"127.0.0.1:5555#0123456789ab.\xc2\xb2"],
)
def test_parse_routing_id_rejects(bad: bytes) -> None:
    with pytest.raises(ValueError):
        parse_routing_id(bad)


def test_each_dealer_presents_its_own_tagged_identity() -> None:
    """Two DEALERs of one node towards one peer never share a routing identity."""
    node = _node()
    ctx = zmq.Context()
    try:
        router: zmq.Socket[bytes] = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        seen: list[bytes] = []
        for i in range(2):
            conn = node.connect(f"127.0.0.1:{port}")
            conn.send({"i": i})
            _poll_until(lambda: router.poll(0) != 0, [node])
            seen.append(router.recv_multipart()[0])
            conn.close()
        assert len(set(seen)) == 2, seen
        for identity in seen:
            assert parse_routing_id(identity)[0] == node.local_id
    finally:
        ctx.destroy(linger=0)
        node.close()


class _DelayFirstRelay:
    """A TCP relay to ``upstream`` that holds back the first connection's handshake end.

    The first accepted client's ZMTP greeting (64 bytes) passes at once, so
    that client completes its side of the handshake and sends READY (and
    any message); everything after the greeting reaches the upstream
    ``delay`` seconds late. Replies and every later connection pass at once.
    This orders two handshakes at the upstream ROUTER the way a loaded
    machine occasionally does: the older connection's completes last.
    """

    GREETING_BYTES = 64

    def __init__(self, upstream: int, delay: float) -> None:
        self.delay = delay
        self._upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._sockets: list[socket.socket] = [self._listener]
        self._threads: list[threading.Thread] = []
        #: Everything the first client sent so far (read, maybe not yet forwarded).
        self.first_client_bytes = bytearray()
        self._spawn(self._accept)

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        first = True
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self._upstream))
            self._sockets += [client, server]
            self._spawn(self._pump, client, server, self.delay if first else 0.0)
            self._spawn(self._pump, server, client, 0.0)
            first = False

    def _pump(self, src: socket.socket, dst: socket.socket, delay: float) -> None:
        """Copy ``src`` to ``dst``; past the greeting, ``delay`` seconds after reading.

        Reading never waits on the delay: what the client sent before it
        closed (or reset) the connection is already read, so it still arrives.
        """
        chunks: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()
        if delay:
            self._spawn(self._read, src, chunks, None, self.first_client_bytes)
        else:
            self._read(src, chunks, dst)
            return
        passed = 0
        try:
            while True:
                read_at, chunk = chunks.get()
                if not chunk:
                    break
                head = chunk[: max(0, self.GREETING_BYTES - passed)]
                passed += len(chunk)
                dst.sendall(head)
                if len(head) == len(chunk):
                    continue
                time.sleep(max(0.0, read_at + delay - time.monotonic()))
                dst.sendall(chunk[len(head) :])
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    @staticmethod
    def _read(
        src: socket.socket,
        chunks: queue.SimpleQueue[tuple[float, bytes]],
        dst: socket.socket | None = None,
        record: bytearray | None = None,
    ) -> None:
        """Read ``src`` to its end; forward to ``dst`` at once, or queue with a timestamp."""
        try:
            while chunk := src.recv(65536):
                if dst is not None:
                    dst.sendall(chunk)
                else:
                    chunks.put((time.monotonic(), chunk))
                if record is not None:
                    record += chunk
            if dst is not None:
                dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        finally:
            chunks.put((time.monotonic(), b""))

    def close(self) -> None:
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self._threads:
            thread.join(5)


def test_replaced_dealer_finishing_its_handshake_last_takes_nothing_over() -> None:
    """CONN-7's rare race, made deterministic with a relay.

    ``a``'s first DEALER is retired right after its handshake bytes left, and
    a replacement connects at once; the relay delivers the retired DEALER's
    handshake (and message) to ``b`` after the replacement's. With one
    routing identity per node, ROUTER_HANDOVER gave the identity to the dead
    connection and every message of the replacement was lost. Each DEALER
    now has its own identity: the replacement's messages arrive, and the
    retired DEALER's late message is dropped rather than delivered after them
    (the relay makes it arrive after the replacement's first message).
    """
    a, b = _node(), _node()
    relay = _DelayFirstRelay(b.port, delay=0.3)
    accepted: list[ZmqConnection] = []
    got: list[dict[str, object]] = []

    def poll_for(seconds: float) -> None:
        until = time.monotonic() + seconds
        _poll_until(lambda: time.monotonic() > until, [a])
        accepted.extend(b.poll())

    try:
        via_relay = f"127.0.0.1:{relay.port}"
        first = a.connect(via_relay)
        first.send({"from": "first"})
        # Its READY and its message (sent once a's side of the handshake is
        # done) are now held by the relay.
        _poll_until(lambda: b"first" in relay.first_client_bytes, [a])
        first.mark_dead()
        second = a.connect(via_relay)  # retires ``first``
        second.send({"from": "second", "n": 0})
        poll_for(relay.delay + 0.2)  # ``first``'s handshake has reached b by now
        second.send({"from": "second", "n": 1})

        def arrived() -> bool:
            accepted.extend(b.poll())
            for conn in accepted:
                got.extend(conn.recv())
            return {"from": "second", "n": 1} in got

        _poll_until(arrived, [a])
        assert [m for m in got if m.get("from") == "second"] == [
            {"from": "second", "n": 0}, {"from": "second", "n": 1}
        ], got
        assert {"from": "first"} not in got, "a retired DEALER's late message was delivered"
        assert b.stats().get("dropped_stale") == 1
        assert [conn.peer_id for conn in accepted] == [a.local_id]
    finally:
        a.close()
        b.close()
        relay.close()


def test_monitor_events_read_as_pyzmq_reads_them() -> None:
    """The transports' own monitor reader agrees with ``zmq.utils.monitor`` on real
    events (connect, handshake, disconnect) and refuses what is not one."""
    from zmq.utils.monitor import parse_monitor_message

    ctx = zmq.Context()
    seen: list[int] = []

    def watch(monitor: zmq.Socket[bytes], until: int) -> None:
        deadline = time.monotonic() + 5.0
        while until not in seen and time.monotonic() < deadline:
            if monitor.poll(100):
                frames = monitor.recv_multipart()
                assert monitor_event(frames) == parse_monitor_message(frames)["event"]
                seen.append(monitor_event(frames))
        assert until in seen, seen

    try:
        router = ctx.socket(zmq.ROUTER)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        dealer = ctx.socket(zmq.DEALER)
        monitor = dealer.get_monitor_socket()
        dealer.connect(f"tcp://127.0.0.1:{port}")
        watch(monitor, zmq.EVENT_HANDSHAKE_SUCCEEDED)  # connected, then the ZMTP handshake
        router.close(linger=0)
        watch(monitor, zmq.EVENT_DISCONNECTED)
        assert zmq.EVENT_CONNECTED in seen, seen
        with pytest.raises(ValueError, match="not a monitor event"):
            monitor_event([b"\x00" * 5, b"tcp://x"])
    finally:
        ctx.destroy(linger=0)
