"""Raw-socket peers of the publisher under test, and the rig that drives one.

The suite plays every other party of the KV-event stream itself, with plain
pyzmq sockets, so it needs nothing of the publisher but ``publish()`` and
``shutdown()``:

- :class:`Sub`: a SUB socket subscribed to the topic, reading (or stalled);
- :class:`ReplayClient`: a DEALER that sends ``[b"", start]`` as a REQ
  socket would and reads answers in either replay layout up to the end
  marker (EVT-9 judges the layout; every other clause reads both);
- :class:`Rig`: one publisher under test on fresh ports, the model of what
  it published (seq ``i`` of this incarnation carries the ``i``-th batch that
  could be encoded), and the checks every clause test shares.

Clauses are judged independently where they can be: only EVT-1 compares
payloads with what was published; the others identify a batch by its
unique ``ts`` and compare a replay with the payloads the PUB socket sent
under the same seqs, so an EVT-1 defect (a publisher that stamps its own
``data_parallel_rank``, a seq offset) leaves their verdicts intact.

A failure of the suite's own peers (a send that cannot go out, ports the
harness cannot bind) is a run error, never the publisher's verdict: see
:func:`run_error`.

Every call into the publisher (the factory, ``publish()``, ``shutdown()``,
``stats()``) runs under :mod:`conformance.supervision.watchdog`, so a call that hangs
becomes a ``blocked`` verdict, never a hung run.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, NoReturn

import msgspec
import zmq

from conformance.contracts.kv_events.spec import PublisherSpec
from conformance.errors import CallBlocked, RunError
from conformance.supervision import host_stall, watchdog
from reference_impl.kv_events.schema import (
    END_MARKER_SEQ,
    SEQ_BYTES,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    SchemaError,
    first_difference,
)
from reference_impl.kv_events.wire import (
    ReplayAnswer,
    WireError,
    WireProfile,
    as_batch,
    decode_payload,
    encode_payload,
    parse_replay_answer,
    restrict,
)

__all__ = [
    "HOST",
    "Message",
    "ReplayClient",
    "Rig",
    "Sub",
    "decode_as",
    "endpoint_bound",
    "free_ports",
    "make_batch",
    "run_error",
    "ts_of",
]

HOST: Final = "127.0.0.1"
#: How long the suite waits for something the publisher must do "now".
PATIENCE_S: Final = 5.0
_POLL_MS: Final = 5

#: One PUB message as received: (topic, seq frame, payload).
Message = tuple[bytes, bytes, bytes]

_stamp = itertools.count(1)
#: How long a restart waits for endpoints a shutdown() frees asynchronously.
RESTART_GRACE_S: Final = 2.0


def make_batch(events: int = 1, *, tokens: int = 4) -> KVEventBatch:
    """A batch whose ``ts`` is unique in this process (so any copy of it is traceable)."""
    index = next(_stamp)
    stored = BlockStored(block_hashes=[index, index + 1], parent_block_hash=None,
                         token_ids=list(range(tokens)), block_size=max(1, tokens // 2),
                         lora_id=None, medium="GPU")
    kinds: list[Any] = [stored, BlockRemoved(block_hashes=[index], medium="GPU"),
                        AllBlocksCleared()]
    return KVEventBatch(ts=float(index), events=[kinds[i % 3] for i in range(events)])


def free_ports(count: int, *, consecutive: bool = False) -> list[int]:
    """``count`` TCP ports on :data:`HOST` that were free a moment ago (a run of
    consecutive ones if asked: data-parallel ranks derive theirs by offsets)."""
    if not consecutive:
        socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
        try:
            for sock in socks:
                sock.bind((HOST, 0))
            return [int(s.getsockname()[1]) for s in socks]
        finally:
            for sock in socks:
                sock.close()
    rng = random.SystemRandom()
    for _ in range(200):
        # Below the kernel's ephemeral range, where outgoing connections take ports.
        base = rng.randrange(20000, 32000 - count)
        socks = []
        try:
            for port in range(base, base + count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(sock)
                sock.bind((HOST, port))
            return list(range(base, base + count))
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no run of {count} free ports on {HOST}")


def tcp(port: int) -> str:
    return f"tcp://{HOST}:{port}"


def run_error(message: str) -> NoReturn:
    """End the test as an error of the run, not a verdict on the implementation.

    The suite's own peers failed (``message`` says how); the clause is
    skipped with that reason, so the report never blames the publisher.
    """
    raise RunError(message)


def endpoint_bound(endpoint: str) -> bool:
    """Whether something still listens on ``endpoint`` (a fresh socket cannot bind it).

    TCP endpoints are probed with a plain socket set up as libzmq sets up its
    listeners (``SO_REUSEADDR``, so connections in TIME_WAIT do not count);
    others with a short-lived ZeroMQ context.
    """
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint[len("tcp://"):].rpartition(":")
        probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("" if host == "*" else host, int(port)))
        except OSError:
            return True
        finally:
            probe.close()
        return False
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        sock: zmq.Socket[bytes] = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            return exc.errno == zmq.EADDRINUSE
        return False
    finally:
        ctx.destroy(0)


def ts_of(payload: bytes) -> float | None:
    """The ``ts`` of a payload in any encoding (first field of an array, key of a map)."""
    try:
        data = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError:
        return None
    ts = data.get("ts") if isinstance(data, dict) else (
        data[0] if isinstance(data, list) and data else None)
    return float(ts) if isinstance(ts, float | int) and not isinstance(ts, bool) else None


def decode_as(payload: bytes, profile: WireProfile) -> KVEventBatch:
    """A payload read under ``profile`` as a forward-compatible consumer reads it.

    Raises:
        SchemaError: it cannot be read so (naming why).
    """
    try:
        batch: KVEventBatch = as_batch(decode_payload(payload, profile))
    except WireError as exc:
        raise SchemaError(f"does not decode under {profile.describe()}: {exc}") from None
    return batch


class Sub:
    """A SUB socket on the publisher's endpoint; :meth:`drain` keeps what arrived."""

    def __init__(self, ctx: zmq.Context[Any], endpoint: str, topic: str, *,
                 rcvhwm: int = 0, secure: Callable[[zmq.Socket[bytes]], None] | None = None
                 ) -> None:
        self.sock: zmq.Socket[bytes] = ctx.socket(zmq.SUB)
        if secure is not None:
            secure(self.sock)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, rcvhwm)
        self.sock.setsockopt(zmq.RECONNECT_IVL, 10)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self.sock.connect(endpoint)
        self.got: list[Message] = []
        self.malformed: list[list[bytes]] = []

    def drain(self, timeout_ms: int = 0) -> int:
        """Read what is there (waiting up to ``timeout_ms`` for the first); return the count."""
        count = 0
        if not self.sock.poll(timeout_ms):
            return 0
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return count
            count += 1
            if len(frames) == 3:
                self.got.append((frames[0], frames[1], frames[2]))
            else:
                self.malformed.append(frames)

    def close(self) -> None:
        self.sock.close(0)


