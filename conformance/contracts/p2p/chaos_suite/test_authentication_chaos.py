"""SEC-2 under faults: authentication survives partitions and restarts, and pins keys.

With CURVE on (fresh keys per test, :mod:`conformance.testing.credentials`), nodes
talk through toxiproxy:

- after a silent partition heals, authenticated peers reconnect and talk both
  ways within the recovery bound (reconnect interval + handshake timeout),
  as HB-5 requires of plain ones: a CURVE handshake is no excuse for a slower
  recovery;
- a node restarted behind a partition with the same keys is reachable once it
  heals (HB-7 with authentication);
- a node restarted behind a partition with *new* keys is refused by the peer
  that pins the old ones: nothing crosses either way after the heal.
"""

from __future__ import annotations

import time

import pytest

from conformance.contracts.p2p.chaos_suite._support import (
    Mailbox,
    Recorder,
    greet_both_ways,
    heartbeat_for,
    report,
    watch_deaths,
)
from conformance.contracts.p2p.harness import Connection, Node, wait_until
from conformance.contracts.p2p.spec import TransportSpec
from conformance.contracts.p2p.topology import ChaosCluster
from conformance.testing.credentials import SuiteCredentials

pytestmark = pytest.mark.chaos

_BATCH = 10


def _authenticated_pair(cluster: ChaosCluster, spec: TransportSpec
                        ) -> tuple[Node, Node, Connection, Connection]:
    if not spec.capabilities.authentication:
        pytest.skip("SEC-2: requires capability authentication (see the SEC-2 tests)")
    cluster.credentials = SuiteCredentials.generate()
    a, b = cluster.add_node("a"), cluster.add_node("b")
    a_out, b_in = greet_both_ways(a, b)
    return a, b, a_out, b_in


def _deliver(sender: Connection, box: Mailbox, tag: str, *, nodes: list[Node],
             deadline: float, what: str) -> float:
    """Send a numbered batch; wait until all of it is in ``box``; return when."""
    expected = [{"tag": tag, "seq": n} for n in range(_BATCH)]
    for msg in expected:
        sender.send(msg)

    def arrived() -> bool:
        box.collect()
        return len([m for m in box.messages if m.get("tag") == tag]) >= _BATCH

    wait_until(arrived, nodes=nodes, timeout=max(deadline - time.monotonic(), 0.001),
               what=f"SEC-2: {what} within the recovery bound")
    got = [m for m in box.messages if m.get("tag") == tag]
    assert got == expected, f"SEC-2: {what}: got seqs {[m.get('seq') for m in got]}"
    return time.monotonic()


@pytest.mark.clause("SEC-2")
def test_authenticated_peers_recover_after_a_partition_heals(
    chaos_cluster: ChaosCluster, zmq_transport_spec: TransportSpec, record_property: Recorder,
) -> None:
    hb = heartbeat_for(zmq_transport_spec, "SEC-2")
    a, b, a_out, b_in = _authenticated_pair(chaos_cluster, zmq_transport_spec)
    fault = chaos_cluster.faults.partition(a, b)
    deaths = watch_deaths({"a": a_out, "b": b_in}, nodes=[a, b],
                          until=fault.in_place_at + 2 * hb.latest_ms() / 1000)
    assert set(deaths.at) == {"a", "b"}, "SEC-2: the partition was not detected (see HB-1)"
    healed_at = chaos_cluster.faults.heal(fault)
    deadline = healed_at + hb.recovery_bound_ms / 1000
    new_out = a.connect(b)
    at_b, at_a = Mailbox(b, a.local_id), Mailbox(a, b.local_id)
    at_a.track(new_out)
    ab_done = _deliver(new_out, at_b, "ab", nodes=[a, b], deadline=deadline,
                       what="a -> b over CURVE after the partition healed")
    back = next(c for c in reversed(b.inbound) if c.peer_id == a.local_id and c.alive)
    ba_done = _deliver(back, at_a, "ba", nodes=[a, b], deadline=deadline,
                       what="b -> a over CURVE after the partition healed")
    report(record_property, "SEC-2", "CURVE recovery after a partition:",
           recovery_ms=round((ab_done - healed_at) * 1000),
           both_ways_ms=round((ba_done - healed_at) * 1000), bound_ms=hb.recovery_bound_ms)


@pytest.mark.clause("SEC-2")
# "new" watches a whole recovery bound (4.25 s) for messages that must never come.
@pytest.mark.parametrize("keys", ["same", pytest.param("new", marks=pytest.mark.long(5))])
def test_node_restarted_behind_a_partition(
    chaos_cluster: ChaosCluster, zmq_transport_spec: TransportSpec, record_property: Recorder,
    keys: str,
) -> None:
    """Same keys: reachable after the heal within the recovery bound. New keys: the peer
    pinning the old ones sends it nothing and takes nothing from it."""
    hb = heartbeat_for(zmq_transport_spec, "SEC-2")
    a, b, a_out, _ = _authenticated_pair(chaos_cluster, zmq_transport_spec)
    fault = chaos_cluster.faults.partition(a, b)
    if keys == "new":
        chaos_cluster.restart_as(b, SuiteCredentials.generate())
    else:
        chaos_cluster.restart(b)
    watch_deaths({"a": a_out}, nodes=[a, b], until=fault.in_place_at + 2 * hb.latest_ms() / 1000)
    healed_at = chaos_cluster.faults.heal(fault)
    deadline = healed_at + hb.recovery_bound_ms / 1000
    at_b, at_a = Mailbox(b, a.local_id), Mailbox(a, b.local_id)
    out = a.connect(b) if not a_out.alive else a_out
    at_a.track(out)
    b_out = b.connect(a)
    at_b.track(b_out)
    if keys == "same":
        done = _deliver(out, at_b, "ab", nodes=[a, b], deadline=deadline,
                        what="a -> b restarted with the same keys")
        _deliver(b_out, at_a, "ba", nodes=[a, b], deadline=deadline + 1.0,
                 what="b restarted with the same keys -> a")
        report(record_property, "SEC-2", "CURVE restart behind a partition, same keys:",
               recovery_ms=round((done - healed_at) * 1000), bound_ms=hb.recovery_bound_ms)
        return
    for n in range(_BATCH):
        if out.alive:
            out.send({"tag": "ab", "seq": n})
        if b_out.alive:
            b_out.send({"tag": "ba", "seq": n})
    chaos_cluster.drive(hb.recovery_bound_ms / 1000, nodes=[a, b])
    at_a.collect()
    at_b.collect()
    assert not at_b.messages, (
        f"SEC-2: b, restarted with new keys, received {len(at_b.messages)} messages from a, "
        "which pins b's old server key")
    assert not at_a.messages, (
        f"SEC-2: a accepted {len(at_a.messages)} messages from b restarted with new keys")
