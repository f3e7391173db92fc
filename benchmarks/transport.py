"""Reference transport vs a raw pyzmq DEALER->ROUTER + msgspec baseline.

Both sides do the same work per message: encode a dict with msgspec, send it
without blocking on a DEALER, receive it on a ROUTER, check the frame count
and the identity, decode it and check it is a dict. The baseline has none of
the reference's bookkeeping (connection registry, monitors, sweeping, drop
counters), so the ratio reference/baseline is the price of the contract.

Every node runs in its own process (spawned, so no ZeroMQ state crosses a
fork); receivers and senders spin on non-blocking calls, as a caller of
``poll()`` does. The burst-and-poll figure is the exception: both nodes live
in one process, the shape a user's event loop has (send a burst of
:data:`BURST` on one connection, then ``poll()`` both nodes and ``recv()``
until the burst is in).
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.queues import Queue
from typing import Any

import msgspec
import zmq

from benchmarks._stats import Spread, percentile

KINDS = ("reference", "baseline")
SIZES = {"64 B": 64, "4 KiB": 4096, "1 MiB": 1024 * 1024}
#: Messages per throughput trial, by payload size: about 0.3-1 s each here.
COUNTS = {64: 100_000, 4096: 40_000, 1024 * 1024: 300}
HWM = 1000
#: Messages per burst in the burst-and-poll loop, and the loop's duration.
BURST = 500
BURST_SECONDS = 3.0
BURST_SIZES = {"64 B": 64, "4 KiB": 4096}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _payload(size: int) -> dict[str, Any]:
    return {"kind": "kv", "seq": 0, "data": b"\x5a" * size}


# -- the two implementations, behind one tiny interface ----------------------


class _ReferenceNode:
    def __init__(self, port: int) -> None:
        from reference_impl import SendQueueFullError, ZmqTransport

        self._full = SendQueueFullError
        self._t = ZmqTransport(f"127.0.0.1:{port}", "127.0.0.1", port, send_hwm=HWM)
        self._conns: list[Any] = []
        self._out: Any = None

    def connect(self, peer_port: int) -> None:
        self._out = self._t.connect(f"127.0.0.1:{peer_port}")

    def send(self, msg: dict[str, Any]) -> bool:
        try:
            self._out.send(msg)
            return True
        except self._full:
            self._t.poll()
            return False

    def drain(self) -> list[dict[str, Any]]:
        self._conns.extend(self._t.poll())
        got: list[dict[str, Any]] = []
        for conn in self._conns:
            got.extend(conn.recv())
        if self._out is not None:
            got.extend(self._out.recv())
        return got

    def reply_link(self) -> Any:
        return self._conns[0] if self._conns else None

    def close(self) -> None:
        self._t.close()


class _BaselineNode:
    def __init__(self, port: int) -> None:
        self._ctx = zmq.Context(io_threads=1)
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        self._router.bind(f"tcp://127.0.0.1:{port}")
        self._identity = f"127.0.0.1:{port}".encode()
        self._dealers: dict[bytes, zmq.Socket[bytes]] = {}
        self._out: zmq.Socket[bytes] | None = None
        self._enc = msgspec.msgpack.Encoder()
        self._dec = msgspec.msgpack.Decoder()
        self.last_sender: bytes | None = None

    def _dealer(self, peer: bytes) -> zmq.Socket[bytes]:
        sock = self._dealers.get(peer)
        if sock is None:
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, HWM)
            sock.setsockopt(zmq.ROUTING_ID, self._identity)
            sock.connect(f"tcp://{peer.decode()}")
            self._dealers[peer] = sock
        return sock

    def connect(self, peer_port: int) -> None:
        self._out = self._dealer(f"127.0.0.1:{peer_port}".encode())

    def send(self, msg: dict[str, Any], to: zmq.Socket[bytes] | None = None) -> bool:
        sock = to or self._out
        assert sock is not None
        try:
            sock.send(self._enc.encode(msg), zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False

    def drain(self) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        while True:
            try:
                frames = self._router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return got
            if len(frames) != 2:
                continue
            try:
                frames[0].decode()
                msg = self._dec.decode(frames[1])
            except (ValueError, msgspec.DecodeError):
                continue
            if isinstance(msg, dict):
                self.last_sender = frames[0]
                got.append(msg)

    def reply_link(self) -> Any:
        return None if self.last_sender is None else self._dealer(self.last_sender)

    def close(self) -> None:
        self._ctx.destroy(linger=0)


def _make(kind: str, port: int) -> Any:
    return _ReferenceNode(port) if kind == "reference" else _BaselineNode(port)


# -- process bodies -------------------------------------------------------------


def _sink(kind: str, port: int, expected: int, ready: Queue[Any], out: Queue[Any]) -> None:
    node = _make(kind, port)
    ready.put(True)
    received = 0
    while received < expected:
        received += len(node.drain())
    out.put(time.perf_counter())  # CLOCK_MONOTONIC: comparable across processes
    node.close()


def _source(
    kind: str, port: int, peer: int, count: int, size: int, ready: Queue[Any], go: Any, stop: Any
) -> None:
    node = _make(kind, port)
    node.connect(peer)
    msg = _payload(size)
    ready.put(True)
    go.wait(60)
    sent = 0
    while sent < count:
        if node.send(msg):
            sent += 1
    # Keep the link up until the sink has everything: closing with linger 0
    # would drop what is still queued.
    while not stop.wait(0.01):
        node.drain()
    node.close()


def _echo(kind: str, port: int, count: int, ready: Queue[Any]) -> None:
    node = _make(kind, port)
    ready.put(True)
    echoed = 0
    while echoed < count:
        for msg in node.drain():
            link = node.reply_link()
            if kind == "reference":
                link.send(msg)
            else:
                while not node.send(msg, to=link):
                    pass
            echoed += 1
    time.sleep(0.2)  # let the last reply leave before the context goes
    node.close()


def _pinger(kind: str, port: int, peer: int, count: int, out: Queue[Any]) -> None:
    node = _make(kind, port)
    node.connect(peer)
    rtts: list[float] = []
    for i in range(count):
        started = time.perf_counter()
        while not node.send({"seq": i, "data": b"\x00" * 64}):
            pass
        while not node.drain():
            pass
        rtts.append(time.perf_counter() - started)
    out.put(rtts)
    node.close()


# -- trials -----------------------------------------------------------------


@dataclass(frozen=True)
class ThroughputTrial:
    msgs_per_s: float
    mb_per_s: float


def throughput(
    kind: str, size: int, *, senders: int = 1, count: int | None = None
) -> ThroughputTrial:
    """One trial: ``senders`` processes push ``count`` messages each into one sink."""
    ctx = mp.get_context("spawn")
    per_sender = count or COUNTS[size]
    if senders > 1:
        per_sender = max(1, per_sender // senders)
    ready: Queue[Any] = ctx.Queue()
    out: Queue[Any] = ctx.Queue()
    go, stop = ctx.Event(), ctx.Event()
    sink_port = _free_port()
    sink = ctx.Process(target=_sink, args=(kind, sink_port, per_sender * senders, ready, out))
    sink.start()
    ready.get(timeout=30)
    sources = [
        ctx.Process(
            target=_source,
            args=(kind, _free_port(), sink_port, per_sender, size, ready, go, stop),
        )
        for _ in range(senders)
    ]
    for proc in sources:
        proc.start()
    for _ in sources:
        ready.get(timeout=60)
    started = time.perf_counter()
    go.set()
    elapsed = out.get(timeout=300) - started
    stop.set()
    sink.join(30)
    for proc in sources:
        proc.join(30)
    total = per_sender * senders
    return ThroughputTrial(total / elapsed, total * size / elapsed / 1e6)


def round_trips(kind: str, count: int = 3000) -> list[float]:
    """Round-trip times (seconds) of ``count`` 64-byte ping-pongs."""
    ctx = mp.get_context("spawn")
    ready: Queue[Any] = ctx.Queue()
    out: Queue[Any] = ctx.Queue()
    echo_port = _free_port()
    echo = ctx.Process(target=_echo, args=(kind, echo_port, count, ready))
    echo.start()
    ready.get(timeout=30)
    pinger = ctx.Process(target=_pinger, args=(kind, _free_port(), echo_port, count, out))
    pinger.start()
    rtts: list[float] = out.get(timeout=300)
    pinger.join(30)
    echo.join(30)
    return rtts[count // 10 :]  # drop the warm-up tenth


def _burst_body(kind: str, size: int, seconds: float, out: Queue[Any]) -> None:
    """``a`` sends bursts of :data:`BURST` to ``b``; after each, both are polled until it is in.

    Puts ``(messages per second, messages per CPU second)``: the CPU time is
    the whole process's (both nodes and their libzmq I/O threads), which a
    loaded machine changes far less than the wall time.
    """
    a_port, b_port = _free_port(), _free_port()
    a, b = _make(kind, a_port), _make(kind, b_port)
    a.connect(b_port)
    msg = _payload(size)
    total = 0
    started, cpu_started = time.perf_counter(), time.process_time()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        received = 0
        for _ in range(BURST):
            while not a.send(msg):
                received += len(b.drain())
        while received < BURST:
            a.drain()
            received += len(b.drain())
        total += received
    cpu = time.process_time() - cpu_started
    out.put((total / (time.perf_counter() - started), total / cpu))
    a.close()
    b.close()


def burst_and_poll(kind: str, size: int, seconds: float = BURST_SECONDS, *,
                   per_cpu_second: bool = False) -> float:
    """Messages/s of the burst-and-poll loop, both nodes in one (spawned) process;
    with ``per_cpu_second``, messages per second of the process's CPU time instead."""
    ctx = mp.get_context("spawn")
    out: Queue[Any] = ctx.Queue()
    proc = ctx.Process(target=_burst_body, args=(kind, size, seconds, out))
    proc.start()
    wall_rate, cpu_rate = out.get(timeout=seconds + 60)
    proc.join(30)
    return float(cpu_rate if per_cpu_second else wall_rate)


