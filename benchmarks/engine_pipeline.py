"""The engine pipeline: reference client and engine vs a raw PUSH/PULL + msgspec loop.

Three figures, each as a ratio to a raw pyzmq loop doing the same work in
the same run (interleaved pairs, so machine load hits both alike; a ratio
above 1 means the reference is faster):

- ``throughput``: 1,000 requests of :data:`TOKENS` tokens each, tokens per
  second from the first ``add()`` to the last finish. The raw loop: a
  thread steps the same token function and sends one MessagePack message
  per step over PUSH; the reader decodes it with msgspec into the same
  structs and groups tokens per request.
- ``latency``: one-token requests one at a time, p50 and p99 from ``add()``
  to the output (raw: a ROUTER/DEALER request, the answer over PUSH/PULL).
- ``array``: requests carrying a 1 MiB float32 array that the engine
  echoes back (payloads per second; raw: the same two frames out and back).

The engine side runs in a process of its own in both (as an EngineCore does).
Target: every ratio >= 0.9.
"""

from __future__ import annotations

import json
import multiprocessing
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, Final

import msgspec
import numpy as np
import zmq

from benchmarks._stats import Spread, percentile
from reference_impl.engine_pipeline import EngineClient
from reference_impl.engine_pipeline.model import token_of
from reference_impl.engine_pipeline.wire import EngineOutput, EngineOutputs, FinishReason

REQUESTS: Final = 1000
TOKENS: Final = 16
LATENCY_SAMPLES: Final = 300
ARRAY_BYTES: Final = 1 << 20
ARRAYS: Final = 200


class _Reference:
    """A reference client here and a reference engine in its own process, ready."""

    def __init__(self) -> None:
        self.client = EngineClient("tcp")
        config = {"factory": "reference_impl.engine_pipeline.engine:EngineCore",
                  "addresses": [self.client.handshake_address], "engine_index": 0}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "conformance.contracts.engine_pipeline.engine_host",
             json.dumps(config)], stdin=subprocess.DEVNULL)
        self.client.wait_ready()

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        self.client.close()


def _reference_throughput() -> float:
    ref = _Reference()
    try:
        started = time.perf_counter()
        for i in range(REQUESTS):
            ref.client.add(f"t{i}", [1], TOKENS)
        left, tokens = REQUESTS, 0
        while left:
            for out in ref.client.outputs(1000):
                tokens += len(out.token_ids)
                left -= out.finish_reason is not None
        return tokens / (time.perf_counter() - started)
    finally:
        ref.close()


