"""Connection lifecycle: CONN-1 .. CONN-7.

Each test builds its own nodes on fresh ports (per Hypothesis example for
property tests) and drives them only through the interface. The races of
DESIGN.md's bug classes are provoked on purpose: reconnecting inside the
dead-but-registered window, letting traffic land at a node that is not being
polled, and flapping a peer hundreds of times without a pause.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.config import profiles
from conformance.config.profiles import scaled
from conformance.contracts.p2p.harness import (
    Cluster,
    Connection,
    Node,
    expect_error,
    handshake,
    receive,
    wait_inbound,
    wait_until,
)
from conformance.contracts.p2p.hostile import RawRouter
from conformance.contracts.p2p.spec import HEARTBEAT_STALL_MS, HEARTBEAT_STALL_WHY, TransportSpec
from conformance.contracts.p2p.strategies import messages
from conformance.supervision import host_stall
from conformance.testing import resources
from conformance.testing.values import first_difference


def _wait_for_message(
    node: Node, peer: Node, wanted: dict[str, Any], *, known: list[Connection], what: str
) -> list[dict[str, Any]]:
    """Poll both until ``wanted`` shows up on any of ``node``'s connections for ``peer``.

    ``known`` are connections of ``node`` for ``peer`` obtained otherwise
    (e.g. the registered inbound one); returns everything drained.
    """
    seen: list[dict[str, Any]] = []

    def arrived() -> bool:
        for conn in known:
            seen.extend(conn.recv())
        for conn in node.inbound:
            if conn.peer_id == peer.local_id and all(conn.raw is not k.raw for k in known):
                seen.extend(conn.recv())
        return wanted in seen

    wait_until(arrived, nodes=[node, peer], what=what)
    return seen


@pytest.mark.clause("CONN-1")
@profiles.suite_settings()
@given(batch=st.lists(messages(max_leaves=6), min_size=1, max_size=5), land_first=st.booleans())
def test_connect_returns_live_connection_and_delivers_before_remote_polls(
    zmq_transport_spec: TransportSpec, batch: list[dict[str, Any]], land_first: bool
) -> None:
    with Cluster(zmq_transport_spec) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        conn = a.connect(b)
        assert conn.alive, "CONN-1: a fresh connection must be alive"
        assert conn.peer_id == b.local_id, (
            f"CONN-1: peer_id is {conn.peer_id!r}, connect() was given {b.local_id!r}"
        )
        for msg in batch:
            conn.send(msg)
        if land_first:
            # Let the bytes reach b while b has never polled.
            cluster.drive(0.02, nodes=[a])
        inbound = wait_inbound(b, a.local_id, nodes=[a])
        got = receive(inbound, len(batch), nodes=[a])
        assert len(got) == len(batch), f"CONN-1: sent {len(batch)}, received {len(got)}"
        for i, (sent, received) in enumerate(zip(batch, got, strict=True)):
            diff = first_difference(sent, received, f"message[{i}]")
            assert diff is None, f"CONN-1: {diff}"


@pytest.mark.clause("CONN-2")
def test_duplicate_connect_raises_and_keeps_existing(zmq_transport_spec: TransportSpec) -> None:
    with host_stall.excused("CONN-2", slack_ms=HEARTBEAT_STALL_MS, why=HEARTBEAT_STALL_WHY), \
            Cluster(zmq_transport_spec) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        first, inbound = handshake(a, b)
        expect_error(lambda: a.connect(b), what="CONN-2: connect() to a live registered peer")
        # The duplicate attempt must not have disturbed anything, even after
        # a poll has run.
        expect_error(lambda: a.connect(b.local_id), what="CONN-2: a second duplicate connect()")
        assert first.alive, "CONN-2: the existing connection died after a duplicate connect()"
        for n in range(3):
            first.send({"after-duplicate": n})
        got = receive(inbound, 3, nodes=[a])
        assert got == [{"after-duplicate": n} for n in range(3)], (
            f"CONN-2: the existing connection stopped delivering: {got!r}"
        )


@pytest.mark.clause("CONN-3", "CONN-6")
def test_reconnect_in_dead_but_registered_window(zmq_transport_spec: TransportSpec) -> None:
    """mark_dead() then connect() at once, no poll in between, repeatedly."""
    with Cluster(zmq_transport_spec) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        old, inbound = handshake(a, b)
        for cycle in range(scaled(5)):
            old.mark_dead()
            new = a.connect(b)  # no poll since mark_dead(): the entry is still registered
            assert new.raw is not old.raw, "CONN-3: connect() returned the dead connection"
            assert new.alive, "CONN-3: the connection returned by a reconnect is not alive"
            assert new.peer_id == b.local_id
            assert not old.alive, "CONN-3: the retired connection came back to life"
            wanted = {"cycle": cycle, "on": "new"}
            new.send(wanted)  # right after the reconnect
            expect_error(lambda conn=old: conn.send({"on": "retired"}),  # type: ignore[misc]
                         what="CONN-6: send() on the retired connection")
            seen = _wait_for_message(
                b, a, wanted, known=[inbound],
                what=f"CONN-3: cycle {cycle}: the message sent right after the reconnect "
                f"to reach {b.name}",
            )
            assert {"on": "retired"} not in seen
            assert seen.count(wanted) == 1, f"CONN-3: delivered {seen.count(wanted)} times"
            old = new


@pytest.mark.clause("CONN-4")
def test_mark_dead_flips_alive_and_keeps_buffered_messages(
    zmq_transport_spec: TransportSpec,
) -> None:
    with Cluster(zmq_transport_spec) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        out = a.connect(b)
        sent = [{"n": n} for n in range(5)]
        for msg in sent:
            out.send(msg)
        cluster.drive(0.02, nodes=[a])  # let them land at b before its first poll
        inbound = wait_inbound(b, a.local_id, nodes=[a])
        # POLL-1: the first message is readable now; nothing was read yet.
        inbound.mark_dead()
        assert not inbound.alive, "CONN-4: alive is still True right after mark_dead()"
        buffered = inbound.recv()
        assert buffered, "CONN-4: mark_dead() discarded the messages already buffered"
        assert buffered == sent[: len(buffered)], (
            f"CONN-4: after mark_dead(), recv() returned {buffered!r}, not a prefix of {sent!r}"
        )
        out.mark_dead()
        assert not out.alive, "CONN-4: alive is still True right after mark_dead()"
        out.mark_dead()  # twice is harmless
        assert not out.alive


@pytest.mark.clause("CONN-5")
@pytest.mark.parametrize("how", ["close", "mark_dead-then-close"])
def test_close_is_idempotent_and_releases_descriptors(
    zmq_transport_spec: TransportSpec, how: str
) -> None:
    if not resources.supported():
        pytest.skip("CONN-5: cannot count file descriptors on this platform")
    with Cluster(zmq_transport_spec) as cluster, RawRouter() as sink:
        a = cluster.add_node("a")

        def cycle(tag: int) -> Connection:
            conn = a.connect(sink.address)
            conn.send({"tag": tag})
            frames = wait_until(lambda: sink.recv(), nodes=[a],
                                what=f"the connection to reach a raw ROUTER at {sink.address}")
            assert frames
            if how == "mark_dead-then-close":
                conn.mark_dead()
            conn.close()
            conn.close()  # idempotent
            return conn

        cycle(0)  # warm-up: libzmq keeps a few descriptors after the first connection
        baseline = resources.wait_until_stable(drive=a.poll)
        conns = [cycle(n) for n in range(1, 4)]
        for conn in conns:
            conn.close()  # closing again much later is still harmless
            assert not conn.alive, "CONN-5: a closed connection reports alive"
        resources.wait_for_release(
            baseline, drive=a.poll,
            what=f"CONN-5: 3 connections opened and released by {how}",
        )


@pytest.mark.clause("CONN-5")
def test_close_inbound_connection_is_idempotent(zmq_transport_spec: TransportSpec) -> None:
    with Cluster(zmq_transport_spec) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        _, inbound = handshake(a, b)
        inbound.mark_dead()
        inbound.close()
        inbound.close()
        assert not inbound.alive
        b.poll()  # the transport copes with a connection the caller closed
        b.poll()


@pytest.mark.clause("CONN-6")
@pytest.mark.parametrize("how", ["mark_dead", "close"])
@pytest.mark.parametrize("side", ["outbound", "inbound"])
def test_send_on_dead_or_closed_raises_and_transport_keeps_working(
    zmq_transport_spec: TransportSpec, how: str, side: str
) -> None:
    with Cluster(zmq_transport_spec) as cluster:
        a, b, c = cluster.add_node("a"), cluster.add_node("b"), cluster.add_node("c")
        out, inbound = handshake(a, b)
        victim = out if side == "outbound" else inbound
        getattr(victim, how)()
        expect_error(lambda: victim.send({"x": 1}),
                     what=f"CONN-6: send() on a connection after {how}() ({side})")
        expect_error(lambda: victim.send({"x": 2}), what="CONN-6: a second send()")
        # The transports keep working: to a third node, and to the same peer again.
        handshake(a, c)
        if side == "outbound":
            again = a.connect(b)
            again.send({"again": 1})
            seen = _wait_for_message(b, a, {"again": 1}, known=[inbound],
                                     what="CONN-6: a message on a new connection after the "
                                     "failed send()")
            assert {"x": 1} not in seen and {"x": 2} not in seen
        else:
            out.send({"again": 1})
            # b retired its inbound side; the peer's next message opens a new one.
            new_inbound = wait_inbound(b, a.local_id, nodes=[a], exclude=[inbound])
            got = receive(new_inbound, 1, nodes=[a])
            assert got == [{"again": 1}], f"CONN-6: got {got!r}"


@pytest.mark.clause("CONN-7", "CONN-3")
@pytest.mark.parametrize("die", ["mark_dead+sweep", "mark_dead", "close"])
def test_flapping_peer_stays_reachable(zmq_transport_spec: TransportSpec, die: str) -> None:
    """Connect, send, die, (sweep), connect again: hundreds of times, no pause."""
    cycles = scaled(200)
    with Cluster(zmq_transport_spec) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        for cycle in range(cycles):
            try:
                conn = a.connect(b)
            except AssertionError:
                raise
            except Exception as exc:
                raise AssertionError(
                    f"CONN-7: connect() failed on flap cycle {cycle}/{cycles} ({die}): {exc!r}"
                ) from exc
            conn.send({"cycle": cycle})
            if die == "close":
                conn.close()
            else:
                conn.mark_dead()
            if die == "mark_dead+sweep":
                a.poll()
        final = a.connect(b)
        final.send({"final": True})
        seen = _wait_for_message(
            b, a, {"final": True}, known=[],
            what=f"CONN-7: a message after {cycles} flaps ({die}) to reach {b.name}",
        )
        cycles_seen = [m["cycle"] for m in seen if "cycle" in m]
        assert len(cycles_seen) == len(set(cycles_seen)), "CONN-7: a message arrived twice"
        assert seen.count({"final": True}) == 1
