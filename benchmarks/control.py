"""The control channel: reference round trips vs raw REQ/REP, detection precision, suite cost.

- ``throughput``: request/reply round trips per second of the reference
  client and server (one client, the server's serve loop in a thread)
  against the same loop in raw pyzmq (a REQ client, a REP server polled in a
  thread, msgspec on both sides), in many short interleaved pairs of the
  same run, so a change in machine load hits both. Target (issue 23): the
  ratio of the medians >= 0.9 (the per-pair ratios are reported too). Both
  sides have a context per end; the raw REQ correlates and times out (see
  :func:`_raw_round_trips` for what it still leaves out).
- ``detection``: a silent partition through toxiproxy (the chaos rig of the
  suite) and the time until the reference client reports the server dead,
  as a ratio to the heartbeat timeout; the contract's window is
  ``[timeout, timeout + interval + slack]``, i.e. ratios in
  ``[1.0, 1.2 + slack/timeout]`` with the suite's 100/500 ms.
- ``suite``: wall time of the control contract's default run (no chaos) and
  of its chaos clauses, as a user runs them.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import zmq

from benchmarks._stats import Spread

_ROOT = Path(__file__).resolve().parents[1]
_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder()


def _raw_loop(
    seconds: float,
    server_type: int,
    answer: Callable[[zmq.Socket[bytes]], None],
    client_type: int,
    round_trip: Callable[[zmq.Socket[bytes], int], None],
    client_options: Mapping[int, int] | None = None,
    per_cpu_second: bool = False,
) -> float:
    """Round trips per second between a raw client and a raw server polled in a
    thread: ``answer`` reads one request and replies, ``round_trip`` sends
    request ``n`` and waits for its reply.

    Client and server have a context (an I/O thread) each, as the reference's
    client and server do and as two processes would: one shared I/O thread
    would carry both ends of the TCP connection and save the raw loop a
    thread wake-up per message that no deployment saves. With
    ``per_cpu_second``: round trips per second of this process's CPU time
    (client, server and both I/O threads), which load changes far less than
    the wall time.
    """
    from conformance.testing.net import free_port

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    client_ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    server = ctx.socket(server_type)
    server.setsockopt(zmq.LINGER, 0)
    server.bind(endpoint)
    stop = threading.Event()

    def serve() -> None:
        poller = zmq.Poller()
        poller.register(server, zmq.POLLIN)
        while not stop.is_set():
            if poller.poll(10):
                answer(server)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = client_ctx.socket(client_type)
    client.setsockopt(zmq.LINGER, 0)
    for option, value in (client_options or {}).items():
        client.setsockopt(option, value)
    client.connect(endpoint)
    count = 0
    try:
        deadline = time.perf_counter() + seconds
        started, cpu_started = time.perf_counter(), time.process_time()
        while time.perf_counter() < deadline:
            round_trip(client, count)
            count += 1
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
    finally:
        stop.set()
        thread.join(5)
        client_ctx.destroy(linger=0)
        ctx.destroy(linger=0)
    return count / (cpu if per_cpu_second else elapsed)


def _echo(payload: bytes) -> bytes:
    """The reply of every raw loop: the request's nonce."""
    return _ENCODER.encode({"nonce": _DECODER.decode(payload).get("nonce")})


def _answer_rep(rep: zmq.Socket[bytes]) -> None:
    rep.send(_echo(rep.recv()))


def _answer_router(router: zmq.Socket[bytes]) -> None:
    frames = router.recv_multipart()
    router.send_multipart([*frames[:-1], _echo(frames[-1])])


