"""The engine pipeline: reference client and engine vs a raw PUSH/PULL + msgspec loop.

``python -m benchmarks --only engine_pipeline`` (5 trials, writes
``benchmarks/results/``) or ``python -m benchmarks.engine_pipeline [TRIALS]``
(prints JSON and the Markdown table).

Three figures, each as a ratio to a raw pyzmq loop measured in the same
run (a ratio above 1 means the reference is faster):

- ``throughput``: 1,000 requests of :data:`TOKENS` tokens each, tokens per
  second from the first ``add()`` to the last finish.
- ``throughput_tuned``: the same, against a raw loop that sends and
  receives the way the reference does (one ``send`` per frame with int
  flags, no ``send_multipart``/``recv_multipart``, whose per-frame enum
  flags and ``getsockopt(RCVMORE)`` cost more than a small message's
  sends). ``throughput`` keeps the plain pyzmq calls a minimal loop
  makes; this one compares the work alone, not the choice of pyzmq call.
- ``latency``: one-token requests one at a time, p50 and p99 from ``add()``
  to the output.
- ``array``: requests carrying a 1 MiB float32 array that the engine
  echoes back (payloads per second, round trip).

Fairness. The engine side runs in a process of its own in both (as an
EngineCore does); both sides of both loops are warmed up on the same
pipeline before the timed part (:data:`WARM_UP`); each trial measures the
reference and the raw loop back to back, alternating which goes first, so
machine load hits both alike; a figure's ratio is the median of the
per-trial ratios (5 trials by default). Next to each wall-clock ratio the
benchmark reports a CPU ratio: the CPU time of both processes (the client's
whole process, and every thread of the engine process from
``/proc/PID/task/*/schedstat``) over the same timed part. On a loaded
machine wall time mostly measures the scheduler; CPU time is what the code
costs.

Same work where the contract fixes it: both engine sides drive the suite's
:class:`~reference_impl.engine_pipeline.model.FakeModel` (``add`` per
request, ``step`` while it has work), so the fake engine core costs both
alike, and both clients send the same ADD frames (an ``AddRequest``) that
both engines decode into the same struct. Beyond that the raw loop is not
the same work, and is not made to be; read the ratios with this in mind:

- it knows how many requests come, so its engine receives all 1,000 before
  its first step and sends 16 messages of 1,000 outputs; the reference steps
  whenever it has work, as an engine must, so its message count (and so its
  per-message cost) follows the arrival rate of requests;
- it keeps no per-request state on either side: no routing check of each
  output against the requests in flight (PIPE-8, PIPE-11), no per-request
  ordering and finish bookkeeping (PIPE-2), no utility futures (PIPE-12);
- it decodes without the strict checks (aux indices in range and all used,
  shapes against buffers, refused extensions: PIPE-1, PIPE-7), and its
  array echo sends the received frame back as it came, where the reference
  decodes the array into numpy on both sides and re-encodes it;
- it has one thread per side: no input thread (the reference's, like
  vLLM's, keeps the engine's loop responsive to requests and its death
  visible, PIPE-4, PIPE-7), and no client I/O thread (which watches engine
  death, PIPE-5, while the caller is not reading);
- the reference client has ZMTP heartbeats on (the declared reference,
  ``detects_hang``); the raw loop has none.
"""

from __future__ import annotations

import glob
import json
import multiprocessing
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import numpy as np
import zmq

from benchmarks._stats import Spread, percentile
from reference_impl.engine_pipeline import REFERENCE
from reference_impl.engine_pipeline.model import FakeModel
from reference_impl.engine_pipeline.wire import AddRequest, EngineOutputs

REQUESTS: Final = 1000
TOKENS: Final = 16
LATENCY_SAMPLES: Final = 300
ARRAY_BYTES: Final = 1 << 20
ARRAYS: Final = 200
#: Untimed work on the same pipeline before the timed part: requests per figure.
WARM_UP: Final = {"throughput": 100, "latency": 30, "array": 10}
_STOP: Final = b"stop"


@dataclass(frozen=True)
class _Timed:
    """One timed part: its wall time, CPU time of both processes, and the figure."""

    wall_s: float
    cpu_s: float
    value: float
    samples: tuple[float, ...] = ()