def _raw_server(name: str, router: str, pull: str) -> None:
    """The raw loop's engine side, in a process of its own: one of the ``_serve_*``."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, b"\x00\x00")
    dealer.connect(router)
    push = ctx.socket(zmq.PUSH)
    push.connect(pull)
    dealer.send(b"")
    globals()[f"_serve_{name}"](dealer, push)
    dealer.close(linger=0)
    push.close(linger=5000)
    ctx.term()


class _Raw:
    """The raw loop: ROUTER -> DEALER for requests, PUSH -> PULL for outputs."""

    def __init__(self, name: str) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
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

    def close(self) -> None:
        self.process.join(10)
        for sock in (self.router, self.pull):
            sock.close(linger=0)
        self.ctx.term()


def _serve_throughput(dealer: zmq.Socket[bytes], push: zmq.Socket[bytes]) -> None:
    encoder = msgspec.msgpack.Encoder()
    rids = [msgspec.msgpack.decode(dealer.recv_multipart()[1]) for _ in range(REQUESTS)]
    for position in range(TOKENS):
        last = position == TOKENS - 1
        outs = [EngineOutput(r, [token_of(r, position)],
                             int(FinishReason.LENGTH) if last else None) for r in rids]
        push.send(encoder.encode(EngineOutputs(0, outs)))


def _raw_throughput() -> float:
    encoder = msgspec.msgpack.Encoder()
    decoder = msgspec.msgpack.Decoder(EngineOutputs)
    raw = _Raw("throughput")
    try:
        started = time.perf_counter()
        for i in range(REQUESTS):
            raw.router.send_multipart([b"\x00\x00", b"\x00", encoder.encode(f"t{i}")])
        per_request: dict[str, list[int]] = {}
        left, tokens = REQUESTS, 0
        while left:
            message = decoder.decode(raw.pull.recv())
            for out in message.outputs:
                per_request.setdefault(out.request_id, []).extend(out.new_token_ids)
                tokens += len(out.new_token_ids)
                left -= out.finish_reason is not None
        return tokens / (time.perf_counter() - started)
    finally:
        raw.close()


def _reference_latency() -> list[float]:
    ref = _Reference()
    try:
        samples = []
        for i in range(LATENCY_SAMPLES):
            started = time.perf_counter()
            ref.client.add(f"l{i}", [1], 1)
            while not ref.client.outputs(1000):
                pass
            samples.append(time.perf_counter() - started)
        return samples
    finally:
        ref.close()


def _serve_latency(dealer: zmq.Socket[bytes], push: zmq.Socket[bytes]) -> None:
    encoder = msgspec.msgpack.Encoder()
    for _ in range(LATENCY_SAMPLES):
        rid = msgspec.msgpack.decode(dealer.recv_multipart()[1])
        out = EngineOutput(rid, [token_of(rid, 0)], int(FinishReason.LENGTH))
        push.send(encoder.encode(EngineOutputs(0, [out])))


def _raw_latency() -> list[float]:
    encoder = msgspec.msgpack.Encoder()
    decoder = msgspec.msgpack.Decoder(EngineOutputs)
    raw = _Raw("latency")
    try:
        samples = []
        for i in range(LATENCY_SAMPLES):
            started = time.perf_counter()
            raw.router.send_multipart([b"\x00\x00", b"\x00", encoder.encode(f"l{i}")])
            decoder.decode(raw.pull.recv())
            samples.append(time.perf_counter() - started)
        return samples
    finally:
        raw.close()


def _reference_arrays() -> float:
    ref = _Reference()
    array = np.ones(ARRAY_BYTES // 4, dtype=np.float32)
    try:
        started = time.perf_counter()
        for i in range(ARRAYS):
            ref.client.add(f"a{i}", [1], 1, payload={"x": array})
            got: list[Any] = []
            while not got:
                got = ref.client.outputs(1000)
            assert got[0].payload["x"].nbytes == ARRAY_BYTES
        return ARRAYS / (time.perf_counter() - started)
    finally:
        ref.close()


def _serve_arrays(dealer: zmq.Socket[bytes], push: zmq.Socket[bytes]) -> None:
    for _ in range(ARRAYS):
        frames = dealer.recv_multipart(copy=False)
        header = msgspec.msgpack.decode(frames[1].bytes)
        data = np.frombuffer(frames[2].buffer, dtype=np.float32)
        push.send_multipart([msgspec.msgpack.encode(header), data.data], copy=False)


def _raw_arrays() -> float:
    array = np.ones(ARRAY_BYTES // 4, dtype=np.float32)
    raw = _Raw("arrays")
    try:
        started = time.perf_counter()
        for i in range(ARRAYS):
            header = msgspec.msgpack.encode([f"a{i}", "<f4", [array.size], 1])
            raw.router.send_multipart([b"\x00\x00", b"\x00", header, array.data],
                                      copy=False)
            frames = raw.pull.recv_multipart(copy=False)
            got = np.frombuffer(frames[1].buffer, dtype=np.float32)
            assert got.nbytes == ARRAY_BYTES
        return ARRAYS / (time.perf_counter() - started)
    finally:
        raw.close()


def run(repeats: int = 5, progress: Callable[[str], None] = print) -> dict[str, Any]:
    pairs: dict[str, list[tuple[float, float]]] = {"throughput": [], "array": []}
    p50: list[tuple[float, float]] = []
    p99: list[tuple[float, float]] = []
    for trial in range(repeats):
        progress(f"engine pipeline trial {trial + 1}/{repeats}")
        pairs["throughput"].append((_reference_throughput(), _raw_throughput()))
        ref_lat, raw_lat = sorted(_reference_latency()), sorted(_raw_latency())
        p50.append((percentile(ref_lat, 50), percentile(raw_lat, 50)))
        p99.append((percentile(ref_lat, 99), percentile(raw_lat, 99)))
        pairs["array"].append((_reference_arrays(), _raw_arrays()))
    result: dict[str, Any] = {}
    for name, rows in pairs.items():
        result[name] = {
            "reference": Spread.of([r for r, _ in rows]).as_dict(),
            "baseline": Spread.of([b for _, b in rows]).as_dict(),
            "ratio": statistics.median(r / b for r, b in rows),
        }
    for name, rows in (("latency_p50", p50), ("latency_p99", p99)):
        result[name] = {
            "reference_ms": Spread.of([r * 1000 for r, _ in rows]).as_dict(),
            "baseline_ms": Spread.of([b * 1000 for _, b in rows]).as_dict(),
            # Speed ratio: raw latency over reference latency (above 1: the reference is faster).
            "ratio": statistics.median(b / r for r, b in rows),
        }
    result["units"] = {"throughput": "tokens/s", "array": "1 MiB payloads/s round trip"}
    return result


def markdown(result: dict[str, Any]) -> list[str]:
    def cell(d: dict[str, Any], digits: int = 0) -> str:
        return f"{d['median']:,.{digits}f} ({d['min']:,.{digits}f}-{d['max']:,.{digits}f})"

    out = ["## Engine pipeline: reference vs raw PUSH/PULL + msgspec", "",
           "| figure | reference | raw | ratio |", "| --- | ---: | ---: | ---: |"]
    out.append(f"| {REQUESTS} requests x {TOKENS} tokens, tokens/s | "
               f"{cell(result['throughput']['reference'])} | "
               f"{cell(result['throughput']['baseline'])} | {result['throughput']['ratio']:.2f} |")
    for name in ("latency_p50", "latency_p99"):
        row = result[name]
        out.append(f"| one-token latency {name[-3:]}, ms | {cell(row['reference_ms'], 3)} | "
                   f"{cell(row['baseline_ms'], 3)} | {row['ratio']:.2f} |")
    out.append(f"| 1 MiB array echo, payloads/s | {cell(result['array']['reference'], 1)} | "
               f"{cell(result['array']['baseline'], 1)} | {result['array']['ratio']:.2f} |")
    return [*out, ""]


if __name__ == "__main__":
    import json

    print(json.dumps(run(repeats=3, progress=lambda line: print(line, file=sys.stderr)),
                     indent=2))