def _raw_round_trips(seconds: float, per_cpu_second: bool = False) -> float:
    """REQ/REP round trips per second, REP polled in a thread (the baseline).

    The REQ does the per-request work the contract asks of any client, the
    way raw pyzmq does it: a request id matched on the reply
    (``ZMQ_REQ_CORRELATE``, with ``ZMQ_REQ_RELAXED`` so a lost reply does
    not wedge the socket) and a receive timeout (``ZMQ_RCVTIMEO``), all
    inside libzmq. What it leaves out, and the reference pays for on every
    request: heartbeats (a PING timer checked per request), re-registration
    (a look at the socket monitor every few milliseconds), the rebuild on a
    timeout, and the server's checks of the envelope and of every payload.
    """

    def round_trip(req: zmq.Socket[bytes], n: int) -> None:
        req.send(_ENCODER.encode({"type": "ECHO", "nonce": n}))
        _DECODER.decode(req.recv())

    return _raw_loop(seconds, zmq.REP, _answer_rep, zmq.REQ, round_trip,
                     client_options={zmq.REQ_CORRELATE: 1, zmq.REQ_RELAXED: 1,
                                     zmq.RCVTIMEO: 2500},
                     per_cpu_second=per_cpu_second)


def _raw_router_round_trips(seconds: float) -> float:
    """The reference's framing by hand: a DEALER with an id frame, a polled ROUTER.

    Separates what ROUTER/DEALER framing costs in pyzmq (one call, and one
    release of the GIL, per frame) from what the reference adds to it.
    """

    def round_trip(dealer: zmq.Socket[bytes], n: int) -> None:
        dealer.send_multipart([n.to_bytes(8, "big"), b"",
                               _ENCODER.encode({"type": "ECHO", "nonce": n})])
        _DECODER.decode(dealer.recv_multipart()[-1])

    return _raw_loop(seconds, zmq.ROUTER, _answer_router, zmq.DEALER, round_trip)


@contextmanager
def reference_server(endpoint: str, handlers: Mapping[str, Callable[[Any], Any]],
                     **options: Any) -> Iterator[None]:
    """The reference ``ControlServer`` bound at ``endpoint`` with ``handlers`` (and
    ``options``), serving in a thread of its own until the block ends."""
    from reference_impl.control import ControlServer

    ready, stop = threading.Event(), threading.Event()

    def serve() -> None:
        server = ControlServer(endpoint, handlers, **options)
        ready.set()
        try:
            while not stop.is_set():
                server.serve(10)
        finally:
            server.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ready.wait(5)
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


def _reference_round_trips(seconds: float, per_cpu_second: bool = False) -> float:
    """The same loop through the reference client and server (``per_cpu_second``: as in
    :func:`_raw_loop`)."""
    from conformance.testing.net import free_port
    from reference_impl.control import ControlClient

    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with reference_server(endpoint, {"ECHO": lambda r: {"nonce": r.get("nonce")}}):
        client = ControlClient(endpoint)
        count = 0
        try:
            deadline = time.perf_counter() + seconds
            started, cpu_started = time.perf_counter(), time.process_time()
            while time.perf_counter() < deadline:
                client.request("ECHO", {"nonce": count})
                count += 1
            elapsed = time.perf_counter() - started
            cpu = time.process_time() - cpu_started
        finally:
            client.close()
    return count / (cpu if per_cpu_second else elapsed)


def throughput(trials: int, seconds: float, progress: Callable[[str], None]) -> dict[str, Any]:
    loops = {"raw_req_rep": _raw_round_trips, "raw_dealer_router": _raw_router_round_trips,
             "reference": _reference_round_trips}
    rates: dict[str, list[float]] = {name: [] for name in loops}
    for n in range(trials):
        # Rotate the order, so a load trend does not favour one loop.
        names = list(loops)
        names = names[n % len(names):] + names[:n % len(names)]
        got = {name: loops[name](seconds) for name in names}
        for name, rate in got.items():
            rates[name].append(rate)
        progress(f"trial {n + 1}: " + ", ".join(f"{k} {v:,.0f}/s" for k, v in got.items()))
    spreads = {name: Spread.of(values) for name, values in rates.items()}
    per_trial = [f / r for f, r in zip(rates["reference"], rates["raw_req_rep"], strict=True)]
    framing = [f / r for f, r in zip(rates["raw_dealer_router"], rates["raw_req_rep"],
                                     strict=True)]
    return {
        "seconds_per_trial": seconds,
        **{name: spread.as_dict() for name, spread in spreads.items()},
        "ratio_of_medians": round(spreads["reference"].median / spreads["raw_req_rep"].median, 3),
        "ratio_per_trial": Spread.of(per_trial).as_dict(),
        "dealer_router_vs_req_rep_per_trial": Spread.of(framing).as_dict(),
        "target_ratio": 0.9,
    }


