"""Mutant publishers: the reference publisher with one real-world defect each.

Every class differs from
:class:`reference_impl.kv_events.publisher.KVEventPublisher` by one defect
seen in KV-event publishers (most of them in vLLM's ``ZmqEventPublisher`` or
its forks), marked ``# MUTATION``; :data:`CATALOG` names the clause whose
test must fail against each. ``zmq-conformance self-check --contract
kv-events-publisher`` runs them; ``tests/test_kv_publisher_contract.py``
checks each is killed by its clause.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Final

import msgspec
import zmq

from conformance.selfcheck.mutants import Mutant
from reference_impl.kv_events.publisher import KVEventPublisher, _ReplayJob
from reference_impl.kv_events.schema import END_MARKER_SEQ, KVEventBatch, encode_batch, encode_seq

__all__ = ["CATALOG"]

_log = logging.getLogger("conformance.contracts.kv_events.publisher.mutants")
_REPLAY_SLICE: Final = 512


class SeqFromOne(KVEventPublisher):
    """Numbers batches from 1 (a counter incremented before use)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._next_seq = 1  # MUTATION: the first batch gets seq 1


class SkipsSeqOnEncodeError(KVEventPublisher):
    """Takes the batch's sequence number before encoding it: a batch that cannot be
    encoded leaves a gap every subscriber reads as a loss."""

    def _publish_queued(self) -> None:
        while self._queue:
            batch = self._queue.popleft()
            seq = self._next_seq
            self._next_seq += 1  # MUTATION: consumed before the encode can fail
            try:
                payload = encode_batch(batch, self.encoding)
            except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
                self._counters.encode_errors += 1
                continue
            seq_frame = encode_seq(seq)
            self._pub.send_multipart((self._topic, seq_frame, payload))
            self._buffer.append((seq_frame, payload))
            self._counters.published += 1


class PublishesNewestFirst(KVEventPublisher):
    """Takes queued batches from the wrong end of its deque: whenever more than one is
    waiting, subscribers get them newest first (seqs still count up)."""

    def _publish_queued(self) -> None:
        while self._queue:
            batch = self._queue.pop()  # MUTATION: popleft() keeps the publish order
            payload = encode_batch(batch, self.encoding)
            seq_frame = encode_seq(self._next_seq)
            self._next_seq += 1
            self._pub.send_multipart((self._topic, seq_frame, payload))
            self._buffer.append((seq_frame, payload))
            self._counters.published += 1


class BlockingPublish(KVEventPublisher):
    """``publish()`` waits for room when the queue is full (``queue.Queue.put``):
    the engine's scheduler loop runs at the publisher thread's pace."""

    def publish(self, batch: KVEventBatch) -> None:
        while len(self._queue) >= self.max_queue and not self._closed:
            self._wake()
            time.sleep(0.0005)  # MUTATION: waits instead of shedding
        super().publish(batch)


class ReplayOffByOne(KVEventPublisher):
    """Replays from ``start + 1``: the batch the subscriber asked for first is missing."""

    def _retained_from(self, start: int) -> Any:
        return super()._retained_from(start + 1)  # MUTATION


class _ReplayVariant(KVEventPublisher):
    """The reference's replay serving with two knobs the mutants below turn."""

    #: The end marker's seq frame; ``None``: no end marker at all.
    end_marker: bytes | None = END_MARKER_SEQ
    #: Drop an answer the reader's pipe has no room for (a ROUTER without
    #: ``ZMQ_ROUTER_MANDATORY``) instead of pausing the replay.
    drop_when_full: bool = False

    def _serve_replays(self, jobs: dict[bytes, _ReplayJob]) -> int | None:
        timeout: int | None = None
        for identity in list(jobs):
            job = jobs[identity]
            sent = 0
            try:
                while job.pending and sent < _REPLAY_SLICE:
                    seq_frame, payload = job.pending[0]
                    try:
                        self._router.send_multipart((identity, b"", seq_frame, payload),
                                                    zmq.NOBLOCK)
                    except zmq.Again:
                        if not self.drop_when_full:
                            raise
                    job.pending.popleft()
                    sent += 1
                if not job.pending and sent < _REPLAY_SLICE:
                    if self.end_marker is not None:  # retried until the pipe has room
                        self._router.send_multipart((identity, b"", self.end_marker, b""),
                                                    zmq.NOBLOCK)
                    del jobs[identity]
                    continue
            except zmq.Again:
                pass
            except zmq.ZMQError:
                del jobs[identity]
                continue
            if sent == _REPLAY_SLICE:
                timeout = 0
            elif timeout is None:
                timeout = 5
        return timeout


