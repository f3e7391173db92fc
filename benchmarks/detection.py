"""Heartbeat detection of a blackhole partition, as a ratio to the timeout.

Each trial builds two reference nodes behind their own proxies (the chaos
topology), establishes a connection both ways, blackholes both proxies and
measures, from the moment the fault is in place, how long until each side's
connection reports ``alive == False``. The ratio to the configured timeout
should sit in ``[1.0, 1.0 + interval/timeout + 0.1]``: libzmq starts the
timeout clock when it sends a PING, so detection lands between one timeout
and one timeout plus one interval after the last traffic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks._stats import Spread
from conformance.contracts.p2p.spec import SUITE_HEARTBEAT_IVL_MS as INTERVAL_MS
from conformance.contracts.p2p.spec import SUITE_HEARTBEAT_TIMEOUT_MS as TIMEOUT_MS


def _trial(spec: Any, toxiproxy: Any) -> list[float]:
    from conformance.contracts.p2p.chaos_suite._support import watch_deaths
    from conformance.contracts.p2p.harness import handshake, receive
    from conformance.contracts.p2p.topology import ChaosCluster

    with ChaosCluster(spec, toxiproxy) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        a_out, b_in = handshake(a, b, hello={"hello": "a"})
        b_in.send({"hello": "b"})
        receive(a_out, 1, nodes=[b], what="b's answer")
        fault = cluster.faults.partition(a, b)
        until = fault.in_place_at + 4 * TIMEOUT_MS / 1000
        deaths = watch_deaths({"a": a_out, "b": b_in}, nodes=[a, b], until=until)
        return list(deaths.after(fault.in_place_at).values())


def run(trials: int = 15, progress: Callable[[str], None] = print) -> dict[str, Any]:
    from chaos.proxy import Toxiproxy
    from conformance.contracts.p2p.spec import spec_from_path

    spec = spec_from_path("reference_impl:ZmqTransport")
    samples: list[float] = []
    with Toxiproxy.start() as toxiproxy:
        for n in range(trials):
            times = _trial(spec, toxiproxy)
            samples.extend(times)
            progress(f"trial {n + 1}: " + ", ".join(f"{ms:.0f} ms" for ms in times))
            toxiproxy.reset()
    ratios = [ms / TIMEOUT_MS for ms in samples]
    return {
        "interval_ms": INTERVAL_MS,
        "timeout_ms": TIMEOUT_MS,
        "samples_ms": [round(ms, 1) for ms in samples],
        "ratio": Spread.of(ratios).as_dict(),
        "target_ratio": [1.0, 1.0 + INTERVAL_MS / TIMEOUT_MS + 0.1],
    }
