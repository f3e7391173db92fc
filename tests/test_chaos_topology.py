"""The chaos topology routes every byte through the proxies, and faults heal.

Real nodes of the reference transport behind the worker's toxiproxy (the
embedded server unless ``TOXIPROXY_URL`` or a ``toxiproxy-server`` binary is
found), plus pure checks of the chaos machine's model.
"""

from __future__ import annotations

import pytest

from chaos.fixtures import toxiproxy, toxiproxy_reset
from chaos.proxy import Toxiproxy
from conformance.contracts.p2p.chaos_machine import ChaosModel
from conformance.contracts.p2p.harness import handshake, receive, wait_until
from conformance.contracts.p2p.spec import TransportSpec, make_spec
from conformance.contracts.p2p.topology import ChaosCluster
from reference_impl import ZmqTransport

__all__ = ["toxiproxy", "toxiproxy_reset"]  # fixtures, re-exported for pytest


@pytest.fixture
def spec() -> TransportSpec:
    return make_spec(ZmqTransport)


def _names(tp: Toxiproxy) -> set[str]:
    return {p.name for p in tp.proxies()}


@pytest.mark.chaos
def test_nodes_advertise_their_proxy_not_their_bind_address(
    spec: TransportSpec, toxiproxy: Toxiproxy
) -> None:
    with ChaosCluster(spec, toxiproxy) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        for node in (a, b):
            proxy = cluster.proxy(node)
            assert node.local_id == f"{proxy.listen_host}:{proxy.listen_port}"
            assert proxy.listen_port != node.port
            assert proxy.upstream == f"{node.host}:{node.port}"
        _, b_in = handshake(a, b)
        assert b_in.peer_id == a.local_id


@pytest.mark.chaos
def test_no_byte_bypasses_the_proxies(spec: TransportSpec, toxiproxy: Toxiproxy) -> None:
    """With both proxies disabled nothing arrives; once enabled, it does."""
    with ChaosCluster(spec, toxiproxy) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        fault = cluster.faults.disable(a, b)
        out = a.connect(b)
        out.send({"n": 1})
        cluster.drive(0.3)
        assert not b.inbound, "a message reached b although its proxy was disabled"
        cluster.faults.heal(fault)
        inbound = wait_until(lambda: b.inbound, nodes=[a, b], what="b to accept a after the heal")
        assert receive(inbound[0], 1, nodes=[a]) == [{"n": 1}]


@pytest.mark.chaos
def test_partition_swallows_traffic_and_heal_restores_it(
    spec: TransportSpec, toxiproxy: Toxiproxy
) -> None:
    with ChaosCluster(spec, toxiproxy) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        a_out, b_in = handshake(a, b)
        fault = cluster.faults.partition(a, b)
        assert fault.in_place_at >= fault.started_at
        assert {name for _, name in fault.toxics} and len(fault.toxics) == 8
        a_out.send({"n": 2})
        cluster.drive(0.2)
        assert b_in.recv() == [], "a message crossed a silent partition"
        cluster.faults.heal(fault)
        assert cluster.faults.heal(fault) == fault.healed_at  # idempotent
        for proxy in (cluster.proxy(a), cluster.proxy(b)):
            assert proxy.toxics() == []


@pytest.mark.chaos
def test_close_heals_faults_and_deletes_proxies(spec: TransportSpec, toxiproxy: Toxiproxy) -> None:
    before = _names(toxiproxy)
    cluster = ChaosCluster(spec, toxiproxy)
    with pytest.raises(RuntimeError, match="boom"), cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        cluster.faults.partition(a)
        cluster.faults.latency(b, latency_ms=10)
        raise RuntimeError("boom")
    assert cluster.faults.active == []
    assert all(f.healed_at is not None for f in cluster.faults.history)
    assert _names(toxiproxy) == before


@pytest.mark.chaos
def test_restart_keeps_identity_and_proxy(spec: TransportSpec, toxiproxy: Toxiproxy) -> None:
    with ChaosCluster(spec, toxiproxy) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        proxy, local_id = cluster.proxy(b), b.local_id
        cluster.restart(b)
        assert (cluster.proxy(b), b.local_id, b.generation) == (proxy, local_id, 1)
        handshake(a, b)


@pytest.mark.chaos
def test_bad_arguments_are_refused_by_name(spec: TransportSpec, toxiproxy: Toxiproxy) -> None:
    with ChaosCluster(spec, toxiproxy) as cluster:
        with pytest.raises(ValueError, match="local_id"):
            cluster.add_node("x", local_id="127.0.0.1:1")
        with pytest.raises(ValueError, match="at least one node"):
            cluster.faults.partition()
        assert cluster.faults.active == []


# -- the chaos machine's model (pure) ---------------------------------------------


def _model() -> ChaosModel:
    model = ChaosModel()
    for name in ("n0", "n1", "n2"):
        model.add_node(name, f"127.0.0.1:{1000 + int(name[1])}")
    return model


def test_destructive_fault_makes_traffic_of_that_node_uncertain() -> None:
    model = _model()
    c01 = model.connected("n0", "n1")
    c12 = model.connected("n1", "n2")
    c20 = model.connected("n2", "n0")
    m01 = model.new_message(c01, {})
    model.sent(m01)
    m12 = model.new_message(c12, {})
    model.sent(m12)
    model.fault_on("n0", destructive=True, what="partition")
    assert c01.uncertain and c20.uncertain and c12.healthy
    assert not m01.must and m12.must
    assert model.send_outcome(c01) == "either"
    during = model.connected("n1", "n0")
    assert during.uncertain, "a connection made during the fault is touched too"


def test_after_heal_fresh_connections_must_deliver_even_if_old_one_dies() -> None:
    model = _model()
    old = model.connected("n1", "n0")
    model.fault_on("n0", destructive=True, what="partition")
    model.fault_healed("n0", destructive=True)
    fresh = model.connected("n0", "n1")
    msg = model.new_message(fresh, {})
    model.sent(msg)
    assert msg.must and msg.clause == "HB-5"
    model.seen_dead(old)  # n1's touched entry for n0 dies after the heal
    assert msg.must, "a message on a healthy connection stays 'must' (POLL-2)"
    assert model.missing() == [msg]


def test_benign_fault_keeps_messages_must() -> None:
    model = _model()
    conn = model.connected("n0", "n1")
    model.fault_on("n1", destructive=False, what="latency")
    msg = model.new_message(conn, {})
    assert msg.must and msg.clause == "HB-6" and conn.healthy
    model.fault_healed("n1", destructive=False)
    assert not model.benign