def detection(trials: int, progress: Callable[[str], None]) -> dict[str, Any]:
    from chaos.proxy import Toxiproxy
    from conformance.contracts.control.faults import ChaosRig
    from conformance.contracts.control.harness import (
        ECHO,
        HEARTBEAT_IVL_MS,
        HEARTBEAT_TIMEOUT_MS,
    )
    from conformance.contracts.control.spec import load

    spec = load("reference_impl.control:REFERENCE")
    samples: list[float] = []
    with Toxiproxy.start() as toxiproxy:
        for n in range(trials):
            with ChaosRig(spec, toxiproxy) as rig:
                rig.start_server()
                client = rig.client()
                rig.wait_until(functools.partial(_answers, client, ECHO), timeout=5,
                               what="a first request")
                rig.drive(0.3, tick=[client])
                fault = rig.partition()
                while client.alive and time.monotonic() < fault.in_place_at + 3:
                    client.tick()
                    time.sleep(0.001)
                ms = (time.monotonic() - fault.in_place_at) * 1000
                samples.append(ms)
                progress(f"trial {n + 1}: dead after {ms:.0f} ms")
    ratios = [ms / HEARTBEAT_TIMEOUT_MS for ms in samples]
    return {
        "interval_ms": HEARTBEAT_IVL_MS,
        "timeout_ms": HEARTBEAT_TIMEOUT_MS,
        "samples_ms": [round(ms, 1) for ms in samples],
        "detection_ms": Spread.of(samples).as_dict(),
        "ratio": Spread.of(ratios).as_dict(),
        "target_ratio": [1.0, 1.0 + HEARTBEAT_IVL_MS / HEARTBEAT_TIMEOUT_MS],
    }


def _answers(client: Any, kind: str) -> bool:
    return client.attempt(kind, {"nonce": 0})[0] is not None


def _suite_command(chaos: bool) -> list[str]:
    """How a user runs the control contract (the CLI once it knows contracts)."""
    args = ["--chaos", "-k", "chaos"] if chaos else []
    return [sys.executable, "-m", "conformance.cli", "run", "-q", "--contract", "control", *args]


def suite(repeats: int, progress: Callable[[str], None]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, chaos in (("default", False), ("chaos clauses", True)):
        walls = []
        for _ in range(repeats):
            cmd = _suite_command(chaos)
            started = time.monotonic()
            proc = subprocess.run(cmd, cwd=_ROOT, capture_output=True, text=True, check=False)
            wall = time.monotonic() - started
            if proc.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n"
                                   f"{proc.stdout[-3000:]}")
            walls.append(wall)
            progress(f"control contract, {label}: {wall:.1f} s")
        out[label] = {"wall_s": Spread.of(walls).as_dict(), "command": " ".join(cmd[1:])}
    out["budget_s"] = 60
    return out


def run(repeats: int = 5, progress: Callable[[str], None] = print) -> dict[str, Any]:
    return {
        # Many short interleaved pairs: on a shared machine the load drifts within seconds.
        "throughput": throughput(max(10, 4 * repeats), 0.3, progress),
        "detection": detection(max(5, 2 * repeats), progress),
        "suite": suite(max(1, repeats // 2), progress),
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run(progress=lambda line: print(line, file=sys.stderr)), indent=2))
