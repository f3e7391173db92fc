"""Polling and routing: POLL-1, POLL-2, POLL-4, POLL-5 (POLL-3 is in test_security).

``poll()`` does all of a transport's I/O, so these tests control exactly when
each node polls: senders are driven while the receiver is left alone, so
traffic lands between two of its polls, which is where routing bugs live.
"""

from __future__ import annotations

import statistics
import time
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
    handshake,
    receive,
    wait_inbound,
    wait_until,
)
from conformance.contracts.p2p.spec import TransportSpec
from conformance.supervision import watchdog


@pytest.mark.clause("POLL-1", "MSG-2")
@pytest.mark.long(1)
@profiles.suite_settings()
@given(
    counts=st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=3),
    land_first=st.booleans(),
    rounds=st.integers(min_value=1, max_value=2),
)
def test_each_inbound_connection_reported_once_with_first_message(
    zmq_transport_spec: TransportSpec, counts: list[int], land_first: bool, rounds: int
) -> None:
    """Senders connect and send; in a second round both ends kill the connection
    and the senders reconnect, so the node meets peers it has seen before."""
    with Cluster(zmq_transport_spec) as cluster:
        b = cluster.add_node("b")
        senders = [cluster.add_node(f"s{i}") for i in range(len(counts))]
        outs: dict[str, Connection] = {}
        for round_ in range(rounds):
            if round_:
                for conn in [*outs.values(), *b.inbound]:
                    conn.mark_dead()
            _one_round(cluster, b, senders, counts, outs, land_first, round_)


def _one_round(
    cluster: Cluster,
    b: Node,
    senders: list[Node],
    counts: list[int],
    outs: dict[str, Connection],
    land_first: bool,
    round_: int,
) -> None:
    known = len(b.inbound)
    sent: dict[str, list[dict[str, Any]]] = {}
    for sender, count in zip(senders, counts, strict=True):
        outs[sender.local_id] = conn = sender.connect(b)
        sent[sender.local_id] = [{"round": round_, "seq": n} for n in range(count)]
        for msg in sent[sender.local_id]:
            conn.send(msg)
    if land_first:
        cluster.drive(0.02, nodes=senders)
    got: dict[str, list[dict[str, Any]]] = {}

    def all_reported() -> bool:
        for new in b.poll():  # Node.poll() itself fails on a second report
            first = new.recv()
            assert first, (
                f"POLL-1: poll() returned the inbound connection from {new.peer_id} "
                "before its first message was readable"
            )
            got.setdefault(new.peer_id, []).extend(first)
        return len(got) == len(senders)

    wait_until(all_reported, nodes=senders,
               what=f"POLL-1: round {round_}: {len(senders)} inbound connection(s) "
               "reported by poll()")
    cluster.settle(quiet=0.03, nodes=[b, *senders])
    fresh = b.inbound[known:]
    peers = sorted(c.peer_id for c in fresh)
    assert peers == sorted(sent), (
        f"POLL-1: round {round_}: poll() reported inbound connections {peers}, expected "
        f"one each from {sorted(sent)}"
    )
    for conn in fresh:
        missing = len(sent[conn.peer_id]) - len(got[conn.peer_id])
        rest = receive(conn, missing, nodes=senders) if missing > 0 else conn.recv()
        stream = got[conn.peer_id] + rest
        assert stream == sent[conn.peer_id], (
            f"MSG-2: from {conn.peer_id} received {stream!r}, sent {sent[conn.peer_id]!r}"
        )


