"""SEC-2: with authentication declared, strangers get nothing in; honest peers are unaffected.

The transport declares ``authentication`` and so takes the CURVE keywords of
:mod:`conformance.testing.credentials`; every test draws fresh keys and builds its
honest nodes with them (one cluster credential: a server pair and a client
pair). Strangers speak the honest wire format under a plausible identity:

- a plain (NULL mechanism) DEALER;
- a CURVE client with a key pair of its own that knows the real server key
  (only client authentication stops it);
- a CURVE client pinning a made-up server key;
- a node built by the factory itself with other keys.

None may surface as a connection or deliver a message. Honest nodes keep
talking, also across a reconnect (a new DEALER must be authenticated too)
and a restart with the same keys; a node restarted with new keys is refused
by the peers that pin the old ones. No secret key appears in the logs, the
``repr`` of any object the transport hands out, or its ``stats()``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import msgspec
import pytest
import zmq

from conformance.contracts.p2p.harness import (
    Cluster,
    Connection,
    Node,
    handshake,
    receive,
    wait_until,
)
from conformance.contracts.p2p.hostile import HostilePeer, WireFormat, learn_wire_format
from conformance.contracts.p2p.spec import HEARTBEAT_STALL_MS, HEARTBEAT_STALL_WHY, TransportSpec
from conformance.supervision import host_stall
from conformance.testing.credentials import KeyPair, SuiteCredentials, curve_client, secrets_in
from conformance.testing.net import unreachable_address

_encode = msgspec.msgpack.encode
#: How long strangers get to push their messages through, with the target polled.
_STRANGER_WINDOW_S = 0.5


def _require_authentication(spec: TransportSpec) -> None:
    if not spec.capabilities.authentication:
        pytest.skip("SEC-2: requires capability authentication; declare it with "
                    "zmq_conformance_capabilities = {'authentication': True} on a factory that "
                    "takes the CURVE keywords curve_server_secret_key, "
                    "curve_allowed_client_keys, curve_client_secret_key and curve_server_key")


def _wire(spec: TransportSpec) -> WireFormat:
    """The honest frame layout, learnt from a plain node (a raw ROUTER speaks no CURVE)."""
    with Cluster(spec) as plain:
        return learn_wire_format(plain)


def _exchange(out: Connection, inbound: Connection, tag: str) -> None:
    out.send({"honest": tag})
    got = receive(inbound, 1, nodes=[out.node],
                  what=f"SEC-2: the authenticated peer's message {tag!r}")
    assert got == [{"honest": tag}], f"SEC-2: the authenticated peer received {got!r}"


@contextmanager
def _strangers(target: Node, wire: WireFormat, creds: SuiteCredentials) -> Iterator[list[str]]:
    """Raw strangers talking to ``target``; yields the identities they claim."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sockets: list[zmq.Socket[bytes]] = []
    claimed: list[str] = []
    try:
        with ExitStack() as stack:
            ids = [stack.enter_context(unreachable_address()) for _ in range(3)]
            claimed.extend(ids)
            plain = HostilePeer(target.local_id, identity=ids[0].encode(), ctx=ctx)
            stack.callback(plain.close)
            knows_server = curve_client(ctx, zmq.DEALER, keys=KeyPair.generate(),
                                        server_key=creds.server.public)
            wrong_server = curve_client(ctx, zmq.DEALER, keys=creds.client,
                                        server_key=KeyPair.generate().public)
            for sock, ident in ((knows_server, ids[1]), (wrong_server, ids[2])):
                sock.setsockopt(zmq.ROUTING_ID, ident.encode())
                sock.connect(f"tcp://{target.local_id}")
                sockets.append(sock)
            frames = wire.frames_for(_encode({"stranger": True}))
            for _ in range(5):
                plain.send(frames)
                for sock in sockets:
                    sock.send_multipart(frames, zmq.NOBLOCK)
            yield claimed
    finally:
        for sock in sockets:
            sock.close(linger=0)
        ctx.term()


def _assert_no_strangers(node: Node, honest: set[str]) -> None:
    strangers = [c.peer_id for c in node.inbound if c.peer_id not in honest]
    assert not strangers, (
        f"SEC-2: peers without the right keys got through to {node.name}: "
        f"connection(s) from {strangers!r}"
    )
    for conn in node.inbound:
        for msg in conn.received:
            assert "stranger" not in msg, f"SEC-2: a stranger's message reached {node.name}"