def run(repeats: int = 3, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """All transport figures; ratios are computed within this one run."""
    results: dict[str, Any] = {"throughput": {}, "latency": {}, "fan_in": {}, "burst": {}}
    for label, size in SIZES.items():
        row: dict[str, Any] = {}
        for kind in KINDS:
            trials = [throughput(kind, size) for _ in range(repeats)]
            row[kind] = {
                "msgs_per_s": Spread.of([t.msgs_per_s for t in trials]).as_dict(),
                "mb_per_s": Spread.of([t.mb_per_s for t in trials]).as_dict(),
            }
            progress(f"throughput {label} {kind}: {row[kind]['msgs_per_s']['median']:,.0f} msg/s")
        row["ratio"] = (
            row["reference"]["msgs_per_s"]["median"] / row["baseline"]["msgs_per_s"]["median"]
        )
        results["throughput"][label] = row
    for kind in KINDS:
        p50s, p99s = [], []
        for _ in range(repeats):
            rtts = sorted(round_trips(kind))
            p50s.append(percentile(rtts, 50) * 1e6)
            p99s.append(percentile(rtts, 99) * 1e6)
        results["latency"][kind] = {
            "p50_us": Spread.of(p50s).as_dict(),
            "p99_us": Spread.of(p99s).as_dict(),
        }
        p50, p99 = Spread.of(p50s).median, Spread.of(p99s).median
        progress(f"latency {kind}: p50 {p50:.0f} us, p99 {p99:.0f} us")
    lat = results["latency"]
    results["latency"]["ratio_p50"] = (
        lat["reference"]["p50_us"]["median"] / lat["baseline"]["p50_us"]["median"]
    )
    results["latency"]["ratio_p99"] = (
        lat["reference"]["p99_us"]["median"] / lat["baseline"]["p99_us"]["median"]
    )
    for kind in KINDS:
        trials = [throughput(kind, 64, senders=8) for _ in range(repeats)]
        results["fan_in"][kind] = {
            "msgs_per_s": Spread.of([t.msgs_per_s for t in trials]).as_dict()
        }
        progress(
            f"fan-in 8x64 B {kind}: {results['fan_in'][kind]['msgs_per_s']['median']:,.0f} msg/s"
        )
    fan = results["fan_in"]
    fan["ratio"] = (
        fan["reference"]["msgs_per_s"]["median"] / fan["baseline"]["msgs_per_s"]["median"]
    )
    for label, size in BURST_SIZES.items():
        # Interleaved, so a change in the machine's load hits both kinds alike.
        rates: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for _ in range(repeats):
            for kind in KINDS:
                rates[kind].append(burst_and_poll(kind, size))
        burst: dict[str, Any] = {
            kind: {"msgs_per_s": Spread.of(rates[kind]).as_dict()} for kind in KINDS
        }
        burst["ratio"] = (
            burst["reference"]["msgs_per_s"]["median"] / burst["baseline"]["msgs_per_s"]["median"]
        )
        results["burst"][label] = burst
        progress(f"burst-and-poll {label}: ratio {burst['ratio']:.2f}")
    return results