def _task_cpu_s(pid: int) -> float:
    """CPU time of every live thread of process ``pid`` (schedstat: nanoseconds on CPU)."""
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(path) as stat:
                total += int(stat.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total / 1e9


class _Clock:
    """Wall and CPU time of this process and the engine process ``pid``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.wall = time.perf_counter()
        self.cpu = time.process_time() + _task_cpu_s(pid)

    def stop(self, value: float | None = None, samples: tuple[float, ...] = ()) -> _Timed:
        wall = time.perf_counter() - self.wall
        cpu = time.process_time() + _task_cpu_s(self.pid) - self.cpu
        return _Timed(wall, cpu, wall if value is None else value, samples)


# -- the reference -------------------------------------------------------------


class _Reference:
    """The declared reference client here and its engine in a process of its own, ready."""

    def __init__(self) -> None:
        self.client = REFERENCE.client("tcp")
        config = {"factory": "reference_impl.engine_pipeline.engine:EngineCore",
                  "addresses": [self.client.handshake_address], "engine_index": 0}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "conformance.contracts.engine_pipeline.engine_host",
             json.dumps(config)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        self.client.wait_ready()
        self.serial = 0

    def rid(self, prefix: str) -> str:
        self.serial += 1
        return f"{prefix}{self.serial}"

    def close(self) -> None:
        self.client.close()  # first: the engine's end is then no news to anyone
        self.process.terminate()
        self.process.wait(10)


def _reference_throughput_round(ref: _Reference, requests: int) -> int:
    for _ in range(requests):
        ref.client.add(ref.rid("t"), [1], TOKENS)
    left, tokens = requests, 0
    while left:
        for out in ref.client.outputs(1000):
            tokens += len(out.token_ids)
            left -= out.finish_reason is not None
    return tokens


def _reference_throughput() -> _Timed:
    ref = _Reference()
    try:
        _reference_throughput_round(ref, WARM_UP["throughput"])
        clock = _Clock(ref.process.pid)
        tokens = _reference_throughput_round(ref, REQUESTS)
        timed = clock.stop()
        return _Timed(timed.wall_s, timed.cpu_s, tokens / timed.wall_s)
    finally:
        ref.close()


def _reference_latency_sample(ref: _Reference) -> float:
    started = time.perf_counter()
    ref.client.add(ref.rid("l"), [1], 1)
    while not ref.client.outputs(1000):
        pass
    return time.perf_counter() - started


def _reference_latency() -> _Timed:
    ref = _Reference()
    try:
        for _ in range(WARM_UP["latency"]):
            _reference_latency_sample(ref)
        clock = _Clock(ref.process.pid)
        samples = tuple(_reference_latency_sample(ref) for _ in range(LATENCY_SAMPLES))
        return clock.stop(0.0, samples)
    finally:
        ref.close()


def _reference_array_echo(ref: _Reference, array: np.ndarray[Any, Any]) -> None:
    ref.client.add(ref.rid("a"), [1], 1, payload={"x": array})
    got: list[Any] = []
    while not got:
        got = ref.client.outputs(1000)
    assert got[0].payload["x"].nbytes == ARRAY_BYTES


def _reference_arrays() -> _Timed:
    ref = _Reference()
    array = np.ones(ARRAY_BYTES // 4, dtype=np.float32)
    try:
        for _ in range(WARM_UP["array"]):
            _reference_array_echo(ref, array)
        clock = _Clock(ref.process.pid)
        for _ in range(ARRAYS):
            _reference_array_echo(ref, array)
        timed = clock.stop()
        return _Timed(timed.wall_s, timed.cpu_s, ARRAYS / timed.wall_s)
    finally:
        ref.close()


# -- the raw loop ----------------------------------------------------------------

_SNDMORE: Final = int(zmq.SNDMORE)


def _send_parts(sock: zmq.Socket[bytes], parts: list[Any], copy: bool = True) -> None:
    """A multipart send the way the reference sends: one ``send`` per frame, int flags.

    ``send_multipart`` ORs pyzmq's enum flags per frame and checks every part
    again, which costs more than the sends of a small message. The reference
    avoids it; the *tuned* raw loop (``throughput_tuned``) does too, so that
    figure compares the work, not the choice of pyzmq call.
    """
    last = len(parts) - 1
    for position, part in enumerate(parts):
        sock.send(part, _SNDMORE if position < last else 0, copy=copy)


def _recv_add(dealer: zmq.Socket[bytes]) -> bytes:
    """The blob of an ADD without aux frames, ``[type byte, blob]``: two ``recv`` calls (the
    tuned raw loop; ``recv_multipart`` asks ``getsockopt(RCVMORE)`` after each part)."""
    dealer.recv()
    return dealer.recv()


def _raw_server(name: str, router: str, pull: str) -> None:
    """The raw loop's engine side, in a process of its own: one of the ``_serve_*``.

    After serving it waits for the client's stop message, so the client can
    read this process's CPU time before it ends.
    """
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, b"\x00\x00")
    dealer.connect(router)
    push = ctx.socket(zmq.PUSH)
    push.connect(pull)
    dealer.send(b"")
    globals()[f"_serve_{name}"](dealer, push)
    while dealer.recv_multipart()[-1] != _STOP:
        pass
    dealer.close(linger=0)
    push.close(linger=5000)
    ctx.term()


class _Raw:
    """The raw loop: ROUTER -> DEALER for requests, PUSH -> PULL for outputs."""

    def __init__(self, name: str) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        # As the reference client's: a full pipe makes send() wait instead of dropping.
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.RCVHWM, 0)
        self.router.bind("tcp://127.0.0.1:*")
        self.pull.bind("tcp://127.0.0.1:*")
        spawn = multiprocessing.get_context("spawn")
        self.process = spawn.Process(target=_raw_server, args=(
            name, self.router.getsockopt_string(zmq.LAST_ENDPOINT),
            self.pull.getsockopt_string(zmq.LAST_ENDPOINT)), daemon=True)
        self.process.start()
        self.router.recv_multipart()
        assert self.process.pid is not None
        self.pid: int = self.process.pid

    def close(self) -> None:
        self.router.send_multipart([b"\x00\x00", _STOP])
        self.process.join(10)
        for sock in (self.router, self.pull):
            sock.close(linger=0)
        self.ctx.term()


def _serve_throughput(dealer: zmq.Socket[bytes], push: zmq.Socket[bytes],
                      tuned: bool = False) -> None:
    encoder = msgspec.msgpack.Encoder()
    decoder = msgspec.msgpack.Decoder(AddRequest)
    model = FakeModel()
    for requests in (WARM_UP["throughput"], REQUESTS):
        for _ in range(requests):
            blob = _recv_add(dealer) if tuned else dealer.recv_multipart()[1]
            model.add(decoder.decode(blob))
        while model.has_work:
            outs = [out for _, out in model.step()]
            push.send(encoder.encode(EngineOutputs(0, outs)))


def _serve_throughput_tuned(dealer: zmq.Socket[bytes], push: zmq.Socket[bytes]) -> None:
    _serve_throughput(dealer, push, tuned=True)


def _raw_throughput_round(raw: _Raw, requests: int, first: int, tuned: bool) -> int:
    encoder = msgspec.msgpack.Encoder()
    decoder = msgspec.msgpack.Decoder(EngineOutputs)
    for i in range(first, first + requests):
        request = AddRequest(f"t{i}", [1], TOKENS, 0)
        frames = [b"\x00\x00", b"\x00", encoder.encode(request)]
        if tuned:
            _send_parts(raw.router, frames)
        else:
            raw.router.send_multipart(frames)
    per_request: dict[str, list[int]] = {}
    left, tokens = requests, 0
    while left:
        message = decoder.decode(raw.pull.recv())
        for out in message.outputs:
            per_request.setdefault(out.request_id, []).extend(out.new_token_ids)
            tokens += len(out.new_token_ids)
            left -= out.finish_reason is not None
    return tokens


def _raw_throughput(tuned: bool = False) -> _Timed:
    raw = _Raw("throughput_tuned" if tuned else "throughput")
    try:
        _raw_throughput_round(raw, WARM_UP["throughput"], 0, tuned)
        clock = _Clock(raw.pid)
        tokens = _raw_throughput_round(raw, REQUESTS, WARM_UP["throughput"], tuned)
        timed = clock.stop()
        return _Timed(timed.wall_s, timed.cpu_s, tokens / timed.wall_s)
    finally:
        raw.close()


def _serve_latency(dealer: zmq.Socket[bytes], push: zmq.Socket[bytes]) -> None:
    encoder = msgspec.msgpack.Encoder()
    decoder = msgspec.msgpack.Decoder(AddRequest)
    model = FakeModel()
    for _ in range(WARM_UP["latency"] + LATENCY_SAMPLES):
        model.add(decoder.decode(dealer.recv_multipart()[1]))
        outs = [out for _, out in model.step()]
        push.send(encoder.encode(EngineOutputs(0, outs)))


def _raw_latency() -> _Timed:
    encoder = msgspec.msgpack.Encoder()
    decoder = msgspec.msgpack.Decoder(EngineOutputs)
    raw = _Raw("latency")

    def sample(i: int) -> float:
        started = time.perf_counter()
        request = AddRequest(f"l{i}", [1], 1, 0)
        raw.router.send_multipart([b"\x00\x00", b"\x00", encoder.encode(request)])
        decoder.decode(raw.pull.recv())
        return time.perf_counter() - started

    try:
        for i in range(WARM_UP["latency"]):
            sample(i)
        clock = _Clock(raw.pid)
        samples = tuple(sample(WARM_UP["latency"] + i) for i in range(LATENCY_SAMPLES))
        return clock.stop(0.0, samples)
    finally:
        raw.close()


def _serve_arrays(dealer: zmq.Socket[bytes], push: zmq.Socket[bytes]) -> None:
    for _ in range(WARM_UP["array"] + ARRAYS):
        frames = dealer.recv_multipart(copy=False)
        header = msgspec.msgpack.decode(frames[1].bytes)
        data = np.frombuffer(frames[2].buffer, dtype=np.float32)
        push.send_multipart([msgspec.msgpack.encode(header), data.data], copy=False)


def _raw_arrays() -> _Timed:
    array = np.ones(ARRAY_BYTES // 4, dtype=np.float32)
    raw = _Raw("arrays")

    def echo(i: int) -> None:
        header = msgspec.msgpack.encode([f"a{i}", "<f4", [array.size], 1])
        raw.router.send_multipart([b"\x00\x00", b"\x00", header, array.data], copy=False)
        frames = raw.pull.recv_multipart(copy=False)
        got = np.frombuffer(frames[1].buffer, dtype=np.float32)
        assert got.nbytes == ARRAY_BYTES

    try:
        for i in range(WARM_UP["array"]):
            echo(i)
        clock = _Clock(raw.pid)
        for i in range(ARRAYS):
            echo(WARM_UP["array"] + i)
        timed = clock.stop()
        return _Timed(timed.wall_s, timed.cpu_s, ARRAYS / timed.wall_s)
    finally:
        raw.close()


def _raw_throughput_tuned() -> _Timed:
    return _raw_throughput(tuned=True)


def throughput(side: str, per_cpu_second: bool = False) -> float:
    """One 1,000-request round of ``side`` (``reference``, ``raw`` or ``tuned``), warmed
    up: tokens per second of wall time, or per second of CPU time of both processes
    (for ``python -m benchmarks ratios``, which interleaves the trials)."""
    runs = {"reference": _reference_throughput, "raw": _raw_throughput,
            "tuned": _raw_throughput_tuned}
    if side not in runs:
        raise ValueError(f"side must be one of {', '.join(runs)}; got {side!r}")
    timed = runs[side]()
    return timed.value * timed.wall_s / timed.cpu_s if per_cpu_second else timed.value


# -- the run ---------------------------------------------------------------------

_FIGURES: Final[dict[str, tuple[Callable[[], _Timed], Callable[[], _Timed]]]] = {
    "throughput": (_reference_throughput, _raw_throughput),
    "throughput_tuned": (_reference_throughput, _raw_throughput_tuned),
    "latency": (_reference_latency, _raw_latency),
    "array": (_reference_arrays, _raw_arrays),
}


def _pair(figure: str, reference_first: bool) -> tuple[_Timed, _Timed]:
    reference, raw = _FIGURES[figure]
    if reference_first:
        ref_timed = reference()
        return ref_timed, raw()
    raw_timed = raw()
    return reference(), raw_timed


def run(repeats: int = 5, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """``repeats`` interleaved trials of every figure; ratios are medians of per-trial ratios."""
    trials: dict[str, list[tuple[_Timed, _Timed]]] = {name: [] for name in _FIGURES}
    for trial in range(repeats):
        progress(f"engine pipeline trial {trial + 1}/{repeats}")
        for name in _FIGURES:
            trials[name].append(_pair(name, reference_first=trial % 2 == 0))
    result: dict[str, Any] = {}
    for name in ("throughput", "throughput_tuned", "array"):
        rows = trials[name]
        result[name] = {
            "reference": Spread.of([r.value for r, _ in rows]).as_dict(),
            "baseline": Spread.of([b.value for _, b in rows]).as_dict(),
            "ratio": statistics.median(r.value / b.value for r, b in rows),
            "cpu_ratio": statistics.median(b.cpu_s / r.cpu_s for r, b in rows),
            "per_trial": [round(r.value / b.value, 3) for r, b in rows],
            "cpu_per_trial": [round(b.cpu_s / r.cpu_s, 3) for r, b in rows],
        }
    for q in (50, 99):
        quantiles = [(percentile(sorted(r.samples), q), percentile(sorted(b.samples), q))
                for r, b in trials["latency"]]
        result[f"latency_p{q}"] = {
            "reference_ms": Spread.of([r * 1000 for r, _ in quantiles]).as_dict(),
            "baseline_ms": Spread.of([b * 1000 for _, b in quantiles]).as_dict(),
            # Speed ratio: raw latency over reference latency (above 1: the reference is faster).
            "ratio": statistics.median(b / r for r, b in quantiles),
            "per_trial": [round(b / r, 3) for r, b in quantiles],
        }
    result["latency_cpu_ratio"] = statistics.median(
        b.cpu_s / r.cpu_s for r, b in trials["latency"])
    result["latency_cpu_per_trial"] = [round(b.cpu_s / r.cpu_s, 3) for r, b in trials["latency"]]
    result["units"] = {"throughput": "tokens/s", "array": "1 MiB payloads/s round trip",
                       "cpu_ratio": "raw CPU s / reference CPU s, both processes"}
    result["trials"] = repeats
    return result


def markdown(result: dict[str, Any]) -> list[str]:
    def cell(d: dict[str, Any], digits: int = 0) -> str:
        return f"{d['median']:,.{digits}f} ({d['min']:,.{digits}f}-{d['max']:,.{digits}f})"

    def cpu(value: float | None) -> str:
        return "" if value is None else f"{value:.2f}"

    trials = result.get("trials", result["throughput"]["reference"]["n"])
    out = [f"## Engine pipeline: reference vs raw PUSH/PULL + msgspec ({trials} interleaved "
           "trials; ratios: median of per-trial ratios, above 1 = reference faster)", "",
           "| figure | reference | raw | wall ratio | CPU ratio |",
           "| --- | ---: | ---: | ---: | ---: |"]
    tp = result["throughput"]
    out.append(f"| {REQUESTS} requests x {TOKENS} tokens, tokens/s | {cell(tp['reference'])} | "
               f"{cell(tp['baseline'])} | {tp['ratio']:.2f} | {cpu(tp.get('cpu_ratio'))} |")
    tuned = result.get("throughput_tuned")
    if tuned is not None:
        out.append(f"| same, raw loop with the reference's per-frame sends, tokens/s | "
                   f"{cell(tuned['reference'])} | {cell(tuned['baseline'])} | "
                   f"{tuned['ratio']:.2f} | {cpu(tuned.get('cpu_ratio'))} |")
    for name in ("latency_p50", "latency_p99"):
        row = result[name]
        out.append(f"| one-token latency {name[-3:]}, ms | {cell(row['reference_ms'], 3)} | "
                   f"{cell(row['baseline_ms'], 3)} | {row['ratio']:.2f} | "
                   f"{cpu(result.get('latency_cpu_ratio'))} |")
    arr = result["array"]
    out.append(f"| 1 MiB array echo, payloads/s | {cell(arr['reference'], 1)} | "
               f"{cell(arr['baseline'], 1)} | {arr['ratio']:.2f} | "
               f"{cpu(arr.get('cpu_ratio'))} |")
    return [*out, ""]


if __name__ == "__main__":
    outcome = run(repeats=int(sys.argv[1]) if len(sys.argv) > 1 else 5,
                  progress=lambda line: print(line, file=sys.stderr))
    print(json.dumps(outcome, indent=2))
    print("\n".join(markdown(outcome)))