@pytest.mark.clause("SEC-2")
def test_strangers_get_nothing_in(zmq_transport_spec: TransportSpec) -> None:
    """Plain peers, CURVE peers with unknown keys, and nodes with other keys are refused."""
    _require_authentication(zmq_transport_spec)
    wire = _wire(zmq_transport_spec)
    creds = SuiteCredentials.generate()
    with Cluster(zmq_transport_spec, credentials=creds) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        out, inbound = handshake(a, b)
        other = cluster.add_node_as(SuiteCredentials.generate(), "stranger-node")
        stray = other.connect(b)
        stray.send({"stranger": True})
        with _strangers(b, wire, creds):
            cluster.drive(_STRANGER_WINDOW_S, nodes=[b, other])
            _exchange(out, inbound, "amid-strangers")
        cluster.drive(0.05, nodes=[b])
        _assert_no_strangers(b, {a.local_id})


@pytest.mark.clause("SEC-2")
def test_authenticated_peers_survive_reconnects_and_restarts(
    zmq_transport_spec: TransportSpec,
) -> None:
    """A reconnect opens a new, equally authenticated connection; a restart with the
    same keys is reachable again; the strangers stay out meanwhile."""
    _require_authentication(zmq_transport_spec)
    wire = _wire(zmq_transport_spec)
    creds = SuiteCredentials.generate()
    with host_stall.excused("SEC-2", slack_ms=HEARTBEAT_STALL_MS, why=HEARTBEAT_STALL_WHY), \
            Cluster(zmq_transport_spec, credentials=creds) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        out, inbound = handshake(a, b)
        _exchange(out, inbound, "first")
        out.mark_dead()
        out = a.connect(b)  # CONN-3: a new connection, which must authenticate too
        _exchange(out, inbound, "after-reconnect")
        # b answers over its own connection back to a: authenticated both ways.
        inbound.send({"honest": "reply"})
        replies = receive(out, 1, nodes=[b], what="SEC-2: b's reply over its own connection")
        assert replies == [{"honest": "reply"}], f"SEC-2: a received {replies!r}"
        cluster.restart(b)
        wait_until(lambda: not out.alive, nodes=[a],
                   what="POLL-5: a notices that b's transport closed")
        with _strangers(b, wire, creds):
            out, inbound = handshake(a, b, hello={"hello": "after-restart"})
            cluster.drive(_STRANGER_WINDOW_S, nodes=[a, b])
            _exchange(out, inbound, "after-restart")
        _assert_no_strangers(b, {a.local_id})


@pytest.mark.clause("SEC-2")
def test_node_restarted_with_new_keys_is_refused(zmq_transport_spec: TransportSpec) -> None:
    """A node that comes back on the same address with other keys is a stranger now:
    the peers that pin the old server key send it nothing, and it gets nothing in."""
    _require_authentication(zmq_transport_spec)
    creds = SuiteCredentials.generate()
    with Cluster(zmq_transport_spec, credentials=creds) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        out, _ = handshake(a, b)
        cluster.restart_as(b, SuiteCredentials.generate())
        for n in range(5):
            if out.alive:
                out.send({"honest": n})
            elif n:
                out = a.connect(b)
        known = list(a.inbound)
        impostor_out = b.connect(a)
        impostor_out.send({"stranger": True})
        cluster.drive(_STRANGER_WINDOW_S)
        got = [m for c in b.inbound for m in c.recv()]
        assert not got, f"SEC-2: a node holding new keys received {got!r} from a pinned peer"
        new = [c.peer_id for c in a.inbound if c not in known]
        assert not new, f"SEC-2: a node holding new keys got through to a: {new!r}"


@pytest.mark.clause("SEC-2")
def test_no_secret_key_leaks(zmq_transport_spec: TransportSpec,
                             caplog: pytest.LogCaptureFixture) -> None:
    """No secret key in the logs (every logger, DEBUG), reprs or stats of an authenticated
    run that also refuses strangers."""
    _require_authentication(zmq_transport_spec)
    wire = _wire(zmq_transport_spec)
    creds = SuiteCredentials.generate()
    caplog.set_level(logging.DEBUG)
    texts: list[str] = []
    with Cluster(zmq_transport_spec, credentials=creds) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        out, inbound = handshake(a, b)
        with _strangers(b, wire, creds):
            cluster.drive(_STRANGER_WINDOW_S, nodes=[b])
            _exchange(out, inbound, "leak-check")
        for node in (a, b):
            texts.append(repr(node.transport))
            stats = getattr(node.transport, "stats", None)
            if callable(stats):
                texts.append(repr(stats()))
            texts.extend(repr(c.raw) for c in node.inbound)
        texts.append(repr(out.raw))
    texts.extend(record.getMessage() for record in caplog.records)
    leaked = secrets_in("\n".join(texts), creds.secret_keys())
    assert not leaked, f"SEC-2: {', '.join(leaked)} appeared in a log, repr or stats()"