class NoEndMarker(_ReplayVariant):
    """Never sends the end marker: a consumer cannot tell a replay is complete."""

    end_marker = None  # MUTATION


class UnsignedEndMarker(_ReplayVariant):
    """Writes the end marker as -1 packed unsigned into 32 bits (``0x00000000ffffffff``):
    a consumer reading a signed 8-byte seq sees 4294967295, not -1."""

    end_marker = (2**32 - 1).to_bytes(8, "big")  # MUTATION


class ReplayTruncatedAtHwm(_ReplayVariant):
    """Answers the reader's pipe has no room for are dropped (as a ROUTER without
    ``ZMQ_ROUTER_MANDATORY`` drops them), but the end marker is retried until it goes
    through: the reader is told a truncated replay is complete."""

    drop_when_full = True  # MUTATION


class HostileRequestKillsThread(KVEventPublisher):
    """Unpacks a replay request without checking it, in a thread loop without a
    catch-all: one malformed request ends publishing for good."""

    def _read_requests(self, jobs: dict[bytes, _ReplayJob]) -> None:
        while True:
            try:
                frames = self._router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            identity, _empty, seq_frame = frames  # MUTATION: ValueError on a bad frame count
            if len(seq_frame) != 8:
                raise ValueError(f"seq frame of {len(seq_frame)} bytes")  # MUTATION
            start = int.from_bytes(seq_frame, "big", signed=True)
            jobs[identity] = _ReplayJob(identity, self._retained_from(start), time.monotonic())

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        jobs: dict[bytes, _ReplayJob] = {}
        try:
            while not self._stopping:  # MUTATION: no try/except around one turn
                self._publish_queued()
                self._read_requests(jobs)
                timeout = self._serve_replays(jobs)
                if timeout == 0 or self._queue:
                    continue
                self._idle = True
                if not self._queue and not self._stopping:
                    poller.poll(timeout if timeout is not None else 50)
                self._idle = False
        except Exception:
            _log.exception("publisher thread died")
            return  # the sockets stay open; publish() keeps queueing into the void
        finally:
            if self._stopping:
                self._finish(jobs)


class ShutdownDropsQueue(KVEventPublisher):
    """``shutdown()`` discards what is still queued, silently."""

    def shutdown(self) -> None:
        self._queue.clear()  # MUTATION: neither published nor counted
        super().shutdown()


class RankEndpointsCollide(KVEventPublisher):
    """Derives a rank's endpoints as vLLM does, adding the rank to both ports: rank 1's
    PUB port is rank 0's replay port."""

    def __init__(self, endpoint: str, replay_endpoint: str, *, topic: str = "",
                 data_parallel_rank: int | None = None, **kwargs: Any) -> None:
        if data_parallel_rank:
            endpoint = _plus(endpoint, data_parallel_rank)  # MUTATION
            replay_endpoint = _plus(replay_endpoint, data_parallel_rank)  # MUTATION
        super().__init__(endpoint, replay_endpoint, topic=topic, **kwargs)
        self.data_parallel_rank = data_parallel_rank


