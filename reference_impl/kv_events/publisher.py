"""The reference KV-cache event publisher (PUB + replay ROUTER).

Shape (vLLM's ``ZmqEventPublisher``, with its known defects fixed):

- :meth:`KVEventPublisher.publish` only appends the batch to a bounded queue
  and never blocks: an engine calls it from its scheduler loop. A full queue
  sheds the *new* batch and counts it (``stats()["dropped"]``) before any
  sequence number is given, so what is published stays gap-free and in order.
- One background thread owns both sockets (ZeroMQ sockets are not
  thread-safe). It numbers batches from 0, encodes them, sends
  ``[topic, seq, payload]`` on the PUB socket and keeps the last
  ``buffer_steps`` payloads for replay. A batch that cannot be encoded is
  counted and skipped *without* consuming a sequence number.
- Replay answers follow ``replay_layout`` (:mod:`reference_impl.kv_events.wire`):
  ``[b"", seq, payload]`` (``seq-payload``, the default) or ``[b"", topic,
  seq, payload]`` (``topic-seq-payload``, vLLM 0.26 and later).
- The replay ROUTER runs with ``ZMQ_ROUTER_MANDATORY``: a reader whose pipe
  is full makes the send fail with ``EAGAIN`` instead of dropping silently,
  so its replay pauses and resumes where it stopped. A reader that makes no
  progress for ``replay_stall_timeout_ms`` is abandoned *without* the end
  marker, so it can never mistake a partial replay for a whole one. A
  requester that is gone (``EHOSTUNREACH``) is forgotten. Malformed
  requests are counted and ignored; no request can stop the thread.
- :meth:`KVEventPublisher.shutdown` publishes what is still queued, gives
  libzmq at most ``shutdown_timeout_ms`` to flush it, and releases the
  sockets, the thread, the wake-up pipe and the private context. Anything it
  could not hand to libzmq is counted in ``stats()["undelivered"]``.
  :meth:`KVEventPublisher.publish` afterwards raises
  :class:`PublisherClosedError`.

Data-parallel ranks: :func:`rank_endpoints` derives a rank's endpoints from
one configuration by a stride that cannot collide (vLLM adds the rank to
both ports, so rank 1's PUB port is rank 0's replay port).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Final

import msgspec
import zmq

from reference_impl._curve import CurveServer, ZapHandler, ZapPolicy, server_config
from reference_impl.kv_events.schema import (
    END_MARKER_SEQ,
    SEQ_BYTES,
    Encoding,
    KVEventBatch,
    encode_batch,
)
from reference_impl.kv_events.wire import REPLAY_LAYOUTS, ReplayLayout

__all__ = ["KVEventPublisher", "PublisherClosedError", "rank_endpoints"]

_log = logging.getLogger("reference_impl.kv_events")

DEFAULT_BUFFER_STEPS: Final = 10_000
DEFAULT_MAX_QUEUE: Final = 100_000
DEFAULT_SNDHWM: Final = 100_000
DEFAULT_HEARTBEAT_IVL_MS: Final = 1000
DEFAULT_HEARTBEAT_TIMEOUT_MS: Final = 3000
DEFAULT_REPLAY_STALL_TIMEOUT_MS: Final = 5000
DEFAULT_SHUTDOWN_TIMEOUT_MS: Final = 2000
#: Replay answers one job sends per loop turn, so replays never starve publishing.
_REPLAY_SLICE: Final = 512
#: Concurrent replay jobs; the oldest is abandoned (no end marker) beyond this.
_MAX_REPLAY_JOBS: Final = 256
#: Requests read per loop turn, so a flood cannot starve publishing either.
_REQUEST_SLICE: Final = 256
_MORE_NOBLOCK: Final = zmq.SNDMORE | zmq.NOBLOCK
#: How long the thread sleeps between retries of a replay stalled by EAGAIN.
_STALL_RETRY_MS: Final = 5
#: ZMQ_MAXMSGSIZE of both sockets: what peers send here (subscriptions, replay
#: requests, handshake commands) is tiny, so a frame announced larger is refused at
#: its header instead of being buffered (EVT-11).
MAX_INBOUND_FRAME_BYTES: Final = 65536


class PublisherClosedError(RuntimeError):
    """``publish()`` after ``shutdown()``."""


def rank_endpoints(endpoint: str, replay_endpoint: str, rank: int) -> tuple[str, str]:
    """The PUB and replay endpoints of data-parallel ``rank``.

    Rank 0 uses the configuration as given. Rank ``r`` adds ``r * stride`` to
    both TCP ports, ``stride`` being one more than the distance between the
    two base ports, so no rank's port equals another rank's port of either
    kind (``(a - b) * stride`` can never equal the base distance). Port 0
    (let the OS choose) stays 0; ``ipc://`` and ``inproc://`` names get a
    ``-dpN`` suffix.

    Raises:
        ValueError: a negative rank, equal TCP ports, or a derived port
            above 65535.
    """
    if rank < 0:
        raise ValueError(f"data_parallel_rank must be >= 0, got {rank}")
    if rank == 0:
        return endpoint, replay_endpoint
    pub_port = _tcp_port(endpoint)
    replay_port = _tcp_port(replay_endpoint)
    stride = abs(replay_port - pub_port) + 1 if pub_port and replay_port else 1
    if pub_port and pub_port == replay_port:
        raise ValueError(f"endpoint and replay_endpoint share port {pub_port}")
    return _offset(endpoint, rank, stride), _offset(replay_endpoint, rank, stride)


def _tcp_port(endpoint: str) -> int:
    if not endpoint.startswith("tcp://"):
        return 0
    port = endpoint.rpartition(":")[2]
    if not port.isdigit():
        return 0  # "*" or a service name: nothing to offset
    return int(port)


def _offset(endpoint: str, rank: int, stride: int) -> str:
    if not endpoint.startswith("tcp://"):
        return f"{endpoint}-dp{rank}"
    base = endpoint.rpartition(":")[0]
    port = _tcp_port(endpoint)
    if port == 0:
        return endpoint
    derived = port + rank * stride
    if derived > 65535:
        raise ValueError(f"rank {rank} of {endpoint!r} needs port {derived} > 65535")
    return f"{base}:{derived}"


@dataclass
class _ReplayJob:
    """One requester's replay in progress: what is left to send, and since when stalled."""

    identity: bytes
    pending: deque[tuple[bytes, bytes]]
    last_progress: float
    done: bool = False


