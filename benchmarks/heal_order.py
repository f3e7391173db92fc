"""How often random fault schedules crash a toxiproxy server, by heal order.

``python -m benchmarks.heal_order [--schedules N] [--seed S]`` (``TOXIPROXY_SERVER``
names the real binary; without it the embedded server is used). Each schedule
is a random run of what the p2p chaos machine does to one proxy: up to three
faults at once (partition, reset, latency, slice), heals in any order (also
all of them oldest first, as the machine's ``heal_all`` rule and its teardown
do), connections opened, written to and half-closed, then one more toxic.
Every schedule runs twice with the same random choices, interleaved: with the
heal order of :class:`~conformance.contracts.p2p.faults.Faults` and with the
order it replaced (every healed toxic removed at once, newest first). It
counts the schedules after which the server no longer answers (a server that
died is started again). See docs/chaos.md, "toxiproxy-server 2.12.0's
AddToxic panic".
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import socket
from typing import cast

from chaos.launcher import start_binary
from chaos.proxy import FaultProxyStopped, Proxy, Toxiproxy, ToxiproxyError
from conformance.contracts.p2p.faults import Fault, Faults
from conformance.contracts.p2p.harness import Node


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name


class _OneProxy:
    def __init__(self, proxy: Proxy) -> None:
        self._proxy = proxy

    def proxy(self, node: Node) -> Proxy:
        return self._proxy


class _OldOrder(Faults):
    """The heal order before the change: the fault's own toxics, newest first."""

    def _unwind(self, proxy: Proxy, errors: list[ToxiproxyError]) -> None:
        placed = self._placed.get(proxy.name, [])
        for entry in reversed(placed):
            if entry.released:
                proxy.remove_toxic(entry.name)
        self._placed[proxy.name] = [entry for entry in placed if not entry.released]


class _Sink:
    """Accepts connections and keeps them open, reading and discarding."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.setblocking(False)
        self.accepted: list[socket.socket] = []
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while True:
                conn, _ = self.listener.accept()
                conn.setblocking(False)
                self.accepted.append(conn)
        for conn in self.accepted:
            with contextlib.suppress(OSError):
                conn.recv(65536)

    def close(self) -> None:
        for conn in self.accepted:
            conn.close()
        self.listener.close()


def _start() -> Toxiproxy:
    binary = os.environ.get("TOXIPROXY_SERVER")
    if not binary:
        return Toxiproxy.start("embedded")
    lease = start_binary(binary)
    return Toxiproxy(lease.host, lease.port, lease=lease)


def _schedule(server: Toxiproxy, faults_type: type[Faults], rng: random.Random) -> None:
    sink = _Sink()
    proxy = server.create_proxy(server.unique_name("heal_order"), sink.address)
    faults = faults_type(_OneProxy(proxy))
    node = cast(Node, _Named("x"))
    conns: list[socket.socket] = []
    try:
        for _ in range(14):
            sink.drain()
            step = rng.choice(["fault", "fault", "heal", "heal_all", "open", "write", "close"])
            if step == "fault" and len(faults.active) < 3:
                kind = rng.choice(["partition", "reset", "latency", "slice"])
                if kind == "partition":
                    faults.partition(node)
                elif kind == "reset":
                    faults.reset(node)
                elif kind == "latency":
                    faults.latency(node, latency_ms=rng.randint(1, 20))
                else:
                    faults.slice(node, average_size=16, size_variation=8, delay_us=50)
            elif step == "heal" and faults.active:
                faults.heal(rng.choice(faults.active))
            elif step == "heal_all":
                oldest_first: list[Fault] = list(faults.active)
                for fault in oldest_first:
                    faults.heal(fault)
            elif step == "open" or not conns:
                conns.append(socket.create_connection((proxy.listen_host, proxy.listen_port)))
            elif step == "write":
                with contextlib.suppress(OSError):
                    rng.choice(conns).send(b"x" * rng.randint(1, 2000))
            else:
                with contextlib.suppress(OSError):
                    rng.choice(conns).shutdown(socket.SHUT_WR)
        faults.heal(faults.latency(node, latency_ms=1))
        faults.heal_all()
    finally:
        for conn in conns:
            conn.close()
        sink.close()
        with contextlib.suppress(ToxiproxyError, FaultProxyStopped):
            proxy.destroy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    crashed = {"current": 0, "old": 0}
    server = _start()
    try:
        for number in range(args.schedules):
            for label, faults_type in (("current", Faults), ("old", _OldOrder)):
                # An error is judged below, by whether the server still answers.
                with contextlib.suppress(ToxiproxyError, FaultProxyStopped):
                    _schedule(server, faults_type, random.Random(args.seed * 100_003 + number))
                problem = server.problem(timeout=5.0)
                if problem is not None:
                    crashed[label] += 1
                    if label == "current":
                        print(f"schedule {number}, current order: {problem}")
                    server.stop()
                    server = _start()
    finally:
        server.stop()
    print(f"server {server.kind}: {args.schedules} schedules each; server stopped after "
          f"{crashed['current']} with the current heal order, {crashed['old']} with the old one")


if __name__ == "__main__":
    main()
