"""The cost of authentication: each reference with CURVE on vs off, in the same run.

``python -m benchmarks.curve_cost [--repeats N]`` prints a Markdown table and
writes ``benchmarks/results/curve.json``; ``python -m benchmarks --only curve``
runs the same as a section of the benchmark report. For every family the plain and the
CURVE variant run in ``N`` interleaved pairs (plain, CURVE, plain, ...), so
a change in machine load hits both; the table gives medians and the median
of the per-pair ratios:

- ``p2p``: one-way throughput (64-byte messages a -> b, ``poll()`` driven)
  and the round-trip latency p50 (a -> b -> a);
- ``kv``: batches per second from the reference publisher to the reference
  subscriber, and the publish-to-delivery latency p50;
- ``control``: request/reply round trips per second (the p50 round trip is
  the latency);
- ``engine_pipeline``: requests per second through the reference client and
  engine (the engine in a thread of the same process; 400 requests of two
  tokens each in flight at once), and the p50 of one request's round trip
  (``add()`` to its finishing output, one token).

Both ends run in this process, so the process CPU time over the throughput
phase, per message, is the cost on the machine whatever else runs on it
(``cpu_us``, the figure to trust on a loaded machine); wall-time figures
move with the load. The CURVE keys are fresh per variant; what is measured is the steady state
after the handshake (CURVE's per-message cost: a Curve25519/XSalsa20-Poly1305
box per frame), plus, separately, the time to connect and handshake.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from conformance.testing.credentials import SuiteCredentials
from conformance.testing.net import free_port

_RESULTS = Path(__file__).resolve().parent / "results" / "curve.json"
_P2P_MESSAGES = 5000
_ROUND_TRIPS = 300
_KV_BATCHES = 3000
_PIPE_REQUESTS = 400


def _p50(samples: list[float]) -> float:
    return statistics.median(samples)


# -- p2p ----------------------------------------------------------------------------


def _p2p(curve: bool) -> dict[str, float]:
    from reference_impl.p2p.transport import ZmqTransport

    keys = SuiteCredentials.generate().node_kwargs() if curve else {}
    ports = free_port(), free_port()
    a = ZmqTransport(f"127.0.0.1:{ports[0]}", "127.0.0.1", ports[0], **keys)
    b = ZmqTransport(f"127.0.0.1:{ports[1]}", "127.0.0.1", ports[1], **keys)
    try:
        started = time.perf_counter()
        out = a.connect(b.local_id)
        out.send({"hello": 1})
        inbound = None
        while inbound is None:
            a.poll()
            new = b.poll()
            inbound = new[0] if new else None
        inbound.recv()
        connect_ms = (time.perf_counter() - started) * 1000
        payload = {"p": "x" * 48}
        started = time.perf_counter()
        cpu_started = time.process_time()
        sent = got = 0
        while got < _P2P_MESSAGES:
            while sent < _P2P_MESSAGES and sent - got < 500:  # below the send HWM
                out.send(payload)
                sent += 1
            b.poll()
            got += len(inbound.recv())
        throughput = _P2P_MESSAGES / (time.perf_counter() - started)
        cpu_us = (time.process_time() - cpu_started) * 1e6 / _P2P_MESSAGES
        rtts: list[float] = []
        for n in range(_ROUND_TRIPS):
            t0 = time.perf_counter()
            out.send({"n": n})
            while not inbound.recv():
                b.poll()
            inbound.send({"n": n})
            while not out.recv():
                a.poll()
            rtts.append((time.perf_counter() - t0) * 1e6)
        return {"throughput": throughput, "latency_us": _p50(rtts), "connect_ms": connect_ms,
                "cpu_us": cpu_us}
    finally:
        a.close()
        b.close()


# -- KV events ------------------------------------------------------------------------


def _kv(curve: bool) -> dict[str, float]:
    from reference_impl.kv_events.publisher import KVEventPublisher
    from reference_impl.kv_events.schema import AllBlocksCleared, KVEventBatch
    from reference_impl.kv_events.subscriber import KVEventSubscriber

    creds = SuiteCredentials.generate()
    ports = free_port(), free_port()
    endpoints = f"tcp://127.0.0.1:{ports[0]}", f"tcp://127.0.0.1:{ports[1]}"
    pub = KVEventPublisher(*endpoints, **(creds.server_kwargs() if curve else {}))
    sub = KVEventSubscriber(*endpoints, resync_idle_ms=0,
                            **(creds.client_kwargs() if curve else {}))
    batch = KVEventBatch(ts=1.0, events=[AllBlocksCleared()])
    try:
        started = time.perf_counter()
        while not sub.poll(5):
            pub.publish(batch)
        connect_ms = (time.perf_counter() - started) * 1000
        while sub.poll(20):
            pass
        started = time.perf_counter()
        cpu_started = time.process_time()
        for _ in range(_KV_BATCHES):
            pub.publish(batch)
        got = 0
        while got < _KV_BATCHES:
            got += len(sub.poll(50))
        throughput = _KV_BATCHES / (time.perf_counter() - started)
        cpu_us = (time.process_time() - cpu_started) * 1e6 / _KV_BATCHES
        lat: list[float] = []
        for _ in range(_ROUND_TRIPS):
            t0 = time.perf_counter()
            pub.publish(batch)
            while not sub.poll(5):
                pass
            lat.append((time.perf_counter() - t0) * 1e6)
        return {"throughput": throughput, "latency_us": _p50(lat), "connect_ms": connect_ms,
                "cpu_us": cpu_us}
    finally:
        sub.close()
        pub.shutdown()


# -- control ----------------------------------------------------------------------------


def _control(curve: bool) -> dict[str, float]:
    from benchmarks.control import reference_server
    from reference_impl.control import ControlClient

    creds = SuiteCredentials.generate()
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with reference_server(endpoint, {"ECHO": lambda r: {"n": r.get("n")}},
                          **(creds.server_kwargs() if curve else {})):
        client = ControlClient(endpoint, heartbeat_ivl_ms=10_000, heartbeat_timeout_ms=30_000,
                               **(creds.client_kwargs() if curve else {}))
        try:
            started = time.perf_counter()
            client.request("ECHO", {"n": -1})
            connect_ms = (time.perf_counter() - started) * 1000
            rtts: list[float] = []
            started = time.perf_counter()
            cpu_started = time.process_time()
            for n in range(_ROUND_TRIPS * 3):
                t0 = time.perf_counter()
                client.request("ECHO", {"n": n})
                rtts.append((time.perf_counter() - t0) * 1e6)
            throughput = len(rtts) / (time.perf_counter() - started)
            cpu_us = (time.process_time() - cpu_started) * 1e6 / len(rtts)
            return {"throughput": throughput, "latency_us": _p50(rtts),
                    "connect_ms": connect_ms, "cpu_us": cpu_us}
        finally:
            client.close()


# -- engine pipeline ----------------------------------------------------------------------


@contextmanager
def _pipeline(curve: bool) -> Iterator[tuple[Any, float]]:
    """A ready reference client and engine (in a thread); yields (client, connect ms)."""
    from reference_impl.engine_pipeline import EngineClient, EngineCore, FakeModel

    creds = SuiteCredentials.generate()
    started = time.perf_counter()
    client = EngineClient("tcp", **(creds.server_kwargs() if curve else {}))
    engine = EngineCore([client.handshake_address], engine_index=0, model=FakeModel(),
                        **(creds.client_kwargs() if curve else {}))
    thread = threading.Thread(target=engine.serve, daemon=True, name="bench-engine")
    thread.start()
    try:
        client.wait_ready()
        yield client, (time.perf_counter() - started) * 1000
    finally:
        engine.shutdown()
        thread.join(5)
        client.close()


def _finished(client: Any, count: int) -> None:
    done = 0
    while done < count:
        done += sum(1 for out in client.outputs(1000) if out.finished)


def _engine_pipeline(curve: bool) -> dict[str, float]:
    with _pipeline(curve) as (client, connect_ms):
        client.add("warm-up", [1], 2)
        _finished(client, 1)
        started = time.perf_counter()
        cpu_started = time.process_time()
        for n in range(_PIPE_REQUESTS):
            client.add(f"t{n}", [1], 2)
        _finished(client, _PIPE_REQUESTS)
        throughput = _PIPE_REQUESTS / (time.perf_counter() - started)
        cpu_us = (time.process_time() - cpu_started) * 1e6 / _PIPE_REQUESTS
        rtts: list[float] = []
        for n in range(_ROUND_TRIPS):
            t0 = time.perf_counter()
            client.add(f"l{n}", [1], 1)
            _finished(client, 1)
            rtts.append((time.perf_counter() - t0) * 1e6)
        return {"throughput": throughput, "latency_us": _p50(rtts), "connect_ms": connect_ms,
                "cpu_us": cpu_us}


FAMILIES: dict[str, Callable[[bool], dict[str, float]]] = {
    "p2p": _p2p, "kv": _kv, "control": _control, "engine_pipeline": _engine_pipeline,
}


def run(repeats: int = 5, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Interleaved plain/CURVE pairs per family; medians and per-pair ratios."""
    results: dict[str, Any] = {}
    for family, measure in FAMILIES.items():
        if progress is not None:
            progress(f"curve: {family}, {repeats} plain/CURVE pairs")
        pairs = [(measure(False), measure(True)) for _ in range(repeats)]
        summary: dict[str, float] = {}
        for key in ("throughput", "latency_us", "connect_ms", "cpu_us"):
            plain = [p[key] for p, _ in pairs]
            curve = [c[key] for _, c in pairs]
            summary[f"plain_{key}"] = round(_p50(plain), 1)
            summary[f"curve_{key}"] = round(_p50(curve), 1)
            summary[f"ratio_{key}"] = round(_p50([c / p for p, c in zip(plain, curve,
                                                                         strict=True)]), 3)
        summary["added_latency_us"] = round(summary["curve_latency_us"]
                                            - summary["plain_latency_us"], 1)
        results[family] = summary
    return {"repeats": repeats, "families": results}