@dataclass
class _Counters:
    published: int = 0
    dropped: int = 0
    encode_errors: int = 0
    replays_served: int = 0
    replays_abandoned: int = 0
    bad_requests: int = 0
    thread_errors: int = 0
    undelivered: int = 0


class KVEventPublisher:
    """PUB + replay ROUTER publisher of :class:`KVEventBatch` (see the module docstring).

    Args:
        endpoint: where the PUB socket binds (``tcp://127.0.0.1:5557``).
        replay_endpoint: where the replay ROUTER binds.
        topic: the first frame of every PUB message (``""``: empty frame).
        encoding: ``"map"``, ``"array"`` or ``"array-map"`` payloads.
        replay_layout: ``"seq-payload"`` or ``"topic-seq-payload"`` replay answers.
        buffer_steps: batches kept for replay.
        max_queue: batches ``publish()`` may queue before it sheds.
        data_parallel_rank: this publisher's rank. ``None`` (default): bind
            the endpoints as given and leave batches as they are. A number:
            bind :func:`rank_endpoints` and stamp batches whose
            ``data_parallel_rank`` is ``None`` with it (on a copy).
        sndhwm: the PUB socket's high-water mark per subscriber (0: no limit).
        heartbeat_ivl_ms / heartbeat_timeout_ms: ZMTP heartbeats on both
            sockets, so a silently partitioned peer is dropped and its
            queue freed. 0 disables them.
        replay_stall_timeout_ms: how long a replay reader may make no
            progress before its replay is abandoned without end marker.
        shutdown_timeout_ms: the bound on :meth:`shutdown`.
        curve_server_secret_key, curve_allowed_client_keys, curve_zap_handler:
            CURVE, off by default (see :mod:`reference_impl._curve`): both
            the PUB and the replay ROUTER become CURVE servers that let in
            only the allowed client keys (or whom the handler allows); the
            publisher's thread answers the ZAP requests.

    Raises:
        ValueError: a bad option (a CURVE key that does not fit), naming it.
        zmq.ZMQError: an endpoint could not be bound; nothing is left open.
    """

    #: What this publisher declares to the conformance suite.
    zmq_conformance_capabilities: Final = {
        "encoding": "map",
        "wire": "seq-payload",
        "buffer_steps": DEFAULT_BUFFER_STEPS,
        "data_parallel": True,
        "heartbeat_configurable": True,
        "authentication": True,
    }

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str,
        *,
        topic: str = "",
        encoding: Encoding = "map",
        replay_layout: ReplayLayout = "seq-payload",
        buffer_steps: int = DEFAULT_BUFFER_STEPS,
        max_queue: int = DEFAULT_MAX_QUEUE,
        data_parallel_rank: int | None = None,
        sndhwm: int = DEFAULT_SNDHWM,
        heartbeat_ivl_ms: int = DEFAULT_HEARTBEAT_IVL_MS,
        heartbeat_timeout_ms: int = DEFAULT_HEARTBEAT_TIMEOUT_MS,
        replay_stall_timeout_ms: int = DEFAULT_REPLAY_STALL_TIMEOUT_MS,
        shutdown_timeout_ms: int = DEFAULT_SHUTDOWN_TIMEOUT_MS,
        curve_server_secret_key: str | bytes | None = None,
        curve_allowed_client_keys: Collection[str | bytes] | None = None,
        curve_zap_handler: ZapPolicy | None = None,
    ) -> None:
        self._curve: CurveServer | None = server_config(
            curve_server_secret_key, curve_allowed_client_keys, curve_zap_handler)
        if encoding not in ("map", "array", "array-map"):
            raise ValueError(
                f"encoding must be 'map', 'array' or 'array-map', not {encoding!r}")
        if replay_layout not in REPLAY_LAYOUTS:
            raise ValueError(f"replay_layout must be one of {', '.join(REPLAY_LAYOUTS)}, "
                             f"not {replay_layout!r}")
        for name, value in (
            ("buffer_steps", buffer_steps),
            ("max_queue", max_queue),
            ("replay_stall_timeout_ms", replay_stall_timeout_ms),
            ("shutdown_timeout_ms", shutdown_timeout_ms),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if sndhwm < 0:
            raise ValueError(f"sndhwm must be >= 0 (0: no limit), got {sndhwm}")
        if heartbeat_ivl_ms < 0 or heartbeat_timeout_ms < 0:
            raise ValueError("heartbeat_ivl_ms and heartbeat_timeout_ms must be >= 0")
        if data_parallel_rank is not None:
            endpoint, replay_endpoint = rank_endpoints(
                endpoint, replay_endpoint, data_parallel_rank
            )
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic
        self.encoding: Encoding = encoding
        self.replay_layout: ReplayLayout = replay_layout
        #: Frames between the delimiter and the seq of a replay answer (the topic, or
        #: none), and of the end marker (an empty topic, or none).
        self._replay_prefix: tuple[bytes, ...] = (
            (topic.encode(),) if replay_layout == "topic-seq-payload" else ())
        self._end_prefix: tuple[bytes, ...] = (b"",) * len(self._replay_prefix)
        self.buffer_steps = buffer_steps
        self.max_queue = max_queue
        self.data_parallel_rank = data_parallel_rank
        self._topic = topic.encode()
        self._stall_timeout_s = replay_stall_timeout_ms / 1000
        self._shutdown_timeout_s = shutdown_timeout_ms / 1000

        self._queue: deque[KVEventBatch] = deque()
        #: (seq frame, payload) of the last ``buffer_steps`` batches, oldest first.
        self._buffer: deque[tuple[bytes, bytes]] = deque(maxlen=buffer_steps)
        self._counters = _Counters()
        self._closed = False
        self._stopping = False
        self._idle = False
        self._next_seq = 0
        self._encode: Callable[[KVEventBatch], bytes] = (
            msgspec.msgpack.Encoder().encode if encoding == "map"
            else functools.partial(encode_batch, encoding=encoding)
        )

        self._ctx = zmq.Context()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._zap: ZapHandler | None = None
        try:
            if self._curve is not None:
                self._zap = ZapHandler(self._ctx, self._curve.policy)
            self._pub = self._socket(zmq.PUB, heartbeat_ivl_ms, heartbeat_timeout_ms)
            self._pub.setsockopt(zmq.SNDHWM, sndhwm)
            self._pub.bind(endpoint)
            self._router = self._socket(zmq.ROUTER, heartbeat_ivl_ms, heartbeat_timeout_ms)
            self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)
            self._router.bind(replay_endpoint)
        except BaseException:
            self._ctx.destroy(linger=0)
            os.close(self._wake_r)
            os.close(self._wake_w)
            raise
        self._thread = threading.Thread(
            target=self._run, name=f"kv-events-publisher {endpoint}", daemon=True
        )
        self._thread.start()

    def _socket(self, kind: int, ivl_ms: int, timeout_ms: int) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_INBOUND_FRAME_BYTES)
        self._secure(sock)
        if ivl_ms:
            sock.setsockopt(zmq.HEARTBEAT_IVL, ivl_ms)
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, timeout_ms or ivl_ms)
            sock.setsockopt(zmq.HEARTBEAT_TTL, min(timeout_ms or ivl_ms, 6_553_500))
        return sock

    def _secure(self, sock: zmq.Socket[bytes]) -> None:
        """CURVE server options on a socket about to bind (a no-op when CURVE is off)."""
        if self._curve is not None:
            self._curve.apply(sock)

    # -- the interface --------------------------------------------------------

    def publish(self, batch: KVEventBatch) -> None:
        """Queue ``batch`` for publishing; never blocks.

        A full queue sheds ``batch`` and counts it in ``stats()["dropped"]``.

        Raises:
            PublisherClosedError: after :meth:`shutdown`.
            TypeError: ``batch`` is not a :class:`KVEventBatch`.
        """
        if self._closed:
            raise PublisherClosedError("publish() after shutdown()")
        if type(batch) is not KVEventBatch and not isinstance(batch, KVEventBatch):
            raise TypeError(f"publish() takes a KVEventBatch, not {type(batch).__name__}")
        queue = self._queue
        if len(queue) >= self.max_queue:
            self._counters.dropped += 1
            if self._counters.dropped == 1 or self._counters.dropped % 10_000 == 0:
                _log.warning("publish queue full (%d): %d batches shed so far",
                             self.max_queue, self._counters.dropped)
            return
        queue.append(batch)
        if self._idle:
            self._wake()

    def shutdown(self) -> None:
        """Publish what is queued, then release everything, within ``shutdown_timeout_ms``.

        Idempotent. Batches that could not be published in time are counted in
        ``stats()["undelivered"]`` and logged.
        """
        if self._closed:
            return
        self._closed = True
        self._stopping = True
        self._wake()
        self._thread.join(self._shutdown_timeout_s + 1.0)
        if self._thread.is_alive():  # pragma: no cover - every call in the thread is non-blocking
            _log.error("publisher thread did not stop; its sockets stay open")
            return
        self._ctx.term()
        os.close(self._wake_r)
        os.close(self._wake_w)
        if self._counters.undelivered:
            _log.warning("shutdown: %d queued batches were not published",
                         self._counters.undelivered)

    # -- extras -----------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Counters: ``published``, ``dropped`` (shed by a full queue),
        ``encode_errors``, ``replays_served``, ``replays_abandoned`` (stalled
        readers, no end marker), ``bad_requests``, ``thread_errors``,
        ``undelivered`` (left queued at shutdown), ``queued``, ``retained``."""
        c = self._counters
        return {
            "published": c.published,
            "dropped": c.dropped,
            "encode_errors": c.encode_errors,
            "replays_served": c.replays_served,
            "replays_abandoned": c.replays_abandoned,
            "bad_requests": c.bad_requests,
            "thread_errors": c.thread_errors,
            "undelivered": c.undelivered,
            "queued": len(self._queue),
            "retained": len(self._buffer),
        }

    def __enter__(self) -> KVEventPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<KVEventPublisher {self.endpoint} replay {self.replay_endpoint} {state}>"

    # -- the thread -------------------------------------------------------------

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"\x01")

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        zap = self._zap
        if zap is not None:
            poller.register(zap.socket, zmq.POLLIN)
        jobs: dict[bytes, _ReplayJob] = {}
        try:
            while True:
                try:
                    if zap is not None:
                        zap.serve()
                    self._publish_queued()
                    if self._stopping:
                        break
                    self._read_requests(jobs)
                    timeout = self._serve_replays(jobs)
                    if timeout == 0:
                        continue
                    self._idle = True
                    if self._queue or self._stopping:
                        self._idle = False
                        continue
                    events = dict(poller.poll(timeout))
                    self._idle = False
                    if self._wake_r in events:
                        with contextlib.suppress(BlockingIOError):
                            os.read(self._wake_r, 4096)
                except Exception:
                    self._counters.thread_errors += 1
                    _log.exception("kv-events publisher thread: unexpected error (continuing)")
                    time.sleep(0.001)
        finally:
            self._finish(jobs)

    def _publish_queued(self) -> None:
        """Number, encode, send and retain every queued batch (the hot path)."""
        queue = self._queue
        if not queue:
            return
        popleft, send, retain = queue.popleft, self._pub.send, self._buffer.append
        topic, rank, encode = self._topic, self.data_parallel_rank, self._encode
        seq = self._next_seq
        try:
            while queue:
                batch = popleft()
                if rank is not None and batch.data_parallel_rank is None:
                    batch = msgspec.structs.replace(batch, data_parallel_rank=rank)
                try:
                    payload = encode(batch)
                except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
                    self._counters.encode_errors += 1  # no seq is used up: no gap
                    _log.error("batch not published, it cannot be encoded: %s", exc)
                    continue
                seq_frame = seq.to_bytes(SEQ_BYTES, "big")
                send(topic, zmq.SNDMORE)
                send(seq_frame, zmq.SNDMORE)
                send(payload, 0, len(payload) < 65536)
                retain((seq_frame, payload))
                seq += 1
        finally:
            self._counters.published += seq - self._next_seq
            self._next_seq = seq

    def _read_requests(self, jobs: dict[bytes, _ReplayJob]) -> None:
        router = self._router
        for _ in range(_REQUEST_SLICE):
            try:
                frames = router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != SEQ_BYTES:
                self._counters.bad_requests += 1
                continue
            identity = frames[0]
            start = int.from_bytes(frames[2], "big")
            jobs.pop(identity, None)  # a new request from the same socket replaces its last
            if len(jobs) >= _MAX_REPLAY_JOBS:
                oldest = next(iter(jobs))
                del jobs[oldest]
                self._counters.replays_abandoned += 1
            jobs[identity] = _ReplayJob(identity, self._retained_from(start), time.monotonic())

    def _retained_from(self, start: int) -> deque[tuple[bytes, bytes]]:
        buffer = self._buffer
        if not buffer:
            return deque()
        first = int.from_bytes(buffer[0][0], "big")
        skip = max(0, start - first)
        if skip >= len(buffer):
            return deque()
        return deque(itertools.islice(buffer, skip, None))

    def _serve_replays(self, jobs: dict[bytes, _ReplayJob]) -> int | None:
        """Send a slice of every job; return how long the thread may sleep (ms).

        0: some job has more to send now; ``_STALL_RETRY_MS``: some job waits
        for its reader; ``None``: no job left.
        """
        timeout: int | None = None
        now = time.monotonic()
        send = self._router.send
        prefix, end = self._replay_prefix, self._end_prefix
        for identity in list(jobs):
            job = jobs[identity]
            sent = 0
            try:
                pending = job.pending
                while pending and sent < _REPLAY_SLICE:
                    seq_frame, payload = pending[0]
                    # With ROUTER_MANDATORY only the first frame can fail (EAGAIN,
                    # EHOSTUNREACH); once it is accepted the message goes out whole.
                    send(identity, _MORE_NOBLOCK)
                    send(b"", _MORE_NOBLOCK)
                    for frame in prefix:
                        send(frame, _MORE_NOBLOCK)
                    send(seq_frame, _MORE_NOBLOCK)
                    send(payload, zmq.NOBLOCK, len(payload) < 65536)
                    pending.popleft()
                    sent += 1
                if not job.pending and sent < _REPLAY_SLICE:
                    self._router.send_multipart((identity, b"", *end, END_MARKER_SEQ, b""),
                                                zmq.NOBLOCK)
                    del jobs[identity]
                    self._counters.replays_served += 1
                    continue
            except zmq.Again:
                pass  # the reader's pipe is full: resume later, never skip
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EHOSTUNREACH:
                    raise
                del jobs[identity]  # the requester is gone
                self._counters.replays_abandoned += 1
                continue
            if sent == _REPLAY_SLICE:
                job.last_progress = now
                timeout = 0
                continue
            if sent:
                job.last_progress = now
            elif now - job.last_progress > self._stall_timeout_s:
                del jobs[identity]  # no end marker: the reader knows it is incomplete
                self._counters.replays_abandoned += 1
                _log.warning("replay to a reader stalled for %.1f s abandoned",
                             self._stall_timeout_s)
                continue
            if timeout is None:
                timeout = _STALL_RETRY_MS
        return timeout

    def _finish(self, jobs: dict[bytes, _ReplayJob]) -> None:
        """In the thread: publish what is left, flush for a bounded time, close."""
        with contextlib.suppress(Exception):
            self._publish_queued()
        self._counters.undelivered += len(self._queue)
        self._queue.clear()
        self._counters.replays_abandoned += len(jobs)
        jobs.clear()
        self._router.close(linger=0)
        if self._zap is not None:
            self._zap.close()
        # Give libzmq a bounded time to write what the PUB socket still holds.
        self._pub.close(linger=int(self._shutdown_timeout_s * 1000))
