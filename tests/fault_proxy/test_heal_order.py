"""Healing faults in any order keeps a toxiproxy server alive and the wire right.

toxiproxy-server 2.12.0 panics in ``ToxicLink.AddToxic`` (link.go:186) once
toxics were removed from in front of one whose stub is still busy (a close held
by ``slow_close``, data held by a slicer) while the connection closes: the link
keeps stubs its toxic chain no longer has (docs/chaos.md, "toxiproxy-server
2.12.0's AddToxic panic"). The chaos machine heals faults in any order, so
:class:`~conformance.contracts.p2p.faults.Faults` takes toxics off a proxy
only from the end of its chain.

Each test drives one schedule the machine can draw through ``Faults`` on the
embedded server and on the real binary, then asserts what a run needs: the
server answers and takes a new toxic on that proxy, no toxic is left, the
connection is closed by the heals (or by its own close, let through), and a
new connection carries bytes.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import cast

import pytest

from chaos.launcher import start_binary
from chaos.proxy import FaultProxyStopped, Proxy, Toxiproxy
from conformance.contracts.p2p.faults import Faults
from conformance.contracts.p2p.harness import Node

pytestmark = pytest.mark.chaos

_IO_TIMEOUT_S = 5.0


class _Echo:
    """What the ``echo_server`` fixture provides (tests/fault_proxy/conftest.py)."""

    address: str


@dataclass(frozen=True)
class _Named:
    """Stands in for a node: ``Faults`` only reads its name."""

    name: str


class _OneProxy:
    """The topology ``Faults`` needs: every node sits behind the same proxy."""

    def __init__(self, proxy: Proxy) -> None:
        self._proxy = proxy

    def proxy(self, node: Node) -> Proxy:
        return self._proxy


def _connect(proxy: Proxy) -> socket.socket:
    sock = socket.create_connection((proxy.listen_host, proxy.listen_port), _IO_TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _echoes(sock: socket.socket, payload: bytes) -> bool:
    sock.sendall(payload)
    got = b""
    with contextlib.suppress(OSError):
        while len(got) < len(payload) and (data := sock.recv(65536)):
            got += data
    return got == payload


def _ends(sock: socket.socket, within_s: float) -> bool:
    """Whether the connection is closed or reset (EOF or an error) within ``within_s``."""
    deadline = time.monotonic() + within_s
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            if not sock.recv(65536):
                return True
        except TimeoutError:
            return False
        except OSError:
            return True
    return False


def _two_partitions_older_healed_first(faults: Faults, node: Node, sock: socket.socket) -> None:
    older = faults.partition(node)
    newer = faults.partition(node)
    faults.heal(older)
    faults.heal(newer)


def _latency_then_partition_then_a_close(
    faults: Faults, node: Node, sock: socket.socket
) -> None:
    latency = faults.latency(node, latency_ms=5)
    partition = faults.partition(node)
    sock.shutdown(socket.SHUT_WR)  # the FIN runs into the partition's slow_close
    faults.heal(latency)
    faults.heal(partition)


def _reset_then_partition_with_traffic(faults: Faults, node: Node, sock: socket.socket) -> None:
    reset = faults.reset(node)
    partition = faults.partition(node)
    sock.sendall(b"x" * 64)  # reaches reset_peer, which closes its stub
    faults.heal(reset)
    faults.heal(partition)


@pytest.fixture(scope="module")
def embedded() -> Iterator[Toxiproxy]:
    handle = Toxiproxy.start("embedded")
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture(params=["embedded", "binary"])
def server(request: pytest.FixtureRequest) -> Iterator[Toxiproxy]:
    """The module's embedded server, or a real binary of this test alone (one that
    panics takes no other test with it)."""
    if request.param == "embedded":
        yield request.getfixturevalue("embedded")
        return
    lease = start_binary(request.getfixturevalue("real_binary"))
    handle = Toxiproxy(lease.host, lease.port, lease=lease)
    try:
        yield handle
    finally:
        handle.stop()


def _two_slicers_busy_while_the_connection_closes(
    faults: Faults, node: Node, sock: socket.socket
) -> None:
    older = faults.slice(node, average_size=16, size_variation=8, delay_us=50)
    newer = faults.slice(node, average_size=16, size_variation=8, delay_us=50)
    sock.sendall(b"s" * 20_000)  # about a second of slicing, for the newer slicer too
    sock.shutdown(socket.SHUT_WR)
    faults.heal(older)
    faults.heal(newer)


Schedule = Callable[[Faults, Node, socket.socket], None]


@pytest.mark.parametrize(
    "schedule",
    [_two_partitions_older_healed_first, _latency_then_partition_then_a_close,
     _reset_then_partition_with_traffic, _two_slicers_busy_while_the_connection_closes],
    ids=lambda schedule: schedule.__name__.strip("_"),
)
def test_any_heal_order_leaves_the_server_working(
    server: Toxiproxy, echo_server: _Echo, schedule: Schedule
) -> None:
    proxy = server.create_proxy(server.unique_name("heal_order"), echo_server.address)
    faults = Faults(_OneProxy(proxy))
    node = cast(Node, _Named("x"))
    with _connect(proxy) as held:
        assert _echoes(held, b"before")
        try:
            schedule(faults, node, held)
            assert not faults.active
            # The next fault on the proxy is what crashed toxiproxy-server 2.12.0.
            faults.heal(faults.latency(node, latency_ms=1))
        except FaultProxyStopped as exc:  # a run error elsewhere; here the failure tested for
            pytest.fail(f"the schedule stopped the server: {exc}")
        assert proxy.toxics() == []
        assert _ends(held, _IO_TIMEOUT_S), "the healed partition left its connection open"
    with _connect(proxy) as fresh:
        assert _echoes(fresh, b"after the heals")


def test_a_fault_still_in_place_keeps_acting_after_an_older_one_heals(
    server: Toxiproxy, echo_server: _Echo
) -> None:
    """Healing the older of two faults takes the newer one's toxics out and puts them
    back (the newer latency still delays every byte); behind a partition still in
    place, the healed toxic stays until the partition heals."""
    proxy = server.create_proxy(server.unique_name("heal_order"), echo_server.address)
    faults = Faults(_OneProxy(proxy))
    node = cast(Node, _Named("x"))
    older = faults.slice(node, average_size=16, size_variation=8, delay_us=50)
    newer = faults.latency(node, latency_ms=150)
    faults.heal(older)
    assert [t.type for t in proxy.toxics()] == ["latency", "latency"]
    with _connect(proxy) as sock:
        start = time.monotonic()
        assert _echoes(sock, b"delayed both ways")
        assert time.monotonic() - start >= 2 * 0.150  # the latency toxics act on both streams
    partition = faults.partition(node)
    faults.heal(newer)  # in front of the partition: stays until it heals
    assert sorted(t.type for t in proxy.toxics()) == [
        "latency", "latency", "slow_close", "slow_close", "timeout", "timeout"]
    faults.heal(partition)
    assert proxy.toxics() == []
