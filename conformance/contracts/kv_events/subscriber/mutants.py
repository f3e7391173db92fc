"""Mutant subscribers: the reference with one real-world defect each.

Every class differs from
:class:`reference_impl.kv_events.subscriber.KVEventSubscriber` by one
defect seen in KV-event consumers, and :data:`MUTANTS` names the clause
whose test must fail against it. ``tests/test_kv_subscriber_contract.py``
runs each against its clause; the self-check catalog lists them too.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Final

import zmq

from reference_impl.kv_events.schema import KVEventBatch, SchemaError, decode_batch
from reference_impl.kv_events.subscriber import KVEventSubscriber
from reference_impl.kv_events.wire import WireProfile, validate_payload

__all__ = ["MUTANTS", "SubscriberMutant"]

_Out = list[tuple[int, KVEventBatch]]


class PlaintextFallback(KVEventSubscriber):
    """Does not insist on the pinned server key: when nothing has arrived 500 ms after it
    started, it reconnects its SUB socket in plaintext "for compatibility" (a downgrade
    an impostor publisher gets for free)."""

    _FALLBACK_S: Final = 0.5

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fallback_at = time.monotonic() + self._FALLBACK_S
        self._fell_back = False

    def poll(self, timeout_ms: int) -> list[tuple[int, KVEventBatch]]:
        if (not self._fell_back and self._last is None
                and time.monotonic() >= self._fallback_at):
            self._fell_back = True
            self._poller.unregister(self._sub)
            self._sub.close(linger=0)
            self._sub = self._ctx.socket(zmq.SUB)  # MUTATION: no CURVE options
            self._sub.setsockopt(zmq.LINGER, 0)
            self._sub.setsockopt(zmq.SUBSCRIBE, self._topic)
            self._sub.connect(self.endpoint)
            self._poller.register(self._sub, zmq.POLLIN)
        return super().poll(timeout_ms)


class TrustsLibzmqReconnect(KVEventSubscriber):
    """Leaves reconnecting to libzmq, which ends a SUB's session for good when a
    handshake fails on garbage: after an impostor spoke on the endpoint, the real
    publisher is never heard again."""

    def _watch_sub(self) -> None:
        pass  # MUTATION: the SUB socket is never rebuilt


class NeverAdvancesLast(KVEventSubscriber):
    """Tracks its last seq only inside replays, so it never sees a gap (vLLM's
    example subscriber: ``last_seq`` stays -1 and the gap test never fires)."""

    def _on_live(self, frames: list[bytes], out: _Out) -> None:
        if len(frames) != 3 or not self._accepts_topic(frames[0]) or len(frames[1]) != 8:
            return
        batch = self._decode(frames[2])
        if batch is not None:
            out.append((int.from_bytes(frames[1], "big"), batch))


class DeliversDuplicates(KVEventSubscriber):
    """Hands replayed and live copies of the same batch to the application."""

    def _on_duplicate(self, seq: int, payload: bytes, out: _Out) -> None:
        batch = self._decode(payload)
        if batch is not None:
            out.append((seq, batch))


class UnsignedEndMarker(KVEventSubscriber):
    """Reads replay seqs unsigned: the end marker becomes seq 2**64-1."""

    @staticmethod
    def _answer_seq(frame: bytes) -> int:
        return int.from_bytes(frame, "big")


class StuckReqReplay(KVEventSubscriber):
    """Replays over a REQ socket that is never rebuilt: after one unanswered
    request every later send fails with EFSM, so it never retries."""

    def _open_replay_socket(self) -> zmq.Socket[bytes]:
        req: zmq.Socket[bytes] = self._ctx.socket(zmq.REQ)
        req.setsockopt(zmq.LINGER, 0)
        req.connect(self.replay_endpoint)
        return req

    def _send_request(self, sock: zmq.Socket[bytes], frames: list[bytes]) -> None:
        with contextlib.suppress(zmq.ZMQError):  # EFSM: still waiting for the last answer
            sock.send_multipart(frames[1:], zmq.NOBLOCK)  # REQ adds the empty frame itself

    def _abandon_replay_socket(self) -> None:
        pass  # the defect: the stuck socket is kept

    def _on_answer(self, frames: list[bytes], out: _Out) -> None:
        super()._on_answer([b"", *frames], out)


class RestartAsDuplicates(KVEventSubscriber):
    """Takes a restarted publisher's seqs (back to 0) for duplicates and drops them."""

    def _is_restart(self, seq: int) -> bool:
        return False

    def _request_replay(self) -> None:
        self._last_payload = None  # no incarnation check in replays either
        super()._request_replay()


class DecodeErrorKillsLoop(KVEventSubscriber):
    """Lets a payload decode error escape ``poll()`` (the consumer's loop dies)."""

    def _decode(self, payload: bytes) -> KVEventBatch | None:
        return decode_batch(payload, self.encoding)  # raises SchemaError


class PrefixTopic(KVEventSubscriber):
    """Relies on ZeroMQ's prefix subscription: ``kv`` also delivers ``kv-events-dp1``."""

    def _accepts_topic(self, topic: bytes) -> bool:
        return True


class NoResync(KVEventSubscriber):
    """Notices losses only by a gap in later batches: no heartbeat, no check when
    the stream goes quiet, so what a partition swallowed before an idle
    period is never replayed."""

    def __init__(self, endpoint: str, replay_endpoint: str, *, topic: str = "",
                 **options: Any) -> None:
        options.update(resync_idle_ms=0, heartbeat_ivl_ms=0, heartbeat_timeout_ms=0)
        super().__init__(endpoint, replay_endpoint, topic=topic, **options)