class ReplayClient:
    """A DEALER on the replay endpoint speaking the REQ-shaped protocol.

    ``answers`` keeps every answer read (end markers included), in either
    layout, for EVT-9 to judge.
    """

    def __init__(self, ctx: zmq.Context[Any], endpoint: str, *, rcvhwm: int = 0,
                 secure: Callable[[zmq.Socket[bytes]], None] | None = None) -> None:
        self.sock: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
        if secure is not None:
            secure(self.sock)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, rcvhwm)
        self.sock.connect(endpoint)
        self.answers: list[ReplayAnswer] = []

    def send(self, frames: list[bytes], *, timeout: float = PATIENCE_S) -> None:
        """Send one request, waiting up to ``timeout`` for room in the socket's queue.

        A publisher that reads requests slowly (one per poll turn) fills a
        DEALER's queue under a flood; waiting for it is the suite's job. A
        queue that stays full is a run error: nothing the contract asks of
        the publisher says how fast it reads requests.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.sock.send_multipart(frames, zmq.NOBLOCK)
                return
            except zmq.Again:
                left = deadline - time.monotonic()
                if left <= 0:
                    run_error(f"the suite's replay client could not send a request for "
                              f"{timeout:.0f} s (its queue to the publisher stayed full)")
                self.sock.poll(max(1, int(left * 1000)), zmq.POLLOUT)

    def request(self, start: int) -> None:
        self.send([b"", start.to_bytes(SEQ_BYTES, "big", signed=True)])

    def read(self, *, timeout: float = PATIENCE_S, clause: str,
             pump: Callable[[], object] | None = None,
             newest: int | None = None) -> tuple[list[tuple[int, bytes]], bool]:
        """Answers up to the end marker: ``([(seq, payload), ...], ended)``.

        ``ended`` is False when no end marker came within ``timeout`` of the
        last answer. A malformed answer fails ``clause``, and so does, at once,
        an answer past ``newest`` (the newest seq published, when the caller
        knows nothing newer can be replayed): no wait for an end marker can
        make such a replay right.
        """
        answers: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pump is not None:
                pump()
            if not self.sock.poll(_POLL_MS):
                continue
            frames = self.sock.recv_multipart()
            try:
                answer = parse_replay_answer(frames)
            except WireError as exc:
                raise AssertionError(f"{clause}: {exc}") from None
            self.answers.append(answer)
            seq = answer.seq
            if answer.is_end:
                assert answer.payload == b"", (
                    f"{clause}: the end marker's payload is not empty")
                return answers, True
            assert seq >= 0, (
                f"{clause}: replay answer with seq {seq} (frame {answer.seq_frame.hex()}): the "
                f"end marker is -1 as a signed 8-byte integer ({END_MARKER_SEQ.hex()})"
            )
            if newest is not None and seq > newest:
                hint = (" (an empty payload: the end marker written unsigned? It is -1 as a "
                        f"signed 8-byte integer, {END_MARKER_SEQ.hex()})"
                        if not answer.payload else "")
                raise AssertionError(
                    f"{clause}: replay answer with seq {seq} (frame {answer.seq_frame.hex()}) "
                    f"after {len(answers)} answers, but the newest published seq is "
                    f"{newest}{hint}"
                )
            answers.append((seq, answer.payload))
            deadline = time.monotonic() + timeout
        return answers, False

    def close(self) -> None:
        self.sock.close(0)


class Rig:
    """One publisher under test on fresh ports, its peers, and the model.

    ``model`` lists, per seq of the current incarnation, the batch that seq
    must carry: every batch ``publish()`` accepted that the declared profile
    can encode (batches are first cut down to the declared schema version,
    :func:`~reference_impl.kv_events.wire.restrict`). ``raised`` counts
    ``publish()`` calls that raised (shedding reported by error). A restart
    (:meth:`restart`) starts a new incarnation whose seqs count from 0 again.

    ``pub_payloads`` maps each seq of this incarnation to the payload a
    subscriber received under it (see :meth:`observe`); ``offset`` is the
    publisher's own first seq as observed (0 for a conforming publisher), so
    replay checks do not depend on EVT-1's numbering.
    """

    def __init__(self, spec: PublisherSpec, *, clause: str, topic: str = "kv",
                 **overrides: Any) -> None:
        self.spec = spec
        self.profile = spec.profile
        self.clause = clause
        self.topic = topic
        self.overrides = overrides
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.model: list[KVEventBatch] = []
        self.unencodable = 0
        self.raised = 0
        self.peers: list[Sub | ReplayClient] = []
        self.publisher: Any = None
        #: Time ``publish()`` has cost its caller so far (see :meth:`_caller_time`).
        self.publish_seconds = 0.0
        self.incarnation = 0
        self.pub_payloads: dict[int, bytes] = {}
        self.offset: int | None = None
        self._by_ts: dict[float, int] = {}
        #: Per subscriber: how many of its messages were looked at, the highest index.
        self._highest: dict[int, tuple[Sub, int, int]] = {}
        self._encodable_cache: dict[int, tuple[KVEventBatch, bool]] = {}
        try:
            self._start()
        except BaseException:
            self.ctx.destroy(0)
            raise

    # -- the publisher -------------------------------------------------------------

    def _start(self) -> None:
        if self.incarnation > 0:  # a restart: the same endpoints, by definition
            self.publisher = self._build()
            return
        last: Exception | None = None
        for _ in range(5):
            pub_port, replay_port = free_ports(2)
            self.endpoint, self.replay_endpoint = tcp(pub_port), tcp(replay_port)
            try:
                self.publisher = self._build()
                return
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EADDRINUSE:
                    raise
                last = exc  # another process took a port the suite picked: pick again
        run_error(f"the harness found no free pair of ports for the publisher in 5 tries "
                  f"({last})")

    def _build(self) -> Any:
        return watchdog.call(
            "publisher factory", self.spec.build, self.endpoint, self.replay_endpoint,
            topic=self.topic, **self.overrides,
        )

    def publish(self, batch: KVEventBatch, *, track: bool = True) -> bool:
        """``publish()`` under the watchdog; False if it raised (reported shedding).

        The batch is first cut down to the declared schema version. ``track=False``
        leaves it out of the model (a test that expects shedding, where seqs
        cannot be matched to batches, counts by itself).
        """
        batch = restrict(batch, self.profile.version)
        started = time.perf_counter()
        try:
            watchdog.call("publish()", self.publisher.publish, batch)
        except AssertionError:
            raise
        except Exception:
            self.raised += 1
            return False
        finally:
            self.publish_seconds += self._caller_time(time.perf_counter() - started)
        self._accepted(batch, track)
        return True

    def publish_many(self, batches: Iterable[KVEventBatch], *, track: bool = True
                     ) -> list[bool]:
        """``[publish(b) for b in batches]``: the calls run back to back, as a caller's
        loop makes them (in-process, exactly that loop: ``batches`` is consumed lazily).

        Where the publisher lives in a driver process that offers ``publish_many``
        (``docs/drivers.md``, section 6), that loop runs there, next to the
        implementation: one round trip per call would pace a burst at the protocol's
        speed, so a queue meant to fill (EVT-3) or a backlog meant to be queued at
        shutdown (EVT-7) would not build up as it does in-process. ``publish_seconds``
        then grows by the implementation's own time in the calls, as the driver
        measured it.
        """
        many = getattr(self.publisher, "zmq_conformance_publish_many", None)
        if not callable(many):
            return [self.publish(batch, track=track) for batch in batches]
        restricted = [restrict(batch, self.profile.version) for batch in batches]
        # Every call may take the default limit in-process; here the crossing of many
        # batches (chunked) is added: 50 ms a batch is far above what a loaded machine needs.
        limit = watchdog.default_limit() + 0.05 * len(restricted)
        with watchdog.guard(f"publish() of {len(restricted)} batches, back to back", limit):
            got = many(restricted) if restricted else None
        if got is None:  # the driver does not offer publish_many: one call each
            return [self.publish(batch, track=track) for batch in restricted]
        return self._outcomes(restricted, got, track)

    def publish_copies(self, batch: KVEventBatch, count: int, *, track: bool = True
                       ) -> list[bool]:
        """:meth:`publish_many` of ``count`` copies of ``batch``, copy ``k`` with ``ts + k``
        (the copies share everything else). Through a driver that offers
        ``publish_copies`` the batch crosses once and the driver makes the copies, so
        a burst of large batches reaches the implementation as fast as in-process."""
        copies = [msgspec.structs.replace(batch, ts=batch.ts + k) for k in range(count)]
        many = getattr(self.publisher, "zmq_conformance_publish_copies", None)
        if not callable(many):
            return self.publish_many(copies, track=track)
        with watchdog.guard(f"publish() of {count} copies, back to back",
                            watchdog.default_limit() + 0.05 * count):
            got = many(restrict(batch, self.profile.version), count)
        if got is None:
            return self.publish_many(copies, track=track)
        return self._outcomes([restrict(c, self.profile.version) for c in copies], got, track)

    def publish_copies_timed(self, batch: KVEventBatch, count: int, *, run: int,
                             track: bool = True) -> tuple[list[bool], list[float]]:
        """:meth:`publish_copies` of ``count`` copies, and each call's own time in seconds
        (what it cost its caller, as :meth:`publish` counts it; ``publish_seconds``
        grows by their sum).

        In-process the calls are a plain loop, each timed. Through a driver that
        declares ``publish_copies_timed`` (``docs/drivers.md``, section 6) the whole burst
        is one request: the batch crosses once, not once a run, and the driver reports
        each call's time, judged against the watchdog's limit (plus any host stall
        measured meanwhile) as a call in-process is. A driver without it gets runs of
        ``run`` calls by :meth:`publish_copies`, and each call of a run is credited with
        that run's mean: so a caller that reads the times as means over runs of ``run``
        (EVT-3) gets the same figures either way.
        """
        timed = getattr(self.publisher, "zmq_conformance_publish_copies_timed", None)
        if callable(timed):
            limit = watchdog.default_limit()
            since = time.monotonic()
            with watchdog.guard(f"publish() of {count} copies, back to back",
                                limit + watchdog.default_limit() + 0.05 * count):
                got = timed(restrict(batch, self.profile.version), count, limit=limit)
            if got is not None:
                outcomes, seconds = got
                for number, took in enumerate(seconds):
                    if took > limit + host_stall.stall_ms(since) / 1000:
                        raise CallBlocked(f"publish() (call {number + 1} of {count} made "
                                          f"back to back)", took)
                copies = [restrict(msgspec.structs.replace(batch, ts=batch.ts + k),
                                   self.profile.version) for k in range(count)]
                return self._outcomes(copies, (outcomes, sum(seconds)), track), seconds
        if callable(getattr(self.publisher, "zmq_conformance_publish_copies", None)):
            accepted: list[bool] = []
            times: list[float] = []
            for first in range(0, count, run):
                size = min(run, count - first)
                before = self.publish_seconds
                accepted += self.publish_copies(
                    msgspec.structs.replace(batch, ts=batch.ts + first), size, track=track)
                times += [(self.publish_seconds - before) / size] * size
            return accepted, times
        copies = [msgspec.structs.replace(batch, ts=batch.ts + k) for k in range(count)]
        accepted, times = [], []
        for copy in copies:
            before = self.publish_seconds
            accepted.append(self.publish(copy, track=track))
            times.append(self.publish_seconds - before)
        return accepted, times

    def _outcomes(self, batches: Sequence[KVEventBatch],
                  got: tuple[Sequence[Exception | None], float], track: bool) -> list[bool]:
        """Account for calls run back to back (by a driver, or by :meth:`publish_then_shutdown`
        here), as :meth:`publish` does for one."""
        outcomes, seconds = got
        self.publish_seconds += seconds
        accepted = []
        for batch, outcome in zip(batches, outcomes, strict=True):
            if outcome is not None:
                self.raised += 1
            else:
                self._accepted(batch, track)
            accepted.append(outcome is None)
        return accepted

    def _accepted(self, batch: KVEventBatch, track: bool) -> None:
        """Put a batch ``publish()`` accepted into the model (unless ``track`` is off)."""
        if not track:
            return
        if not self._encodable(batch):
            self.unencodable += 1
            return
        self._by_ts[batch.ts] = len(self.model)  # the newest with a ts wins
        self.model.append(batch)

    def _caller_time(self, wall: float) -> float:
        """What the last ``publish()`` cost its caller: the implementation's own time where
        a driver measured it around the call (``last_call_seconds``, see
        :mod:`conformance.drivers`), else the wall time of the call here."""
        measured = getattr(self.publisher, "last_call_seconds", None)
        return float(measured) if isinstance(measured, float) else wall

    def _encodable(self, batch: KVEventBatch) -> bool:
        known = self._encodable_cache.get(id(batch))
        if known is not None and known[0] is batch:
            return known[1]
        try:
            encode_payload(batch, self.profile)
            ok = True
        except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
            ok = False
        self._encodable_cache[id(batch)] = (batch, ok)
        return ok

    def stats(self) -> Mapping[str, int]:
        """The publisher's ``stats()`` if it has one (shedding reported by counter)."""
        stats = getattr(self.publisher, "stats", None)
        if not callable(stats):
            return {}
        got = watchdog.call("stats()", stats)
        return got if isinstance(got, Mapping) else {}

    def shutdown(self, limit: float | None = None) -> float:
        """``shutdown()`` under the watchdog; return how long it took."""
        started = time.monotonic()
        with watchdog.guard("shutdown()", limit):
            self.publisher.shutdown()
        return time.monotonic() - started

    def publish_then_shutdown(self, batches: Iterable[KVEventBatch], *, limit: float
                              ) -> tuple[Mapping[str, int], float]:
        """``publish()`` of each batch, then ``stats()``, then ``shutdown()``, with nothing
        in between: the stats taken just before ``shutdown()`` and how long it took.

        A backlog the burst leaves is still queued when ``shutdown()`` starts, which is
        what EVT-7 judges, so the burst runs as a caller's tight loop would: batches are
        cut to the schema version before it, and the model is updated after
        ``shutdown()`` (checking that a batch encodes costs as much as the publisher's
        own encoding, so a loop that did it per call let the publisher's thread keep
        up, and a mutant that drops its queue at shutdown survived). One watchdog guard
        covers the burst, ``stats()`` and ``shutdown()``. Through a driver that offers
        ``publish_then_shutdown`` (``docs/drivers.md``, section 6) the three run back
        to back in its process: with a round trip in between, the publisher's thread
        drains the queue first (5 of 5 bursts left no backlog). ``took`` is then
        ``shutdown()``'s own time as the driver measured it, as :meth:`publish` takes
        a driver's measure.
        """
        restricted = [restrict(batch, self.profile.version) for batch in batches]
        crossing = watchdog.default_limit() + 0.05 * len(restricted)
        call = (f"publish() of {len(restricted)} batches, stats(), shutdown(), "
                f"back to back")
        combined = getattr(self.publisher, "zmq_conformance_publish_then_shutdown", None)
        if callable(combined):
            with watchdog.guard(call, (limit or 0.0) + crossing):
                got = combined(restricted, limit=limit)
            if got is not None:
                outcomes, stats, publish_seconds, took = got
                self._outcomes(restricted, (outcomes, publish_seconds), track=True)
                return dict(stats or {}), took
            self.publish_many(restricted)
            stats = dict(self.stats())
            return stats, self.shutdown(limit=limit)
        publish = self.publisher.publish
        stats_of = getattr(self.publisher, "stats", None)
        raised: list[Exception | None] = []
        with watchdog.guard(call, (limit or 0.0) + crossing):
            began = time.perf_counter()
            for batch in restricted:
                try:
                    publish(batch)
                except AssertionError:
                    raise
                except Exception as exc:
                    raised.append(exc)
                else:
                    raised.append(None)
            publish_seconds = time.perf_counter() - began
            got_stats = stats_of() if callable(stats_of) else None
            started = time.monotonic()
            self.publisher.shutdown()
            took = time.monotonic() - started
        self._outcomes(restricted, (raised, publish_seconds), track=True)
        return dict(got_stats) if isinstance(got_stats, Mapping) else {}, took

    def still_bound(self) -> list[str]:
        """The publisher's endpoints that a fresh socket cannot bind (after shutdown())."""
        return [e for e in (self.endpoint, self.replay_endpoint) if endpoint_bound(e)]

    def restart(self, *, grace_s: float = RESTART_GRACE_S) -> None:
        """Shut the publisher down and start a new one on the same endpoints.

        An endpoint freed asynchronously a moment after ``shutdown()`` returned is
        waited for, up to ``grace_s``: whether the free happens before or after
        the return is timing, and the machine that restarts must replay the same
        way every time (EVT-7's own test checks the instant shutdown() returns).
        An endpoint still bound after the grace fails EVT-7, whatever test
        restarts: a restarted engine could not bind its configuration.
        """
        self.shutdown()
        deadline = time.monotonic() + grace_s
        bound = self.still_bound()
        while bound and time.monotonic() < deadline:
            time.sleep(0.01)
            bound = self.still_bound()
        assert not bound, (
            f"EVT-7: {', '.join(bound)} still bound {grace_s:.0f} s after shutdown() "
            f"returned: a publisher restarted on the same configuration fails with "
            f"EADDRINUSE (shutdown() must release its sockets)"
        )
        self.incarnation += 1
        self.model = []
        self._by_ts = {}
        self._highest = {}
        self.pub_payloads = {}
        self.offset = None
        self._start()

    # -- peers ------------------------------------------------------------------------

    def sub(self, *, rcvhwm: int = 0,
            secure: Callable[[zmq.Socket[bytes]], None] | None = None) -> Sub:
        sub = Sub(self.ctx, self.endpoint, self.topic, rcvhwm=rcvhwm, secure=secure)
        self.peers.append(sub)
        return sub

    def replay_client(self, *, rcvhwm: int = 0,
                      secure: Callable[[zmq.Socket[bytes]], None] | None = None
                      ) -> ReplayClient:
        client = ReplayClient(self.ctx, self.replay_endpoint, rcvhwm=rcvhwm, secure=secure)
        self.peers.append(client)
        return client

    def drop(self, peer: Sub | ReplayClient) -> None:
        peer.close()
        with contextlib.suppress(ValueError):
            self.peers.remove(peer)

    def join(self, sub: Sub, *, timeout: float = PATIENCE_S) -> None:
        """Publish warm-up batches until ``sub`` receives one (its subscription is in
        place: a PUB socket drops what it sends before that, by design)."""
        deadline = time.monotonic() + timeout
        have = len(sub.got)
        while len(sub.got) == have:
            assert time.monotonic() < deadline, (
                f"{self.clause}: a subscriber received nothing of {len(self.model)} batches "
                f"published in {timeout:.0f} s"
            )
            self.publish(make_batch())
            sub.drain(20)

    def settle(self, publish: Callable[[], object] | None = None) -> None:
        """Return once the publisher has sent every batch ``publish()`` accepted.

        ``publish()`` may only queue (vLLM's does); a replay covers what the
        publisher has *sent*. A fresh subscriber joins (warm-up batches through
        ``publish``, the rig's own by default) and reads until the newest batch
        arrived: the stream is FIFO, so everything before it was sent too.
        """
        sub = self.sub()
        try:
            deadline = time.monotonic() + PATIENCE_S
            while not sub.got:
                assert time.monotonic() < deadline, (
                    f"{self.clause}: a subscriber received nothing of {len(self.model)} "
                    f"batches published in {PATIENCE_S:.0f} s"
                )
                if publish is None:
                    self.publish(make_batch())
                else:
                    publish()
                sub.drain(20)
            self.wait_all(sub)
            self.observe(sub)
        finally:
            self.drop(sub)

    def index_of(self, payload: bytes) -> int | None:
        """The model index of the batch ``payload`` carries, by its unique ``ts``."""
        ts = ts_of(payload)
        return None if ts is None else self._by_ts.get(ts)

    def arrived(self, sub: Sub, index: int) -> bool:
        """Whether ``sub`` got a batch at or past model index ``index`` (by ``ts``),
        anywhere in its stream: a backlog sent out of order (EVT-2's defect, judged by
        :meth:`check_order`) may bring the newest batch first."""
        known, seen, highest = self._highest.get(id(sub), (sub, 0, -1))
        if known is not sub or seen > len(sub.got):  # a new subscriber, or got cleared
            seen, highest = 0, -1
        for message in sub.got[seen:]:
            found = self.index_of(message[2])
            if found is not None and found > highest:
                highest = found
        self._highest[id(sub)] = (sub, len(sub.got), highest)
        return highest >= index

    def wait_for(self, sub: Sub, index: int, *, timeout: float = PATIENCE_S,
                 pump: Callable[[], object] | None = None) -> None:
        """Read ``sub`` until it has the batch published as model index ``index``
        (or a later one), identified by ``ts``, not by seq (EVT-1's business)."""
        deadline = time.monotonic() + timeout
        while not self.arrived(sub, index):
            if time.monotonic() >= deadline:
                last = self.index_of(sub.got[-1][2]) if sub.got else None
                raise AssertionError(
                    f"{self.clause}: batch #{index} never arrived within {timeout:.0f} s "
                    f"(last received: #{last}; {len(self.model)} batches published)"
                )
            if pump is not None:
                pump()
            sub.drain(_POLL_MS)

    def wait_all(self, sub: Sub, **kwargs: Any) -> None:
        """Read ``sub`` until the last batch of the model arrived."""
        self.wait_for(sub, len(self.model) - 1, **kwargs)

    def observe(self, sub: Sub) -> None:
        """Learn the payload the PUB socket sent under each seq ``sub`` received, and
        the publisher's first seq (seq minus model index)."""
        for _topic, seq_frame, payload in sub.got:
            index = self.index_of(payload)
            if len(seq_frame) != SEQ_BYTES or index is None:
                continue  # malformed (EVT-1's), or of an earlier incarnation
            seq = _seq(seq_frame)
            self.pub_payloads.setdefault(seq, payload)
            if self.offset is None:
                self.offset = seq - index

    # -- checks -------------------------------------------------------------------

    def check_message(self, message: Message) -> int:
        """EVT-1: framing, seq and payload of one PUB message against the model.

        A batch published with ``data_parallel_rank`` ``None`` may arrive with
        the publisher's own rank stamped in (EVT-8 checks its value).
        """
        topic, seq_frame, payload = message
        assert topic == self.topic.encode(), (
            f"EVT-1: topic frame {topic!r}, expected {self.topic.encode()!r}"
        )
        assert len(seq_frame) == SEQ_BYTES, (
            f"EVT-1: seq frame has {len(seq_frame)} bytes, not {SEQ_BYTES} big-endian"
        )
        seq = _seq(seq_frame)
        assert 0 <= seq < len(self.model), (
            f"EVT-1: seq {seq} but only {len(self.model)} batches were published "
            f"(seqs 0..{len(self.model) - 1})"
        )
        try:
            batch = decode_as(payload, self.profile)
        except SchemaError as exc:
            raise AssertionError(f"EVT-1: seq {seq}: payload {exc}") from None
        expected = self.model[seq]
        if expected.data_parallel_rank is None and batch.data_parallel_rank is not None:
            expected = msgspec.structs.replace(expected,
                                               data_parallel_rank=batch.data_parallel_rank)
        diff = first_difference(expected, batch)
        if diff is not None:
            which = _find(self.model, batch)
            hint = f" (it is the batch published as #{which})" if which is not None else ""
            raise AssertionError(
                f"EVT-1: seq {seq} does not carry the {_ordinal(seq)} published batch: "
                f"{diff}{hint}"
            )
        return seq

    def check_stream(self, sub: Sub, *, clause: str, contiguous: bool = True) -> list[int]:
        """EVT-1: every message ``sub`` got is well-formed and carries its seq's batch;
        seqs increase (by exactly one when ``contiguous``). Return the seqs."""
        assert not sub.malformed, (
            f"EVT-1: PUB message with {len(sub.malformed[0])} frames, not 3 "
            f"[topic, seq, payload]"
        )
        seqs = [self.check_message(m) for m in sub.got]
        for before, after in itertools.pairwise(seqs):
            if after == before:
                raise AssertionError(f"{clause}: seq {after} delivered twice")
            if after < before:
                raise AssertionError(f"{clause}: seq {after} after seq {before}: reordered")
            if contiguous and after != before + 1:
                raise AssertionError(
                    f"{clause}: gap: seq {before} then {after} to a reading subscriber"
                )
        return seqs

    def check_order(self, sub: Sub, *, clause: str, contiguous: bool = True) -> list[int]:
        """The batches ``sub`` got, identified by ``ts``, came once each, in publishing
        order (EVT-2's, whichever test asks), and, when ``contiguous``, with no batch
        missing between two (``clause``'s: a test of another clause asks whether its
        provocation lost batches). Seqs and content are EVT-1's. Return the model indices.

        Order and duplicates are judged on the whole stream first, so a backlog sent
        newest first reads as EVT-2's reordering, not as batches ``clause`` lost.
        """
        indices = [i for i in (self.index_of(m[2]) for m in sub.got) if i is not None]
        for before, after in itertools.pairwise(indices):
            if after == before:
                raise AssertionError(f"EVT-2: batch #{after} delivered twice")
        for before, after in itertools.pairwise(indices):
            if after < before:
                raise AssertionError(
                    f"EVT-2: batch #{after} after batch #{before}: reordered")
        for before, after in itertools.pairwise(indices):
            if contiguous and after != before + 1:
                raise AssertionError(
                    f"{clause}: batch #{before} then #{after} to a reading subscriber: "
                    f"{after - before - 1} lost"
                )
        return indices

    def check_replay(self, client: ReplayClient, start: int, clause: str,
                     retained: int | None) -> None:
        """``clause``: a replay from ``start`` answers every retained seq from it, in
        order, each byte-identical to what the PUB socket sent under that seq
        (or, for a seq no subscriber saw, the batch published at that place),
        then the end marker. Needs :meth:`observe` of a subscriber first."""
        first = self.offset if self.offset is not None else 0
        newest = first + len(self.model) - 1
        answers, ended = client.read(clause=clause, newest=newest)
        oldest = first if retained is None else max(first, newest - retained + 1)
        want = list(range(max(start, oldest), newest + 1))
        got = [seq for seq, _ in answers]
        assert ended, (
            f"{clause}: replay from {start} got {len(answers)} answers (seqs {got[:5]}...) and "
            f"no end marker [b'', -1 (8 bytes, signed), b'']"
        )
        assert got == want, (
            f"{clause}: replay from {start} (retained {oldest}..{newest}) answered seqs "
            f"{got[:8]}{'...' if len(got) > 8 else ''}, expected {want[:8]}"
            f"{'...' if len(want) > 8 else ''}"
        )
        replayed: dict[int, int] = {}
        for seq, payload in answers:
            live = self.pub_payloads.get(seq)
            if live is not None:
                assert payload == live, (
                    f"{clause}: the replay of seq {seq} is not byte-identical to what the "
                    f"PUB socket sent under seq {seq}"
                )
                continue
            # No subscriber saw this seq: which batch the PUB socket sent under it is
            # unknown (a stream numbered out of publishing order is EVT-1's or EVT-2's
            # defect, judged on the stream), so the replay must carry some published
            # batch, and each at most once.
            index = self.index_of(payload)
            assert index is not None, (
                f"{clause}: the replay of seq {seq} carries no published batch")
            assert index not in replayed, (
                f"{clause}: the replay carries batch #{index} under seq {replayed[index]} "
                f"and again under seq {seq}"
            )
            replayed[index] = seq

    def check_served(self, client: ReplayClient, start: int, clause: str) -> None:
        """``clause``: the replay requested from ``start`` is *served*: at least one
        answer, the answers consecutive seqs in order up to the newest published, each
        byte-identical to what the PUB socket sent under that seq (where a subscriber
        saw it).

        Where the replay *starts* (the first answer is ``start``, or the oldest
        retained) and whether the end marker follows are EVT-4's, and only
        :meth:`check_replay` judges them: a clause about something else (hostile
        requests, hostile bytes, authentication) uses this check, so a replay that
        starts one seq late, or has no end marker, fails EVT-4 alone. ``start``
        must leave at least two retained batches, so a late start still answers.
        """
        first = self.offset if self.offset is not None else 0
        newest = first + len(self.model) - 1
        # A malformed answer or end marker (e.g. -1 written unsigned) is EVT-4's too.
        answers, _ended = client.read(clause="EVT-4", newest=newest)
        got = [seq for seq, _ in answers]
        assert got, (
            f"{clause}: a replay from {start} got no answer: the requester was not served"
        )
        assert got == list(range(got[0], newest + 1)) and got[0] >= start, (
            f"{clause}: a replay from {start} answered seqs {got[:8]}"
            f"{'...' if len(got) > 8 else ''} (newest {newest}): not consecutive up to the "
            f"newest"
        )
        for seq, payload in answers:
            live = self.pub_payloads.get(seq)
            assert live is None or payload == live, (
                f"{clause}: the replay of seq {seq} is not byte-identical to what the PUB "
                f"socket sent under seq {seq}"
            )

    def close(self) -> None:
        for peer in list(self.peers):
            peer.close()
        self.peers.clear()
        if self.publisher is not None:
            with contextlib.suppress(Exception):
                watchdog.call("shutdown()", self.publisher.shutdown)
        self.ctx.destroy(0)

    def __enter__(self) -> Rig:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _seq(frame: bytes) -> int:
    return int.from_bytes(frame, "big", signed=True)


def _find(model: list[KVEventBatch], batch: KVEventBatch) -> int | None:
    for index, candidate in enumerate(model):
        if candidate.ts == batch.ts:
            return index
    return None


def _ordinal(n: int) -> str:
    return f"#{n}"
