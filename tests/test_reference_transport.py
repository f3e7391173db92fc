"""Reference-transport specifics that the duck-typed suite cannot see.

The conformance suite (run against the reference in ``test_suite_on_reference``)
proves the clauses; these tests pin what the reference documents beyond them:
its exception types, its drop counters, its option validation and its
behaviour on a failed bind.
"""

from __future__ import annotations

import os
import socket
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
from reference_impl.transport import parse_peer_id

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
