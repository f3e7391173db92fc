"""Network faults between a client and its engine, through toxiproxy (tcp addresses only).

The client binds its request and output sockets on ports the suite chose
and advertises a toxiproxy proxy in front of each (``addresses["advertise"]``),
so the engine's DEALER and PUSH reach it only through the proxies. A
silent partition of both must end in PIPE-5 behaviour within the death
bound when the implementation declares ``detects_hang`` (a liveness
heartbeat), since nothing else can tell a partition from a quiet engine;
latency below the heartbeat window must cause no death.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from chaos.proxy import Proxy, Toxiproxy
from conformance.contracts.engine_pipeline.harness import SLACK_S, Rig, request_id
from conformance.testing.net import HOST, free_port

pytestmark = pytest.mark.chaos

_HOLD_CLOSE_MS = 600_000


def _proxied(rig: Rig, toxiproxy: Toxiproxy) -> tuple[Any, list[Proxy]]:
    """A client whose engine connects through two proxies, and the ready engine process."""
    ports = {role: free_port() for role in ("input", "output")}
    proxies = {role: toxiproxy.create_proxy(toxiproxy.unique_name(f"pipe_{role}"),
                                            upstream=f"{HOST}:{port}", listen=f"{HOST}:0")
               for role, port in ports.items()}
    addresses = {"handshake": f"tcp://{HOST}:0",
                 "input": f"tcp://{HOST}:{ports['input']}",
                 "output": f"tcp://{HOST}:{ports['output']}",
                 "advertise": {role: f"tcp://{p.listen}" for role, p in proxies.items()}}
    client = rig.client(addresses, clause="PIPE-5")
    process = rig.engine([client.handshake_address], clause="PIPE-5")
    rig.ready(client, process, clause="PIPE-5")
    rig.closers += [p.destroy for p in proxies.values()]
    return client, list(proxies.values())


def _round_trip_s(rig: Rig, client: Any) -> float:
    rid = request_id("rt")
    started = time.monotonic()
    client.add(rid, [1], 1)
    rig.collect(client, [rid], clause="PIPE-5")
    return time.monotonic() - started


def _require_proxied(rig: Rig, client: Any, proxies: list[Proxy]) -> None:
    """Skip unless the engine's traffic really crosses the proxies (the client honours
    ``advertise``): 300 ms of latency on the output path must show."""
    proxies[1].add_toxic("latency", name="probe", stream="upstream", latency=300)
    try:
        took = _round_trip_s(rig, client)
    finally:
        proxies[1].remove_toxic("probe")
    if took < 0.25:
        pytest.skip("PIPE-5: the client ignores addresses['advertise'], so the suite cannot put "
                    "a proxy between it and its engine")


@pytest.mark.clause("PIPE-5")
def test_silent_partition_ends_in_engine_death(rig: Rig, toxiproxy: Toxiproxy) -> None:
    if not rig.caps.detects_hang:
        pytest.skip("PIPE-5: detects_hang not declared: a partition cannot be told from a "
                    "quiet engine (as vLLM today)")
    client, proxies = _proxied(rig, toxiproxy)
    _require_proxied(rig, client, proxies)
    for proxy in proxies:
        for stream in ("upstream", "downstream"):
            proxy.add_toxic("timeout", name=f"cut_{stream}", stream=stream, timeout=0)
            proxy.add_toxic("slow_close", name=f"hold_{stream}", stream=stream,
                            delay=_HOLD_CLOSE_MS)
    started = time.monotonic()
    bound = rig.death_bound_s + SLACK_S
    while time.monotonic() - started <= bound:
        try:
            client.outputs(50)
        except Exception:
            break
    else:
        raise AssertionError(f"PIPE-5: {bound:.2f} s into a silent partition the client still "
                             "takes its engine for alive (detects_hang declared)")
    with pytest.raises(Exception):  # noqa: B017 - any error, at once
        client.add(request_id("after"), [1], 1)


@pytest.mark.clause("PIPE-5")
def test_latency_below_the_window_is_no_death(rig: Rig, toxiproxy: Toxiproxy) -> None:
    client, proxies = _proxied(rig, toxiproxy)
    _require_proxied(rig, client, proxies)
    for proxy in proxies:
        proxy.add_toxic("latency", name="lag", stream="upstream", latency=100)
    rids = [request_id("lag") for _ in range(5)]
    for rid in rids:
        client.add(rid, [1], 10)
    streams = rig.collect(client, rids, clause="PIPE-5")
    for rid in rids:
        streams.check(rid, "PIPE-5", max_tokens=10)
    assert client.alive, "PIPE-5: 100 ms of latency was taken for an engine death"
