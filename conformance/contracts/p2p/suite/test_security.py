"""Hostile peers: POLL-3, SEC-1 (SEC-2, authentication, is in ``test_authentication``).

A hostile peer is a raw pyzmq socket (or plain TCP client) talking to the
node's bound address. Every test runs an honest peer alongside and checks it
keeps working: hostile input must be dropped, never raise out of ``poll()``,
never surface as a message, and never crash, stall or starve the node.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.config import profiles
from conformance.config.profiles import scaled
from conformance.contracts.p2p.harness import Cluster, Connection, Node, handshake, receive
from conformance.contracts.p2p.hostile import Flooder, HostilePeer, learn_wire_format
from conformance.contracts.p2p.spec import HEARTBEAT_STALL_MS, HEARTBEAT_STALL_WHY, TransportSpec
from conformance.contracts.p2p.strategies import (
    hostile_frames,
    hostile_identities,
    hostile_payloads,
    is_plausible_peer_id,
    nesting_bomb,
)
from conformance.errors import CallBlocked
from conformance.supervision import host_stall
from conformance.testing.hostile_wire import send_raw_tcp
from conformance.testing.net import unreachable_address

_encode = msgspec.msgpack.encode


def _honest_exchange(cluster: Cluster, out: Connection, inbound: Connection, tag: str) -> None:
    """The honest peer's message still arrives, alone and intact."""
    out.send({"honest": tag})
    got = receive(inbound, 1, nodes=[out.node],
                  what=f"the honest peer's message {tag!r} alongside a hostile peer")
    assert got == [{"honest": tag}], f"POLL-3: the honest peer received {got!r}"


def _check_no_impostors(node: Node, honest: set[str], identity: bytes | None) -> None:
    """An identity that is not ``host:port`` must never become a connection."""
    if identity is not None and is_plausible_peer_id(identity):
        return
    strangers = [c.peer_id for c in node.inbound if c.peer_id not in honest]
    assert not strangers, (
        f"POLL-3: poll() reported connection(s) {strangers!r} for a peer whose routing "
        f"identity {identity!r} is not host:port"
    )


def _send_hostile(
    cluster: Cluster, target: Node, identity: bytes | None, batches: list[list[bytes]]
) -> None:
    with HostilePeer(target.local_id, identity=identity) as hostile:
        for frames in batches:
            hostile.send(frames)
        # Let the input land between polls, then poll through it.
        cluster.drive(0.02, nodes=[n for n in cluster.open_nodes() if n is not target])
        cluster.drive(0.03, nodes=[target])


@pytest.mark.clause("POLL-3", "SEC-1")
@pytest.mark.long(1)
@profiles.suite_settings()
@given(
    identity=hostile_identities(),
    batches=st.lists(hostile_frames(), min_size=1, max_size=4),
    honest_format=st.booleans(),
)
def test_poll_survives_arbitrary_hostile_input(
    zmq_transport_spec: TransportSpec,
    identity: bytes | None,
    batches: list[list[bytes]],
    honest_format: bool,
) -> None:
    with Cluster(zmq_transport_spec) as cluster:
        wire = learn_wire_format(cluster)
        a, b = cluster.add_node("a"), cluster.add_node("b")
        out, inbound = handshake(a, b)
        if honest_format:
            batches = [wire.frames_for(frames[0] if frames else b"") for frames in batches]
        _send_hostile(cluster, b, identity, batches)
        _honest_exchange(cluster, out, inbound, "after")
        _check_no_impostors(b, {a.local_id}, identity)


_NAMED_PAYLOADS: dict[str, bytes] = {
    "garbage": bytes(range(256)),
    "empty": b"",
    "truncated": _encode({"k": "v" * 20})[:-3],
    "trailing-bytes": _encode({"k": 1}) + b"\xc1",
    "list": _encode([1, 2, 3]),
    "int": _encode(7),
    "str": _encode("a string"),
    "bytes": _encode(b"\x00\x01"),
    "nil": _encode(None),
    "float": _encode(1.5),
    "int-keys": b"\x81\x01\x02",
    "unhashable-key": b"\x81\x90\x01",
    "deep-arrays": nesting_bomb("arrays"),
    "deep-maps": nesting_bomb("maps"),
    "huge-map-header": b"\xdf\xff\xff\xff\xff",
}

#: Maps whose keys are not strings: they decode to dicts, which the contract
#: does not (yet) say must be dropped, so only "poll() does not raise" is
#: checked for them.
_DICT_WITH_ODD_KEYS = frozenset({"int-keys", "unhashable-key"})

_NAMED_IDENTITIES: dict[str, bytes | None] = {
    "anonymous": None,
    "non-utf8": b"\xff\xfe\xfd",
    "no-colon": b"localhost",
    "not-a-port": b"host:notaport",
    "port-out-of-range": b"127.0.0.1:99999",
    "superscript-port": "127.0.0.1:\u00b2".encode(),
    "empty-host": b":5555",
    "very-long": b"h" * 250 + b":1",
    "embedded-nul": b"a\x00b:1",
}


