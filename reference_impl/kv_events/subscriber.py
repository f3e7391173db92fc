"""The reference KV-cache event subscriber (SUB + lazy-pirate replay DEALER).

Everything happens inside the caller's :meth:`KVEventSubscriber.poll`; no
thread is started. What it guarantees (the ``kv-events-subscriber`` contract):

- **Once, in order.** Batches reach the application in sequence order, each
  once. A batch that arrives ahead of a gap is held back; the gap triggers a
  replay request ``[b"", last + 1]`` on a DEALER (a REQ socket would accept
  only the first of the many answers). Replayed batches fill the gap; live
  copies of batches a replay already delivered are dropped as duplicates.
- **Bounded replays, lazy pirate.** A replay that goes quiet for
  ``replay_timeout_ms`` is abandoned: the DEALER is closed and the next
  request goes out on a fresh one, so late answers of the abandoned request
  can never be taken for answers to the new one. After ``replay_attempts``
  unanswered attempts the gap is declared lost (counted), and the batches
  held behind it are delivered.
- **End marker.** A replay ends at the seq frame -1 read as a *signed*
  8-byte integer. Holes still open below what the publisher had published
  when the request left are batches it no longer retains: counted as lost.
- **Restarts.** A live sequence number at or below the last one received
  live cannot come from the same publisher (PUB delivers in order), so it
  marks a new publisher incarnation: counted in ``stats()["restarts"]``,
  and the new incarnation is delivered from its seq 0 (replaying what the
  subscriber missed of it) instead of being dropped as duplicates.
- **Both replay layouts.** A replay answer is read by its frame count after
  the delimiter: ``[b"", seq, payload]`` (``seq-payload``) or ``[b"", topic,
  seq, payload]`` (``topic-seq-payload``, vLLM 0.26 and later), so the
  subscriber works with publishers of either release.
- **Newer producers.** Unknown map keys and extra trailing array elements
  are ignored; an event of an unknown type is left out of its batch and
  counted in ``stats()["unknown_events"]``, and the batch's other events are
  delivered (:mod:`reference_impl.kv_events.wire`).
- **Garbage.** Messages with the wrong frame count, a seq frame that is not
  8 bytes, or a payload that does not decode are counted in
  ``stats()["garbled"]`` and skipped. A garbled payload with
  a valid seq consumes that seq, so it is not replayed in a loop.
- **Topic.** Only messages whose topic frame equals ``topic`` are delivered
  (an empty topic delivers all).
- **Silent partitions.** ZMTP heartbeats on the SUB socket drop a dead
  connection so libzmq reconnects; and when the stream has been quiet for
  ``resync_idle_ms`` the subscriber asks for a replay from ``last + 1``, so
  batches lost while partitioned are recovered even if the publisher
  publishes nothing after the partition heals.
- **No receive limit.** The SUB socket's queue is unbounded by default
  (``rcvhwm=0``): libzmq 4.3 aborts the process (``!_io_error``,
  stream_engine_base.cpp) when a heartbeated connection whose receive queue
  is full is reset, i.e. when the publisher restarts while this subscriber
  lags behind. A lagging subscriber therefore buffers in memory; a bound
  (``rcvhwm > 0``) trades that for the crash.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from dataclasses import dataclass
from typing import Final, cast

import zmq

from reference_impl._curve import CurveClient, client_config
from reference_impl._frames import recv_frames
from reference_impl._monitor import monitor_event
from reference_impl.kv_events.schema import (
    SEQ_BYTES,
    Encoding,
    KVEventBatch,
    SchemaError,
    decode_batch,
    replay_request,
)
from reference_impl.kv_events.wire import WireError, parse_replay_answer

__all__ = ["KVEventSubscriber"]

DEFAULT_REPLAY_TIMEOUT_MS: Final = 1000
DEFAULT_REPLAY_ATTEMPTS: Final = 3
DEFAULT_RESYNC_IDLE_MS: Final = 1000
DEFAULT_HEARTBEAT_IVL_MS: Final = 500
DEFAULT_HEARTBEAT_TIMEOUT_MS: Final = 1500
DEFAULT_RCVHWM: Final = 0
#: Messages read per socket per turn of poll(): poll() returns under a flood, and a
#: caller holds few decoded batches at once (large batches cost memory churn).
_READ_SLICE: Final = 64
_SEQ_LIMIT: Final = 2**63
#: The SUB monitor's events: a connection that ends before its handshake succeeded may
#: have ended libzmq's session for good (no reconnect), so the SUB socket is rebuilt.
_SUB_EVENTS: Final = (zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED
                      | zmq.EVENT_HANDSHAKE_SUCCEEDED)
_POLLIN: Final = int(zmq.POLLIN)
_NOBLOCK: Final = int(zmq.NOBLOCK)
#: Monitor endpoints are never reused (libzmq releases inproc names asynchronously).
_monitor_serial = itertools.count()


@dataclass
class _Replay:
    """The replay request in flight."""

    start: int
    #: The payload last delivered, expected as the first answer (seq ``start``)
    #: if the publisher is the same incarnation; ``None`` once checked.
    check: bytes | None
    #: The highest seq received live when the request left: everything up to
    #: it was published before the publisher read the request.
    covers: int
    last_activity: float


class KVEventSubscriber:
    """SUB + replay-DEALER subscriber of a KV-event stream (see the module docstring).

    Args:
        endpoint: the publisher's PUB endpoint, connected to.
        replay_endpoint: the publisher's replay ROUTER, connected to.
        topic: the topic to deliver (``""``: every topic).
        encoding: the payload encoding, ``"map"``, ``"array"`` or ``"array-map"``.
        replay_timeout_ms: silence after which a replay attempt is abandoned.
        replay_attempts: attempts before a gap is declared lost.
        resync_idle_ms: quiet time after which the subscriber checks for
            batches it missed (0 disables).
        heartbeat_ivl_ms / heartbeat_timeout_ms: ZMTP heartbeats on the SUB
            socket (0 disables).
        rcvhwm: the SUB socket's receive high-water mark (0, the default: no
            limit; a limit lets a publisher restart crash the process, see above).
        reconnect_ivl_ms: libzmq's reconnect interval.
        curve_client_secret_key, curve_server_key: CURVE, off by default (see
            :mod:`reference_impl._curve`): the SUB socket and every replay
            DEALER are CURVE clients pinned to the publisher's server key, so
            a publisher without the matching secret delivers nothing.
    """

    zmq_conformance_capabilities: Final = {"encoding": "map", "wire": "both",
                                           "authentication": True}

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str,
        *,
        topic: str = "",
        encoding: Encoding = "map",
        replay_timeout_ms: int = DEFAULT_REPLAY_TIMEOUT_MS,
        replay_attempts: int = DEFAULT_REPLAY_ATTEMPTS,
        resync_idle_ms: int = DEFAULT_RESYNC_IDLE_MS,
        heartbeat_ivl_ms: int = DEFAULT_HEARTBEAT_IVL_MS,
        heartbeat_timeout_ms: int = DEFAULT_HEARTBEAT_TIMEOUT_MS,
        rcvhwm: int = DEFAULT_RCVHWM,
        reconnect_ivl_ms: int = 100,
        curve_client_secret_key: str | bytes | None = None,
        curve_server_key: str | bytes | None = None,
    ) -> None:
        self._curve: CurveClient | None = client_config(curve_client_secret_key, curve_server_key)
        if encoding not in ("map", "array", "array-map"):
            raise ValueError(
                f"encoding must be 'map', 'array' or 'array-map', not {encoding!r}")
        for name, value in (
            ("replay_timeout_ms", replay_timeout_ms),
            ("replay_attempts", replay_attempts),
            ("reconnect_ivl_ms", reconnect_ivl_ms),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        for name, value in (
            ("rcvhwm", rcvhwm),
            ("resync_idle_ms", resync_idle_ms),
            ("heartbeat_ivl_ms", heartbeat_ivl_ms),
            ("heartbeat_timeout_ms", heartbeat_timeout_ms),
        ):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic
        self.encoding: Encoding = encoding
        self._topic = topic.encode()
        self._replay_timeout_s = replay_timeout_ms / 1000
        self._replay_attempts = replay_attempts
        self._resync_idle_s = resync_idle_ms / 1000
        self._reconnect_ivl_ms = reconnect_ivl_ms

        self._last: int | None = None  # last seq handed to the application (or consumed)
        self._last_live: int | None = None  # last seq received on the SUB socket
        #: Batches waiting for a gap to fill: seq -> (payload, batch or None if garbled).
        self._held: dict[int, tuple[bytes, KVEventBatch | None]] = {}
        self._last_payload: bytes | None = None
        self._replay: _Replay | None = None
        self._failed_attempts = 0
        self._last_traffic = time.monotonic()
        self._closed = False
        self._counts = dict.fromkeys(
            ("delivered", "duplicates", "garbled", "other_topic", "gaps", "replays",
             "replay_timeouts", "lost", "restarts", "stray_answers", "unknown_events",
             "resubscribes"),
            0,
        )

        self._sub_settings = (rcvhwm, heartbeat_ivl_ms, heartbeat_timeout_ms)
        self._resubscribe_at = 0.0
        self._sub_failed = False
        self._sub_handshaken = False
        self._ctx = zmq.Context()
        try:
            self._sub, self._sub_monitor = self._open_sub()
        except BaseException:
            self._ctx.destroy(linger=0)
            raise
        self._dealer: zmq.Socket[bytes] | None = None
        self._poller = zmq.Poller()
        self._poller.register(self._sub, zmq.POLLIN)

    def _open_sub(self) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
        """The SUB socket, every option set before connect(), and the PAIR reading its
        connection events (see :meth:`_watch_sub`)."""
        rcvhwm, heartbeat_ivl_ms, heartbeat_timeout_ms = self._sub_settings
        sub: zmq.Socket[bytes] = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, rcvhwm)
        sub.setsockopt(zmq.RECONNECT_IVL, self._reconnect_ivl_ms)
        if heartbeat_ivl_ms:
            sub.setsockopt(zmq.HEARTBEAT_IVL, heartbeat_ivl_ms)
            sub.setsockopt(zmq.HEARTBEAT_TIMEOUT, heartbeat_timeout_ms or heartbeat_ivl_ms)
        sub.setsockopt(zmq.SUBSCRIBE, self._topic)
        self._secure(sub)
        address = f"inproc://kv-subscriber-monitor-{next(_monitor_serial)}"
        sub.monitor(address, _SUB_EVENTS)
        monitor: zmq.Socket[bytes] = self._ctx.socket(zmq.PAIR)
        monitor.setsockopt(zmq.LINGER, 0)
        monitor.connect(address)
        sub.connect(self.endpoint)
        return sub, monitor

    def _watch_sub(self) -> None:
        """Rebuild the SUB socket after a connection ended before its handshake succeeded
        (at most once per reconnect interval): libzmq ends a connecting session for good
        on a ZMTP protocol error (and on some garbage without saying so), so garbage from
        an impostor on the endpoint would otherwise leave the subscriber deaf to the
        real publisher forever (EVS-11)."""
        monitor = self._sub_monitor
        while cast(int, monitor.getsockopt(zmq.EVENTS)) & _POLLIN:
            event = monitor_event(monitor.recv_multipart(zmq.NOBLOCK))
            if event == zmq.EVENT_CONNECTED:
                self._sub_handshaken = False
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._sub_handshaken = True
            elif event == zmq.EVENT_DISCONNECTED and not self._sub_handshaken:
                self._sub_failed = True
        now = time.monotonic()
        if not self._sub_failed or now < self._resubscribe_at:
            return
        self._sub_failed = False
        self._resubscribe_at = now + self._reconnect_ivl_ms / 1000
        self._counts["resubscribes"] += 1
        self._poller.unregister(self._sub)
        self._close_sub()
        self._sub, self._sub_monitor = self._open_sub()
        self._poller.register(self._sub, zmq.POLLIN)

    def _close_sub(self) -> None:
        # The monitored socket first: closing the monitor's reader first can hang teardown.
        with contextlib.suppress(zmq.ZMQError):
            self._sub.disable_monitor()
        self._sub.close(linger=0)
        self._sub_monitor.close(linger=0)

    # -- the interface ------------------------------------------------------------

    def poll(self, timeout_ms: int) -> list[tuple[int, KVEventBatch]]:
        """Deliverable batches as ``(seq, batch)``, waiting up to ``timeout_ms`` for some.

        Returns as soon as something is deliverable (possibly before the
        timeout), or an empty list at the timeout. Never raises for anything
        the publisher sends.

        Raises:
            RuntimeError: after :meth:`close`.
        """
        if self._closed:
            raise RuntimeError("poll() after close()")
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        out: list[tuple[int, KVEventBatch]] = []
        while True:
            self._watch_sub()
            self._read_live(out)
            self._read_replay(out)
            now = time.monotonic()
            self._timers(now, out)
            if out or now >= deadline:
                return out
            wait = min(deadline, self._next_timer(now)) - now
            self._poller.poll(max(1, int(wait * 1000) + 1))

    def close(self) -> None:
        """Release both sockets and the private context. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._drop_dealer()
        self._close_sub()
        self._ctx.term()

    # -- extras -------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Counters: ``delivered``, ``duplicates``, ``garbled``, ``other_topic``,
        ``gaps``, ``replays``, ``replay_timeouts``, ``lost``, ``restarts``,
        ``stray_answers``, ``unknown_events`` (events of a type it does not know,
        left out of their batches), ``resubscribes`` (SUB sockets rebuilt after a failed
        handshake)."""
        return dict(self._counts)

    @property
    def last_seq(self) -> int | None:
        """The last sequence number delivered (or consumed), ``None`` before the first."""
        return self._last

    def __enter__(self) -> KVEventSubscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<KVEventSubscriber {self.endpoint} last={self._last}>"

    # -- live stream --------------------------------------------------------------

    def _read_live(self, out: list[tuple[int, KVEventBatch]]) -> None:
        """Take what the SUB socket holds, up to a slice.

        ``recv_frames`` (:mod:`reference_impl._frames`): the same receives as
        ``recv_multipart``, without pyzmq's per-frame option lookups. The
        queue's end is found by the ``zmq.Again`` of a non-blocking receive,
        once per turn: a ``ZMQ_EVENTS`` check before every message would cost
        a system call per message under a flood, where a successful receive
        costs none.
        """
        sub = self._sub
        for _ in range(_READ_SLICE):
            try:
                frames = recv_frames(sub, _NOBLOCK)
            except zmq.Again:
                return
            self._on_live(frames, out)

    def _on_live(self, frames: list[bytes], out: list[tuple[int, KVEventBatch]]) -> None:
        if len(frames) != 3:
            self._counts["garbled"] += 1
            return
        topic, seq_frame, payload = frames
        if not self._accepts_topic(topic):
            self._counts["other_topic"] += 1
            return
        seq = self._seq(seq_frame)
        if seq is None:
            return
        self._last_traffic = time.monotonic()
        if self._is_restart(seq):
            self._restarted(out)
        elif self._last is None:
            self._last = seq - 1  # join the stream where it is
        self._last_live = seq
        assert self._last is not None
        if seq <= self._last:
            self._on_duplicate(seq, payload, out)
            return
        if seq == self._last + 1 and not self._held:
            # The steady state, in order with nothing held back: deliver at once.
            # The same as the general path below (hold, then flush the run from
            # last + 1, which is this batch alone; no gap, so no replay).
            self._last, self._last_payload = seq, payload
            batch = self._decode(payload)
            if batch is not None:
                out.append((seq, batch))
                self._counts["delivered"] += 1
            return
        self._held[seq] = (payload, self._decode(payload))
        self._flush(out)
        if self._held and self._replay is None:
            self._counts["gaps"] += 1
            self._request_replay()

    def _accepts_topic(self, topic: bytes) -> bool:
        return not self._topic or topic == self._topic

    def _is_restart(self, seq: int) -> bool:
        """PUB delivers in order: a live seq not above the last live one is a new incarnation."""
        return self._last_live is not None and seq <= self._last_live

    def _on_duplicate(self, seq: int, payload: bytes, out: list[tuple[int, KVEventBatch]]) -> None:
        self._counts["duplicates"] += 1

    def _restarted(self, out: list[tuple[int, KVEventBatch]]) -> None:
        """A new publisher incarnation: close the old one's books, expect seq 0."""
        self._counts["restarts"] += 1
        self._give_up(None, out)
        self._drop_dealer()
        self._replay = None
        self._failed_attempts = 0
        self._last = -1
        self._last_live = None
        self._last_payload = None

    # -- replay -------------------------------------------------------------------

    def _request_replay(self) -> None:
        assert self._last is not None
        if self._dealer is None:
            self._dealer = self._open_replay_socket()
            self._poller.register(self._dealer, zmq.POLLIN)
        # Ask from the last batch delivered, not the one after: its answer
        # proves the publisher is still the incarnation that sent it.
        check = self._last_payload if self._last >= 0 else None
        start = self._last if check is not None else self._last + 1
        covers = self._last_live if self._last_live is not None else self._last
        self._replay = _Replay(start, check, covers, time.monotonic())
        self._counts["replays"] += 1
        self._send_request(self._dealer, replay_request(start))

    def _open_replay_socket(self) -> zmq.Socket[bytes]:
        """A DEALER: it takes the many answers of one request (a REQ takes one)."""
        dealer: zmq.Socket[bytes] = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.RECONNECT_IVL, self._reconnect_ivl_ms)
        self._secure(dealer)
        dealer.connect(self.replay_endpoint)
        return dealer

    def _secure(self, sock: zmq.Socket[bytes]) -> None:
        """CURVE client options on a socket about to connect (a no-op when CURVE is off)."""
        if self._curve is not None:
            self._curve.apply(sock)

    def _send_request(self, sock: zmq.Socket[bytes], frames: list[bytes]) -> None:
        with contextlib.suppress(zmq.Again):  # unanswered: the timeout retries
            sock.send_multipart(frames, zmq.NOBLOCK)

    def _abandon_replay_socket(self) -> None:
        """Lazy pirate: close the socket, so late answers of the abandoned request die with it."""
        self._drop_dealer()

    def _drop_dealer(self) -> None:
        if self._dealer is not None:
            self._poller.unregister(self._dealer)
            self._dealer.close(linger=0)
            self._dealer = None

    def _read_replay(self, out: list[tuple[int, KVEventBatch]]) -> None:
        for _ in range(_READ_SLICE):
            if self._dealer is None:
                return
            try:
                frames = self._dealer.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._on_answer(frames, out)

    def _on_answer(self, frames: list[bytes], out: list[tuple[int, KVEventBatch]]) -> None:
        replay = self._replay
        if replay is None:
            self._counts["stray_answers"] += 1
            return
        try:
            answer = parse_replay_answer(frames)
        except WireError:
            self._counts["garbled"] += 1
            return
        if (answer.topic is not None and not answer.is_end
                and not self._accepts_topic(answer.topic)):
            self._counts["other_topic"] += 1
            return
        frames = [b"", answer.seq_frame, answer.payload]
        replay.last_activity = time.monotonic()
        seq = self._answer_seq(frames[1])
        if replay.check is not None and seq != -1 and seq < replay.start:
            self._counts["garbled"] += 1  # below what was asked: not an answer
            return
        if replay.check is not None and (
            seq == -1 or (seq == replay.start and frames[2] != replay.check)
        ):
            # The publisher has nothing at or past the last batch seen, or a
            # different batch under its seq: a new incarnation, idle so far.
            self._restarted(out)
            self._request_replay()
            return
        replay.check = None
        if seq == -1:  # the end marker
            self._replay = None
            self._failed_attempts = 0
            self._give_up(replay.covers, out)
            if self._held:  # more went missing after the request left
                self._request_replay()
            return
        if seq < 0:
            self._counts["garbled"] += 1
            return
        assert self._last is not None
        if seq <= self._last:
            self._on_duplicate(seq, frames[2], out)
            return
        self._held[seq] = (frames[2], self._decode(frames[2]))
        self._flush(out)

    @staticmethod
    def _answer_seq(frame: bytes) -> int:
        """A replay answer's seq: signed, so the end marker reads as -1."""
        return int.from_bytes(frame, "big", signed=True)

    def _timers(self, now: float, out: list[tuple[int, KVEventBatch]]) -> None:
        replay = self._replay
        if replay is not None:
            if now - replay.last_activity < self._replay_timeout_s:
                return
            self._counts["replay_timeouts"] += 1
            self._abandon_replay_socket()
            self._replay = None
            self._failed_attempts += 1
            if self._failed_attempts >= self._replay_attempts:
                self._failed_attempts = 0
                self._give_up(None, out)
            if self._held:
                self._request_replay()
            else:
                self._failed_attempts = 0  # an unanswered check for news, not a gap
            return
        if (
            self._resync_idle_s
            and self._last is not None
            and now - self._last_traffic >= self._resync_idle_s
        ):
            self._last_traffic = now
            self._request_replay()

    def _next_timer(self, now: float) -> float:
        if self._replay is not None:
            return self._replay.last_activity + self._replay_timeout_s
        if self._resync_idle_s and self._last is not None:
            return self._last_traffic + self._resync_idle_s
        return now + 3600.0

    # -- delivery -----------------------------------------------------------------

    def _flush(self, out: list[tuple[int, KVEventBatch]]) -> None:
        assert self._last is not None
        held = self._held
        while self._last + 1 in held:
            self._last += 1
            self._last_payload, batch = held.pop(self._last)
            if batch is not None:
                out.append((self._last, batch))
                self._counts["delivered"] += 1

    def _give_up(self, upto: int | None, out: list[tuple[int, KVEventBatch]]) -> None:
        """Declare missing seqs up to ``upto`` (``None``: all held back) lost; deliver past them."""
        while self._held:
            assert self._last is not None
            first = min(self._held)
            limit = first - 1 if upto is None else min(first - 1, upto)
            if limit > self._last:
                self._counts["lost"] += limit - self._last
                self._last = limit
            if self._last + 1 != first:
                return
            self._flush(out)

    def _seq(self, frame: bytes) -> int | None:
        if len(frame) != SEQ_BYTES:
            self._counts["garbled"] += 1
            return None
        seq = int.from_bytes(frame, "big")
        if seq >= _SEQ_LIMIT:
            self._counts["garbled"] += 1
            return None
        return seq

    def _decode(self, payload: bytes) -> KVEventBatch | None:
        unknown: list[str] = []
        try:
            batch = decode_batch(payload, self.encoding, unknown=unknown)
        except SchemaError:
            self._counts["garbled"] += 1
            return None
        self._counts["unknown_events"] += len(unknown)
        return batch
