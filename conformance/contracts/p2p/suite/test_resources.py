"""Resources: RES-1 and RES-2.

Descriptors and OS threads of this process are counted
(:mod:`conformance.testing.resources`). Baselines are taken after a warm-up cycle
(libzmq keeps a few descriptors after a context's first connection) and
compared by waiting for the counts to come back, since libzmq closes sockets
asynchronously.
"""

from __future__ import annotations

import pytest

from conformance.config.profiles import scaled
from conformance.contracts.p2p.harness import Cluster, Connection, handshake, receive, wait_inbound
from conformance.contracts.p2p.process_nodes import is_process_spec
from conformance.contracts.p2p.spec import TransportSpec
from conformance.drivers import is_driver_factory
from conformance.testing import resources
from conformance.testing.net import unreachable_address


@pytest.fixture(autouse=True)
def _need_counting(zmq_transport_spec: TransportSpec) -> None:
    if not resources.supported():
        pytest.skip("RES: cannot count file descriptors on this platform")
    if is_process_spec(zmq_transport_spec) and not is_driver_factory(zmq_transport_spec.factory):
        pytest.skip("RES: descriptors and threads are counted in the test process, and with "
                    "--nodes process the transports live in other processes; run RES with "
                    "--nodes inprocess")


def _busy_cluster(spec: TransportSpec, unreachable: str) -> Cluster:
    """Four nodes with connections in every state the contract names."""
    cluster = Cluster(spec)
    try:
        _populate(cluster, unreachable)
    except BaseException as exc:
        try:
            cluster.close()
        except Exception as close_error:
            exc.add_note(f"also, while closing the cluster: {close_error!r}")
        raise
    return cluster


def _populate(cluster: Cluster, unreachable: str) -> None:
    a, b, c = cluster.add_node("a"), cluster.add_node("b"), cluster.add_node("c")
    handshake(a, b)  # live both ways, read
    out_c, _ = handshake(a, c)
    out_c.mark_dead()  # marked dead, not swept
    queued = a.connect(unreachable)  # messages queued towards nobody
    for n in range(50):
        queued.send({"n": n})
    closed, _ = handshake(c, b)
    closed.close()  # closed by the caller
    d = cluster.add_node("d")
    d.connect(a).send({"unread": True})  # lands at a, which never polls for it
    cluster.drive(0.02, nodes=[d])


@pytest.mark.clause("RES-1")
def test_transport_close_releases_descriptors_and_threads(
    zmq_transport_spec: TransportSpec,
) -> None:
    with unreachable_address() as nowhere:
        _busy_cluster(zmq_transport_spec, nowhere).close()  # warm-up
        baseline = resources.wait_until_stable()
        cluster = _busy_cluster(zmq_transport_spec, nowhere)
        grown = resources.snapshot()
        assert grown.fd_count > baseline.fd_count, "RES-1: building nodes opened no descriptors?"
        cluster.close()
        resources.wait_for_release(
            baseline,
            what="RES-1: four transports with live, dead, closed, queued and unread "
            "connections were closed",
        )


@pytest.mark.clause("RES-2", "CONN-3", "POLL-2")
def test_reconnect_cycles_do_not_grow_descriptors(zmq_transport_spec: TransportSpec) -> None:
    """Both sides die and reconnect many times; descriptors stay where they were."""
    cycles = scaled(60)
    with Cluster(zmq_transport_spec) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        out, inbound = handshake(a, b)

        def cycle(n: int, out: Connection, inbound: Connection) -> tuple[Connection, Connection]:
            out.mark_dead()
            inbound.mark_dead()
            known = list(b.inbound)
            new_out = a.connect(b)
            new_out.send({"cycle": n})
            new_inbound = wait_inbound(b, a.local_id, nodes=[a], exclude=known)
            assert receive(new_inbound, 1, nodes=[a]) == [{"cycle": n}]
            new_inbound.send({"reply": n})
            assert receive(new_out, 1, nodes=[b]) == [{"reply": n}]
            return new_out, new_inbound

        for n in range(5):  # warm-up
            out, inbound = cycle(n, out, inbound)
        baseline = resources.wait_until_stable(drive=cluster.poll_all)
        for n in range(5, 5 + cycles):
            out, inbound = cycle(n, out, inbound)
        resources.wait_for_release(
            baseline,
            drive=cluster.poll_all,
            fd_slack=3,
            what=f"RES-2: after {cycles} die-and-reconnect cycles",
        )