@pytest.mark.clause("POLL-3")
@pytest.mark.parametrize("identity_name", list(_NAMED_IDENTITIES))
def test_hostile_identity_with_valid_message(
    zmq_transport_spec: TransportSpec, identity_name: str
) -> None:
    """Every kind of bad routing identity, carrying an otherwise valid message."""
    identity = _NAMED_IDENTITIES[identity_name]
    with Cluster(zmq_transport_spec) as cluster:
        wire = learn_wire_format(cluster)
        a, b = cluster.add_node("a"), cluster.add_node("b")
        out, inbound = handshake(a, b)
        _send_hostile(cluster, b, identity, [wire.frames_for(_encode({"evil": 1}))] * 3)
        _honest_exchange(cluster, out, inbound, identity_name)
        _check_no_impostors(b, {a.local_id}, identity)


@pytest.mark.clause("POLL-3")
@pytest.mark.parametrize("payload_name", list(_NAMED_PAYLOADS))
def test_hostile_payload_from_plausible_peer(
    zmq_transport_spec: TransportSpec, payload_name: str
) -> None:
    """Every kind of bad payload, in the honest frame layout, from a plausible identity."""
    with Cluster(zmq_transport_spec) as cluster:
        wire = learn_wire_format(cluster)
        a, b = cluster.add_node("a"), cluster.add_node("b")
        out, inbound = handshake(a, b)
        with unreachable_address() as fake_id:
            payload = _NAMED_PAYLOADS[payload_name]
            _send_hostile(cluster, b, fake_id.encode(), [wire.frames_for(payload)])
            _honest_exchange(cluster, out, inbound, payload_name)
            for conn in b.inbound:
                if conn.peer_id == fake_id:
                    # Harness-checked: recv() hands over dicts only.
                    surfaced = conn.recv()
                    if payload_name not in _DICT_WITH_ODD_KEYS:
                        assert surfaced == [], (
                            f"POLL-3: a {payload_name} payload surfaced as {surfaced!r:.80}"
                        )


@pytest.mark.clause("POLL-3")
@pytest.mark.parametrize("frames", [[], [b"", b""], ["payload", "payload"],
                                    ["payload", b"", b"x"]], ids=["one-empty-frame",
                                                                  "two-empty", "two-payloads",
                                                                  "three"])
def test_wrong_frame_counts(zmq_transport_spec: TransportSpec, frames: list[Any]) -> None:
    with Cluster(zmq_transport_spec) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        out, inbound = handshake(a, b)
        payload = _encode({"evil": "frames"})
        with unreachable_address() as fake_id:
            real = [payload if f == "payload" else f for f in frames]
            _send_hostile(cluster, b, fake_id.encode(), [real])
            _honest_exchange(cluster, out, inbound, "frames")


@contextmanager
def _honest_connection_lives(out: Connection, floods: Sequence[Flooder]) -> Iterator[None]:
    """A failure inside (``send()`` raising, a message not arriving) while the honest
    connection is dead is SEC-1's failure ("starve"), stated as such (an
    :class:`AssertionError` saying when it died), so the host-stall rule judges it like a
    lost message: the contract lets ``send()`` raise any error on a dead connection
    (CONN-6), and every implementation's error reads the same here."""
    started = time.monotonic()
    try:
        yield
    except CallBlocked:
        raise
    except Exception as exc:
        if out.alive:
            raise
        when = (f"{time.monotonic() - started:.1f} s into the flood (the flooders had sent "
                f"{', '.join(str(flood.sent) for flood in floods)} messages)" if floods
                else "after the flood")
        raise AssertionError(
            f"SEC-1: {out.node.name}'s honest connection to {out.peer_id} was dead {when}; "
            f"then: {type(exc).__name__}: {exc}") from exc


@pytest.mark.clause("SEC-1")
@pytest.mark.long(1)
def test_flood_of_messages_does_not_stall_or_starve(zmq_transport_spec: TransportSpec) -> None:
    """Two flooding peers (processes) send garbage and valid-looking messages while an
    honest peer talks.

    Every ``poll()`` runs under the watchdog (no stall) and the honest peer's
    messages all arrive, in order, within the usual deadline (no starvation).

    The honest connection is heartbeated, so CONN-2's host-stall rule applies: two
    flooding threads, the flooded node's libzmq I/O thread and its ``poll()`` share the
    host's cores, and once the host stalls processes for ``HEARTBEAT_STALL_MS`` in one
    piece a correct transport may declare the starved honest connection dead. Only then
    is the run void (docs/load-verdicts.md); an honest connection that dies, or a message
    that does not arrive, on a host that ran promptly is still SEC-1's failure.
    """
    with host_stall.excused("SEC-1", slack_ms=HEARTBEAT_STALL_MS, why=HEARTBEAT_STALL_WHY), \
            Cluster(zmq_transport_spec) as cluster:
        wire = learn_wire_format(cluster)
        a, b = cluster.add_node("a"), cluster.add_node("b")
        out, inbound = handshake(a, b)
        honest = scaled(50)
        with unreachable_address() as fake_id, \
                Flooder(b.local_id, [os.urandom(32)], max_messages=scaled(50_000)) as garbage, \
                Flooder(b.local_id, wire.frames_for(_encode({"flood": "x" * 100})),
                        identity=fake_id.encode(), max_messages=scaled(50_000)) as plausible, \
                _honest_connection_lives(out, [garbage, plausible]):
            got: list[dict[str, Any]] = []
            for n in range(honest):
                out.send({"honest": n})
                if n % 10 == 9:
                    got.extend(receive(inbound, n + 1 - len(got), nodes=[a], timeout=10.0,
                                       what="SEC-1: the honest peer's messages during a flood"))
            assert got == [{"honest": n} for n in range(honest)], (
                "SEC-1: the honest peer's messages were lost or reordered during a flood"
            )
        with _honest_connection_lives(out, []):
            _honest_exchange(cluster, out, inbound, "after-flood")