@pytest.mark.clause("POLL-2", "CONN-3")
@pytest.mark.parametrize("order", ["kill-then-reconnect", "reconnect-then-kill"])
def test_connection_killed_between_polls_is_swept_before_routing(
    zmq_transport_spec: TransportSpec, order: str
) -> None:
    """b kills its inbound connection between two polls while a reconnects and sends.

    The reconnecting peer's message must open a new inbound connection
    returned by ``poll()``; the dead one must not swallow it.
    """
    with Cluster(zmq_transport_spec) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        out, old_inbound = handshake(a, b)
        for round_ in range(scaled(3)):
            wanted = {"round": round_, "after": "reconnect"}
            known = list(b.inbound)
            if order == "kill-then-reconnect":
                old_inbound.mark_dead()
            out.mark_dead()
            out = a.connect(b)
            out.send(wanted)
            # The message lands at b while b is not polled.
            cluster.drive(0.02, nodes=[a])
            if order == "reconnect-then-kill":
                old_inbound.mark_dead()
            new_inbound = wait_inbound(
                b, a.local_id, nodes=[a], exclude=known,
                what=f"POLL-2: round {round_}: poll() to report the reconnecting peer's "
                "new connection",
            )
            assert new_inbound.raw is not old_inbound.raw
            swallowed = old_inbound.recv()
            assert wanted not in swallowed, (
                "POLL-2: the message after the reconnect was routed to the dead connection"
            )
            got = receive(new_inbound, 1, nodes=[a])
            assert got == [wanted], f"POLL-2: the new connection received {got!r}"
            old_inbound = new_inbound


@pytest.mark.clause("POLL-4")
def test_idle_poll_returns_empty_quickly(zmq_transport_spec: TransportSpec) -> None:
    """Idle: no peers at all, then established connections with nothing in flight.

    "Quickly" is the contract here: each idle ``poll()`` runs under a 1 s
    watchdog and the median of many must stay below 50 ms (a poll that
    waits for traffic instead of returning takes longer).
    """
    with Cluster(zmq_transport_spec) as cluster:
        a = cluster.add_node("a")
        _idle_polls(a, 15, "with no peers")
        b = cluster.add_node("b")
        out, inbound = handshake(a, b)
        out.send({"drain": 1})
        receive(inbound, 1, nodes=[a])
        # Let anything still in flight (heartbeats are not messages) settle.
        cluster.settle(quiet=0.03)
        _idle_polls(a, 15, "with an idle outbound connection")
        _idle_polls(b, 15, "with an idle inbound connection")
        assert out.recv() == [] and inbound.recv() == []


def _idle_polls(node: Node, count: int, state: str) -> None:
    durations: list[float] = []
    for _ in range(count):
        start = time.perf_counter()
        with watchdog.guard(f"idle {node.name}.poll() (POLL-4)", 1.0):
            new = node.poll()
        durations.append(time.perf_counter() - start)
        assert len(new) == 0, f"POLL-4: idle poll() {state} returned {new!r}"
    median = statistics.median(durations)
    assert median < 0.05, (
        f"POLL-4: idle poll() {state} took {median * 1000:.1f} ms (median of {count}); "
        "it must return at once when there is nothing to do"
    )


@pytest.mark.clause("POLL-5")
@pytest.mark.parametrize("side", ["outbound", "inbound"])
def test_closed_peer_is_marked_dead_in_bounded_time(
    zmq_transport_spec: TransportSpec, side: str
) -> None:
    """Close one node's transport; the survivor's connection to it dies within the bound.

    The bound is the declared ``detects_peer_close_ms``, plus 0.5 s of slack for
    scheduling on a loaded machine.
    """
    bound_s = zmq_transport_spec.capabilities.detects_peer_close_ms / 1000
    with Cluster(zmq_transport_spec) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        out, inbound = handshake(a, b)
        survivor_conn: Connection
        if side == "outbound":
            survivor, survivor_conn, gone = a, out, b
        else:
            survivor, survivor_conn, gone = b, inbound, a
        # Exchange both ways first, so the survivor's connection is fully up.
        inbound.send({"reply": 1})
        receive(out, 1, nodes=[b])
        gone.close()
        wait_until(
            lambda: not survivor_conn.alive,
            nodes=[survivor],
            timeout=bound_s + 0.5,
            what=f"POLL-5: {survivor.name}'s {side} connection to the closed {gone.name} to be "
            f"marked dead (declared bound {bound_s * 1000:.0f} ms + 0.5 s slack)",
        )