class BoundedQueue(KVEventSubscriber):
    """Keeps a bounded receive queue on its heartbeated SUB socket, as most
    subscribers do: a publisher restart while it lags behind aborts the process."""

    def __init__(self, endpoint: str, replay_endpoint: str, *, topic: str = "",
                 **options: Any) -> None:
        options.update(rcvhwm=100_000)  # MUTATION: a bounded queue (the old default)
        super().__init__(endpoint, replay_endpoint, topic=topic, **options)


class ReadsSeqPayloadOnly(KVEventSubscriber):
    """Reads replay answers as exactly ``[b"", seq, payload]``: a publisher of vLLM
    0.26 or later answers ``[b"", topic, seq, payload]``, and every answer is garbage."""

    def _on_answer(self, frames: list[bytes], out: _Out) -> None:
        if len(frames) != 3:  # MUTATION: the topic-seq-payload layout is not read
            self._counts["garbled"] += 1
            return
        super()._on_answer(frames, out)


class ForbidsUnknownFields(KVEventSubscriber):
    """Decodes strictly (``forbid_unknown_fields``): a field a newer producer added
    makes the whole batch undecodable."""

    def _decode(self, payload: bytes) -> KVEventBatch | None:
        if validate_payload(payload, WireProfile(encoding=self.encoding)) is not None:
            self._counts["garbled"] += 1  # MUTATION: anything unknown drops the batch
            return None
        return super()._decode(payload)


class UnknownEventDropsBatch(KVEventSubscriber):
    """Drops a whole batch for one event of an unknown type (a tagged union without
    a fallback): the batch's known events are lost too."""

    def _decode(self, payload: bytes) -> KVEventBatch | None:
        unknown: list[str] = []
        try:
            batch = decode_batch(payload, self.encoding, unknown=unknown)
        except SchemaError:
            batch = None
        if batch is None or unknown:  # MUTATION: the known events go with the unknown one
            self._counts["garbled"] += 1
            return None
        return batch


@dataclass(frozen=True)
class SubscriberMutant:
    """A catalog entry: the factory, its defect, and the clause that must catch it."""

    name: str
    factory: str
    description: str
    clauses: tuple[str, ...]
    chaos: bool = False


_M = "conformance.contracts.kv_events.subscriber.mutants"

MUTANTS: Final[tuple[SubscriberMutant, ...]] = (
    SubscriberMutant("evs_never_advances_last", f"{_M}:NeverAdvancesLast",
                     "never advances its last seq, so never sees a gap", ("EVS-1",)),
    SubscriberMutant("evs_delivers_duplicates", f"{_M}:DeliversDuplicates",
                     "replayed and live duplicates are not dropped", ("EVS-1",)),
    SubscriberMutant("evs_unsigned_end_marker", f"{_M}:UnsignedEndMarker",
                     "reads the end marker as seq 2**64-1", ("EVS-2",)),
    SubscriberMutant("evs_stuck_req_replay", f"{_M}:StuckReqReplay",
                     "a REQ replay socket left stuck after a timeout", ("EVS-3",)),
    SubscriberMutant("evs_restart_as_duplicates", f"{_M}:RestartAsDuplicates",
                     "a publisher restart taken for duplicates", ("EVS-4",)),
    SubscriberMutant("evs_bounded_queue", f"{_M}:BoundedQueue",
                     "a bounded receive queue: a publisher restart while it lags aborts it",
                     ("EVS-4",)),
    SubscriberMutant("evs_decode_error_kills_loop", f"{_M}:DecodeErrorKillsLoop",
                     "a decode error escapes poll() and kills the loop", ("EVS-5",)),
    SubscriberMutant("evs_prefix_topic", f"{_M}:PrefixTopic",
                     "delivers every topic the prefix subscription lets through", ("EVS-6",)),
    SubscriberMutant("evs_plaintext_fallback", f"{_M}:PlaintextFallback",
                     "does not insist on the server key: reconnects in plaintext when nothing "
                     "arrived within 500 ms", ("EVS-10",)),
    SubscriberMutant("evs_trusts_libzmq_reconnect", f"{_M}:TrustsLibzmqReconnect",
                     "never rebuilds its SUB socket: garbage from an impostor ends libzmq's "
                     "session and the real publisher is never heard again", ("EVS-11",)),
    SubscriberMutant("evs_no_resync", f"{_M}:NoResync",
                     "no heartbeat and no idle check: losses before a quiet period stay lost",
                     ("EVS-7",), chaos=True),
    SubscriberMutant("evs_reads_seq_payload_only", f"{_M}:ReadsSeqPayloadOnly",
                     "reads replay answers only in the seq-payload layout", ("EVS-8",)),
    SubscriberMutant("evs_forbids_unknown_fields", f"{_M}:ForbidsUnknownFields",
                     "a field a newer producer added makes its batch undecodable", ("EVS-9",)),
    SubscriberMutant("evs_unknown_event_drops_batch", f"{_M}:UnknownEventDropsBatch",
                     "an event of an unknown type drops its whole batch", ("EVS-9",)),
)


def selfcheck_catalog() -> tuple[Any, ...]:
    """:data:`MUTANTS` as the self-check catalog (``self-check --contract
    kv-events-subscriber``); each one's base is the reference subscriber."""
    from conformance.selfcheck.mutants import Mutant

    base = "reference_impl.kv_events.subscriber:KVEventSubscriber"
    return tuple(
        Mutant(m.name, m.factory, m.description, m.description, m.clauses, chaos=m.chaos,
               base=base)
        for m in MUTANTS
    )