def markdown(data: dict[str, Any]) -> list[str]:
    """The section of the benchmark report (lines)."""
    lines = ["## The cost of CURVE, per family", "",
             f"CURVE vs plain, {data['repeats']} interleaved pairs per family (medians; ratio "
             "= median of per-pair CURVE/plain; wall time on a possibly loaded machine)", "",
             "| family | throughput plain | CURVE | ratio | CPU per op plain (us) | CURVE | "
             "ratio | latency p50 plain (us) | CURVE | added (us) | connect plain (ms) | CURVE |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for family, s in data["families"].items():
        lines.append(
            f"| {family} | {s['plain_throughput']:.0f}/s | {s['curve_throughput']:.0f}/s | "
            f"{s['ratio_throughput']:.2f}x | {s['plain_cpu_us']:.0f} | {s['curve_cpu_us']:.0f} | "
            f"{s['ratio_cpu_us']:.2f}x | {s['plain_latency_us']:.0f} | "
            f"{s['curve_latency_us']:.0f} | {s['added_latency_us']:+.0f} | "
            f"{s['plain_connect_ms']:.1f} | {s['curve_connect_ms']:.1f} |")
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.curve_cost")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-write", action="store_true", help="do not write the JSON file")
    args = parser.parse_args(argv)
    data = run(args.repeats)
    print("\n".join(markdown(data)))
    if not args.no_write:
        _RESULTS.write_text(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