#: Messages a peer floods into a node that is not polling: more than any common receive
#: high-water mark (libzmq's default is 1,000), few enough to sit in the TCP buffers, so
#: the peer's close follows the last byte at once.
_QUEUE_FILLER = 20_000
#: The node's heartbeat timeout in that test: far longer than the flood takes.
_LONG_TIMEOUT_MS = 10_000


@pytest.mark.clause("SEC-1")
@pytest.mark.long(1.5)
def test_peer_that_fills_the_queue_then_vanishes_cannot_crash_the_node(
    zmq_transport_spec: TransportSpec,
) -> None:
    """A peer floods a node that is busy elsewhere (not polling), then closes; the node
    lives on through the heartbeats that follow and still serves its honest peer.

    libzmq 4.3 aborts the process here when the node's receive queue for that
    peer is bounded and ZMTP heartbeats are on: the close marks the engine that
    stopped reading (queue full) as failed, and the next heartbeat interval
    writes to it (``Assertion failed: !_io_error``). The node is left unpolled
    for a second plus three heartbeat intervals so that the timer fires; a
    crash is reported as ``crashed``. A configurable node gets a long heartbeat
    timeout here, so that a slow flood on a loaded machine cannot let the
    timeout close the stopped connection cleanly first.
    """
    ivl_s = (zmq_transport_spec.heartbeat_ivl_ms or 100) / 1000
    with Cluster(zmq_transport_spec) as cluster:
        a = cluster.add_node("a")
        b = cluster.add_node("b", heartbeat_timeout_ms=_LONG_TIMEOUT_MS)
        out, inbound = handshake(a, b)
        hostile = HostilePeer(b.local_id, sndhwm=0)
        try:
            sent = hostile.flood([os.urandom(16)], _QUEUE_FILLER)
            assert sent == _QUEUE_FILLER, f"the flooding peer queued only {sent} messages"
        finally:
            # Flush the flood, then close: the connection ends right after its last byte.
            hostile.close(linger_ms=2000)
        cluster.drive(1.0 + 3 * ivl_s, nodes=[a])  # b is left alone: its queue stays full
        _honest_exchange(cluster, out, inbound, "after-a-vanished-flooder")


@pytest.mark.clause("SEC-1")
def test_flood_of_connections_and_raw_tcp(zmq_transport_spec: TransportSpec) -> None:
    """Many anonymous DEALERs and non-ZMTP TCP clients connect at once."""
    with Cluster(zmq_transport_spec) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        out, inbound = handshake(a, b)
        peers = [HostilePeer(b.local_id) for _ in range(scaled(40))]
        try:
            for peer in peers:
                peer.send([os.urandom(16)])
            for n in range(scaled(20)):
                send_raw_tcp(b.local_id, os.urandom(64) if n % 2 else b"\xff" + bytes(9) + b"\x7f")
            cluster.drive(0.05, nodes=[b])
            _honest_exchange(cluster, out, inbound, "amid-connection-flood")
        finally:
            for peer in peers:
                peer.close()
        _check_no_impostors(b, {a.local_id}, None)
        _honest_exchange(cluster, out, inbound, "after-connection-flood")


@pytest.mark.clause("POLL-3")
@pytest.mark.long(1)
@profiles.suite_settings()
@given(payload=hostile_payloads())
def test_hostile_payloads_never_surface(zmq_transport_spec: TransportSpec, payload: bytes) -> None:
    """Generated bad payloads in the honest layout from a plausible identity."""
    with Cluster(zmq_transport_spec) as cluster:
        wire = learn_wire_format(cluster)
        a, b = cluster.add_node("a"), cluster.add_node("b")
        out, inbound = handshake(a, b)
        with unreachable_address() as fake_id:
            _send_hostile(cluster, b, fake_id.encode(), [wire.frames_for(payload)])
            _honest_exchange(cluster, out, inbound, "payload")
            # recv() is harness-checked to hand over dicts only.
            for conn in b.inbound:
                if conn.peer_id == fake_id:
                    conn.recv()

