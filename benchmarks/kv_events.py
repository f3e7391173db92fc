"""KV-event stream: the reference publisher and subscriber vs raw pyzmq + msgspec loops.

- **Publisher throughput.** One process publishes ``count`` batches of about
  64 B (one ``BlockRemoved``) or 4 KiB (one ``BlockStored`` with its
  tokens), encoded, another counts them on a SUB socket until the
  last one. ``reference``: :class:`KVEventPublisher` (``publish()`` queues,
  its thread numbers, encodes, sends and retains). ``baseline``: the same
  process encodes with msgspec and sends ``[topic, seq, payload]`` on a PUB
  socket in a plain loop, nothing retained. High-water marks are unlimited
  on both sides, so nothing is dropped and the time is the publisher's.
- **Replay.** A reader asks the reference publisher for 10,000 retained
  batches and reads until the end marker.
- **Subscriber throughput.** A raw PUB process sends ``count`` batches; the
  receiving process is the reference :class:`KVEventSubscriber` (decode,
  order, dedup, deliver) or a baseline SUB + msgspec decode loop.

Processes are spawned (no ZeroMQ state crosses a fork); times are
``perf_counter`` (CLOCK_MONOTONIC), comparable across processes.
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import time
from collections.abc import Callable
from multiprocessing.queues import Queue
from typing import Any

import msgspec
import zmq

from benchmarks._stats import Spread

KINDS = ("reference", "baseline")
SIZES = {"64 B": 64, "4 KiB": 4096}
COUNTS = {64: 100_000, 4096: 30_000}
REPLAY_BATCHES = 10_000
_TOPIC = "kv"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_TOKENS: dict[int, list[int]] = {}


def batch_of_size(size: int, index: int = 0) -> Any:
    """A KVEventBatch whose map encoding is ``size`` bytes or just over.

    Batches of one size share their token list (read-only), so a trial's
    batches cost the memory of their structs, not of 30,000 token lists.
    """
    from reference_impl.kv_events.schema import (
        BlockRemoved,
        BlockStored,
        KVEventBatch,
        encode_batch,
    )

    def make(tokens: list[int]) -> Any:
        if size < 128:  # a BlockStored alone is over 100 bytes in map form
            return KVEventBatch(float(index), [BlockRemoved([index, *tokens], "GPU")])
        return KVEventBatch(float(index), [BlockStored([index], None, tokens, 16, None, "GPU")])

    tokens = _TOKENS.get(size)
    if tokens is None:
        tokens = []
        while len(encode_batch(make(tokens))) < size:
            tokens.append(20_000 + len(tokens))
        _TOKENS[size] = tokens
    return make(tokens)


# -- publisher throughput ----------------------------------------------------------


def _pub_sink(port: int, final: bytes, ready: Any, finished: Any, out: Queue[Any]) -> None:
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{port}")
    sub.recv_multipart()  # a warm-up batch: the subscription is in place
    ready.set()
    while sub.poll(30_000):
        frames = sub.recv_multipart()
        if frames[2] == final:
            out.put(time.perf_counter())
            break
    else:
        out.put(None)  # the final batch never came
    finished.set()
    ctx.destroy(linger=0)


def _publisher(kind: str, port: int, size: int, count: int, ready: Any, go: Any,
               finished: Any, out: Queue[Any]) -> None:
    from reference_impl.kv_events.publisher import KVEventPublisher

    batches = [batch_of_size(size, i) for i in range(count)]
    final = batch_of_size(size, -1)
    batches.append(final)
    endpoint = f"tcp://127.0.0.1:{port}"
    if kind == "reference":
        pub = KVEventPublisher(endpoint, f"tcp://127.0.0.1:{_free_port()}", topic=_TOPIC,
                               sndhwm=0, max_queue=count + 10, buffer_steps=10_000)
        while not ready.wait(0.01):
            pub.publish(batch_of_size(size, -2))
        go.wait(60)
        started = time.perf_counter()
        for batch in batches:
            pub.publish(batch)
        out.put(started)
        finished.wait(300)  # closing earlier would drop what libzmq still holds
        pub.shutdown()
        return
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUB)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.bind(endpoint)
    encoder = msgspec.msgpack.Encoder()
    topic = _TOPIC.encode()
    seq = 0
    while not ready.wait(0.01):
        sock.send_multipart([topic, seq.to_bytes(8, "big"), encoder.encode(batches[0])])
        seq += 1
    go.wait(60)
    started = time.perf_counter()
    for batch in batches:
        sock.send_multipart([topic, seq.to_bytes(8, "big"), encoder.encode(batch)])
        seq += 1
    out.put(started)
    finished.wait(300)
    ctx.destroy(linger=0)


def publisher_throughput(kind: str, size: int, count: int | None = None) -> float:
    """Batches per second from the first ``publish()`` to the last batch received."""
    from reference_impl.kv_events.schema import encode_batch

    count = count or COUNTS[size]
    ctx = mp.get_context("spawn")
    ready, go, finished = ctx.Event(), ctx.Event(), ctx.Event()
    started_q: Queue[Any] = ctx.Queue()
    done_q: Queue[Any] = ctx.Queue()
    port = _free_port()
    final = encode_batch(batch_of_size(size, -1))
    publisher = ctx.Process(target=_publisher,
                            args=(kind, port, size, count, ready, go, finished, started_q))
    sink = ctx.Process(target=_pub_sink, args=(port, final, ready, finished, done_q))
    publisher.start()
    sink.start()
    ready.wait(60)
    time.sleep(0.2)  # warm-up batches in flight drain
    go.set()
    started = started_q.get(timeout=300)
    done = done_q.get(timeout=300)
    publisher.join(60)
    sink.join(60)
    if done is None:
        raise RuntimeError(f"{kind} publisher: the last batch never reached the subscriber")
    return float((count + 1) / (done - started))


# -- replay ------------------------------------------------------------------------------


def replay_seconds(size: int = 64, batches: int = REPLAY_BATCHES) -> float:
    """Seconds from a replay request for ``batches`` retained batches to its end marker."""
    from reference_impl.kv_events.publisher import KVEventPublisher
    from reference_impl.kv_events.schema import is_end_marker, replay_request

    pub_ep, replay_ep = (f"tcp://127.0.0.1:{_free_port()}" for _ in range(2))
    with KVEventPublisher(pub_ep, replay_ep, buffer_steps=batches) as pub:
        batch = batch_of_size(size)
        for _ in range(batches):
            pub.publish(batch)
        while pub.stats()["published"] < batches:
            time.sleep(0.001)
        ctx = zmq.Context()
        try:
            dealer = ctx.socket(zmq.DEALER)
            dealer.connect(replay_ep)
            started = time.perf_counter()
            dealer.send_multipart(replay_request(0))
            received = 0
            while True:
                frames = dealer.recv_multipart()
                if is_end_marker(frames[1]):
                    break
                received += 1
            elapsed = time.perf_counter() - started
        finally:
            ctx.destroy(linger=0)
    if received != batches:
        raise RuntimeError(f"replay returned {received} of {batches} batches")
    return elapsed


# -- subscriber throughput ------------------------------------------------------------


def _raw_publisher(port: int, size: int, count: int, ready: Any, go: Any,
                   finished: Any) -> None:
    from reference_impl.kv_events.schema import encode_batch

    ctx = zmq.Context()
    sock = ctx.socket(zmq.XPUB)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.bind(f"tcp://127.0.0.1:{port}")
    sock.recv()  # the subscription
    payloads = [encode_batch(batch_of_size(size, i)) for i in range(count)]
    topic = _TOPIC.encode()
    ready.set()
    go.wait(60)
    for seq, payload in enumerate(payloads):
        sock.send_multipart([topic, seq.to_bytes(8, "big"), payload])
    finished.wait(300)
    ctx.destroy(linger=0)


def subscriber_throughput(kind: str, size: int, count: int | None = None) -> float:
    """Batches per second delivered (decoded) by the subscriber, in this process."""
    from reference_impl.kv_events.schema import KVEventBatch
    from reference_impl.kv_events.subscriber import KVEventSubscriber

    count = count or COUNTS[size]
    ctx = mp.get_context("spawn")
    ready, go, finished = ctx.Event(), ctx.Event(), ctx.Event()
    port = _free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    proc = ctx.Process(target=_raw_publisher, args=(port, size, count, ready, go, finished))
    proc.start()
    received = 0
    if kind == "reference":
        sub = KVEventSubscriber(endpoint, f"tcp://127.0.0.1:{_free_port()}", topic=_TOPIC,
                                rcvhwm=0, resync_idle_ms=0)
        ready.wait(60)
        go.set()
        started = time.perf_counter()
        while received < count:
            received += len(sub.poll(100))
        elapsed = time.perf_counter() - started
        sub.close()
        finished.set()
    else:
        zctx = zmq.Context()
        sock = zctx.socket(zmq.SUB)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.SUBSCRIBE, _TOPIC.encode())
        sock.connect(endpoint)
        decoder = msgspec.msgpack.Decoder(KVEventBatch)
        ready.wait(60)
        go.set()
        started = time.perf_counter()
        while received < count:
            _topic, seq, payload = sock.recv_multipart()
            # The least a KV subscriber does: read the sequence number (gap
            # detection needs it) and decode; the reference does both too.
            int.from_bytes(seq, "big")
            decoder.decode(payload)
            received += 1
        elapsed = time.perf_counter() - started
        zctx.destroy(linger=0)
    finished.set()
    proc.join(60)
    return count / elapsed


# -- the section -----------------------------------------------------------------------


def run(repeats: int = 3, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Every KV-event figure; ratios are computed within this one run."""
    results: dict[str, Any] = {"publisher": {}, "subscriber": {}}
    for section, measure in (("publisher", publisher_throughput),
                             ("subscriber", subscriber_throughput)):
        for label, size in SIZES.items():
            row: dict[str, Any] = {}
            for kind in KINDS:
                trials = [measure(kind, size) for _ in range(repeats)]
                row[kind] = {"batches_per_s": Spread.of(trials).as_dict()}
                progress(f"{section} {label} {kind}: {Spread.of(trials).median:,.0f} batches/s")
            row["ratio"] = (row["reference"]["batches_per_s"]["median"]
                            / row["baseline"]["batches_per_s"]["median"])
            results[section][label] = row
    replays = [replay_seconds() for _ in range(repeats)]
    results["replay"] = {"batches": REPLAY_BATCHES, "size": 64,
                         "seconds": Spread.of(replays).as_dict()}
    progress(f"replay of {REPLAY_BATCHES} batches: {Spread.of(replays).median:.3f} s")
    return results
