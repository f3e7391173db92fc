"""Process nodes forked from a warm fork server (conformance.contracts.p2p._node_forks).

A forked node must be what an execnet node was: its own process, a child of
the test process, holding no descriptor of the fork server, and answering
faults and calls the same way. The execnet path stays for every other
gateway and when forks are switched off.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import psutil
import pytest

from conformance.contracts.p2p import _node_forks, process_nodes
from conformance.contracts.p2p.harness import Cluster, handshake, receive
from conformance.contracts.p2p.process_nodes import NodeProcessDied, ProcessTransport, process_spec
from conformance.contracts.p2p.spec import TransportSpec, spec_from_path

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs Linux /proc")


@pytest.fixture
def spec() -> Iterator[TransportSpec]:
    yield process_spec(spec_from_path("reference_impl:ZmqTransport"))
    process_nodes.shutdown()  # each test starts from no pool and no fork server


def _unix_socket_inodes() -> set[str]:
    with open("/proc/net/unix") as f:
        next(f)
        return {line.split()[6] for line in f if len(line.split()) > 6}


def _socket_inodes(pid: int) -> set[str]:
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with_target = os.readlink(f"/proc/{pid}/fd/{fd}")
        if with_target.startswith("socket:["):
            found.add(with_target[len("socket:["):-1])
    return found


def _transport(node: object) -> ProcessTransport:
    transport = getattr(node, "transport", None)
    assert isinstance(transport, ProcessTransport), transport
    return transport


def test_a_forked_node_is_a_child_of_the_test_process_with_only_its_channel(
    spec: TransportSpec,
) -> None:
    with Cluster(spec) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        server = _node_forks.fork_server()
        for node in (a, b):
            pid = _transport(node).pid
            assert psutil.Process(pid).ppid() == os.getpid() != server.process.pid
            # One Unix socket: its channel. The fork server's control socket, and the
            # other node's channel, were closed before it answered.
            unix = _socket_inodes(pid) & _unix_socket_inodes()
            assert len(unix) == 1, unix
            assert os.readlink(f"/proc/{pid}/fd/0") == os.devnull
        out, inbound = handshake(a, b)
        inbound.send({"n": 2**40})
        assert receive(out, 1, nodes=[b]) == [{"n": 2**40}]


def test_a_killed_forked_node_is_reported_with_its_signal(spec: TransportSpec) -> None:
    with Cluster(spec) as cluster:
        a = cluster.add_node("a")
        os.kill(_transport(a).pid, signal.SIGKILL)
        with pytest.raises(NodeProcessDied, match="SIGKILL"):
            a.poll()
        a.closed = True


def test_nodes_survive_the_fork_server_and_the_next_start_replaces_it(
    spec: TransportSpec,
) -> None:
    with Cluster(spec) as cluster:
        a = cluster.add_node("a")
        first = _node_forks.fork_server()
        first.process.kill()
        first.process.wait(timeout=10)
        assert a.poll() == []  # the node is not the fork server's child: it lives on
        b = cluster.add_node("b")
        assert _node_forks.fork_server() is not first
        handshake(a, b)


def test_with_forks_off_nodes_start_through_execnet(
    spec: TransportSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ZMQ_CONFORMANCE_NODE_FORKS", "0")
    process_nodes.shutdown()  # idle forked nodes of earlier tests would be reused
    with Cluster(spec) as cluster:
        a = cluster.add_node("a")
        worker = _transport(a)._worker
        assert worker.gateway is not None and worker.pid == _transport(a).pid
        assert a.poll() == []


def test_shutdown_ends_the_fork_server(spec: TransportSpec) -> None:
    with Cluster(spec) as cluster:
        cluster.add_node("a")
    server = _node_forks.fork_server()
    process_nodes.shutdown()
    deadline = time.monotonic() + 10
    while server.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.process.poll() is not None
    assert process_nodes.live_pids() == []