class OmitsNullMedium(KVEventPublisher):
    """Leaves ``medium`` out of an event when it is ``None`` (a struct whose required
    field got a ``None`` default, with ``omit_defaults``): a consumer of the declared
    schema, where ``medium`` is required, cannot decode those events."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._encode = _encode_without_null_medium  # MUTATION


def _encode_without_null_medium(batch: KVEventBatch) -> bytes:
    data = msgspec.to_builtins(batch, builtin_types=(bytes,))
    for event in data["events"]:
        if "medium" in event and event["medium"] is None:
            del event["medium"]  # MUTATION: a required field left out
    return msgspec.msgpack.encode(data)


_TOPIC_LAYOUT: Final = {**KVEventPublisher.zmq_conformance_capabilities,
                        "wire": "topic-seq-payload"}


class ReplayTopicFrameEmpty(KVEventPublisher):
    """Declares the ``topic-seq-payload`` layout but answers replays with an empty
    topic frame (the replay buffer never stored the topic): a consumer that routes
    replayed batches by topic cannot."""

    zmq_conformance_capabilities = _TOPIC_LAYOUT  # type: ignore[misc]

    def __init__(self, endpoint: str, replay_endpoint: str, *,
                 replay_layout: Any = "topic-seq-payload", **kwargs: Any) -> None:
        super().__init__(endpoint, replay_endpoint, replay_layout=replay_layout, **kwargs)
        if self._replay_prefix:
            self._replay_prefix = (b"",)  # MUTATION: the topic frame is empty


class EndMarkerOldLayout(KVEventPublisher):
    """Declares the ``topic-seq-payload`` layout but ends replays with the old
    layout's end marker ``[b"", -1, b""]``: a consumer reading three frames after
    the delimiter never sees the end of its replay."""

    zmq_conformance_capabilities = _TOPIC_LAYOUT  # type: ignore[misc]

    def __init__(self, endpoint: str, replay_endpoint: str, *,
                 replay_layout: Any = "topic-seq-payload", **kwargs: Any) -> None:
        super().__init__(endpoint, replay_endpoint, replay_layout=replay_layout, **kwargs)
        self._end_prefix = ()  # MUTATION: no empty topic frame in the end marker


def _plus(endpoint: str, offset: int) -> str:
    base, _, port = endpoint.rpartition(":")
    return f"{base}:{int(port) + offset}"


_BASE: Final = "reference_impl.kv_events.publisher:KVEventPublisher"
class CurvePubOnly(KVEventPublisher):
    """CURVE server options on the PUB socket only: the replay ROUTER stays plain, so any
    stranger replays the whole retained stream (and a CURVE replay client is refused)."""

    def _socket(self, kind: int, ivl_ms: int, timeout_ms: int) -> zmq.Socket[bytes]:
        sock = super()._socket(kind, ivl_ms, timeout_ms)
        if kind == zmq.ROUTER:
            sock.setsockopt(zmq.CURVE_SERVER, 0)  # MUTATION: the replay ROUTER is plain
        return sock


class NoReceiveLimit(KVEventPublisher):
    """No ZMQ_MAXMSGSIZE on its sockets (vLLM's publisher sets none): a raw peer that
    announces a huge frame makes libzmq buffer every byte it sends."""

    def _socket(self, kind: int, ivl_ms: int, timeout_ms: int) -> zmq.Socket[bytes]:
        sock = super()._socket(kind, ivl_ms, timeout_ms)
        sock.setsockopt(zmq.MAXMSGSIZE, -1)  # MUTATION: no receive limit
        return sock


_M: Final = "conformance.contracts.kv_events.publisher.mutants"


def _m(name: str, cls: str, description: str, *clauses: str) -> Mutant:
    return Mutant(name, f"{_M}:{cls}", description, name, tuple(clauses), base=_BASE)


#: The ``kv-events-publisher`` self-check catalog.
CATALOG: Final[tuple[Mutant, ...]] = (
    _m("evt_seq_from_one", "SeqFromOne", "numbers batches from 1", "EVT-1"),
    _m("evt_skips_seq_on_encode_error", "SkipsSeqOnEncodeError",
       "a batch that cannot be encoded consumes a seq: a gap", "EVT-1"),
    _m("evt_publishes_newest_first", "PublishesNewestFirst",
       "queued batches go out newest first", "EVT-2", "EVT-1"),
    _m("evt_blocking_publish", "BlockingPublish",
       "publish() waits for room on a full queue instead of shedding", "EVT-3"),
    _m("evt_replay_off_by_one", "ReplayOffByOne", "replays from start + 1", "EVT-4"),
    _m("evt_no_end_marker", "NoEndMarker", "a replay ends without the end marker", "EVT-4"),
    _m("evt_unsigned_end_marker", "UnsignedEndMarker",
       "the end marker is -1 packed as an unsigned 32-bit value", "EVT-4"),
    _m("evt_replay_truncated_at_hwm", "ReplayTruncatedAtHwm",
       "replay answers past the reader's high-water mark are dropped, then the end marker",
       "EVT-5"),
    _m("evt_hostile_request_kills_thread", "HostileRequestKillsThread",
       "a malformed replay request kills the publishing thread", "EVT-6"),
    _m("evt_shutdown_drops_queue", "ShutdownDropsQueue",
       "shutdown() discards the queued batches silently", "EVT-7"),
    _m("evt_rank_endpoints_collide", "RankEndpointsCollide",
       "rank endpoints add the rank to both ports, so ranks 0 and 1 collide", "EVT-8"),
    _m("evt_curve_pub_only", "CurvePubOnly",
       "CURVE on the PUB socket only: the replay ROUTER is plain and replays to strangers",
       "EVT-10"),
    _m("evt_no_receive_limit", "NoReceiveLimit",
       "no receive limit on the PUB and replay sockets: a stranger's announced 1 GiB frame "
       "is buffered byte by byte", "EVT-11"),
    _m("evt_omits_null_medium", "OmitsNullMedium",
       "events leave out the required field medium when it is None", "EVT-9"),
    _m("evt_replay_topic_frame_empty", "ReplayTopicFrameEmpty",
       "topic-seq-payload replay answers carry an empty topic frame", "EVT-9"),
    _m("evt_end_marker_old_layout", "EndMarkerOldLayout",
       "topic-seq-payload replays end with the seq-payload end marker", "EVT-9"),
)
