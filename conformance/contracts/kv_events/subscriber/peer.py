"""The suite's side of the subscriber contract: a raw-socket publisher and a driver.

The subscriber under test connects to a :class:`FakePublisher`, which is a
bare XPUB socket (so the suite sees the subscription arrive and never
publishes into a slow joiner's void) and a bare ROUTER answering replay
requests however the test wants: fully, partially, late, never, with
garbage, or as a new incarnation after :meth:`FakePublisher.restart`. It
speaks the subscriber's declared wire profile
(:mod:`reference_impl.kv_events.wire`): its encoding and schema version,
and replay answers in one layout at a time (``FakePublisher.layout``; for a
subscriber that reads both, ``seq-payload`` unless a test picks another).

Nothing here has a thread: :class:`Session` alternates the subscriber's
``poll()`` (under the watchdog) with :meth:`FakePublisher.pump`, until a
condition holds or a deadline passes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import zmq

from conformance.config.loading import accepts, takes
from conformance.errors import CallBlocked, ConfigError
from conformance.supervision import watchdog
from conformance.supervision.runqueue import OwnDeadline
from reference_impl.kv_events.schema import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Encoding,
    KVEventBatch,
    encode_batch,
    encode_seq,
    first_difference,
)
from reference_impl.kv_events.wire import (
    DEFAULT_REPLAY_LAYOUT,
    ENCODINGS,
    REPLAY_LAYOUTS,
    SCHEMAS,
    ReplayLayout,
    WireProfile,
    encode_payload,
    replay_answer_frames,
    replay_end_frames,
    restrict,
)

__all__ = [
    "SUITE_REPLAY_TIMEOUT_MS",
    "FakePublisher",
    "ReplayRequest",
    "Session",
    "SubscriberSpec",
    "answer_fully",
    "make_batch",
]

#: Replay timeout the suite passes to subscribers that accept ``replay_timeout_ms``.
SUITE_REPLAY_TIMEOUT_MS: Final = 250
#: Heartbeats the suite passes to subscribers that accept them (as for p2p).
SUITE_HEARTBEAT_IVL_MS: Final = 100
SUITE_HEARTBEAT_TIMEOUT_MS: Final = 500
#: Replay timeout assumed for a subscriber that declares none.
UNDECLARED_REPLAY_TIMEOUT_MS: Final = 5000
_POLL_MS: Final = 5
_REBIND_S: Final = 5.0


def make_batch(index: int, salt: int = 0) -> KVEventBatch:
    """A small batch whose content identifies ``index`` (and ``salt``: an incarnation)."""
    kind = index % 3
    events: list[Any]
    if kind == 0:
        events = [BlockStored([index, salt], None if index == 0 else index - 1,
                              [index % 97, salt % 97], 16, None, "GPU")]
    elif kind == 1:
        events = [BlockRemoved([index], "GPU"), AllBlocksCleared()]
    else:
        events = [BlockStored([index.to_bytes(4, "big")], salt, [1, 2, 3], 16, 7, None, "l")]
    return KVEventBatch(ts=1000.0 + index + salt / 1000, events=events,
                        data_parallel_rank=None if salt == 0 else salt % 4)


# --- the subscriber under test ---------------------------------------------------


@dataclass(frozen=True)
class SubscriberSpec:
    """The subscriber factory and what it declares.

    Capabilities (attribute ``zmq_conformance_capabilities`` on the factory,
    overridable): ``encoding`` (``"map"``, ``"array"`` or ``"array-map"``,
    default ``"map"``) and ``schema`` (default ``"base"``): what the suite's
    publisher sends; ``wire``: the replay layouts it reads (``"both"``, the
    default, or one of them); ``replay_timeout_ms`` (the bound EVS-3 allows
    for an unanswered replay; default 5000 ms unless the factory takes
    ``replay_timeout_ms``, in which case the suite passes its own short
    value). A factory that names an ``encoding`` keyword is passed the
    declared encoding.
    """

    name: str
    factory: Callable[..., Any]
    capabilities: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, target: str, overrides: Mapping[str, Any] | None = None) -> SubscriberSpec:
        module_name, sep, attr = target.partition(":")
        if not sep or not module_name or not attr:
            raise ConfigError(f"subscriber factory must be MODULE:ATTR, got {target!r}")
        import importlib

        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"subscriber factory {target!r}: {exc}") from None
        declared = dict(getattr(factory, "zmq_conformance_capabilities", {}) or {})
        declared.update(overrides or {})
        for name, allowed in (("encoding", ENCODINGS), ("schema", tuple(SCHEMAS)),
                              ("wire", ("both", *REPLAY_LAYOUTS))):
            if name in declared and declared[name] not in allowed:
                raise ConfigError(f"subscriber {target}: capability {name!r} must be one of "
                                  f"{', '.join(allowed)}, not {declared[name]!r}")
        return cls(target, factory, declared)

    @property
    def encoding(self) -> Encoding:
        value: Encoding = self.capabilities.get("encoding", "map")
        return value

    @property
    def schema(self) -> str:
        return str(self.capabilities.get("schema", "base"))

    @property
    def layouts(self) -> tuple[ReplayLayout, ...]:
        """The replay layouts the subscriber reads (declared ``wire``; ``both`` by default)."""
        wire = self.capabilities.get("wire", "both")
        if wire == "both":
            return ("seq-payload", "topic-seq-payload")
        return (wire,)

    def profile(self, layout: ReplayLayout | None = None) -> WireProfile:
        """What the suite's publisher speaks to it (replay layout ``layout``, or the first
        it reads)."""
        return WireProfile(layout or self.layouts[0], self.encoding, self.schema)

    @property
    def replay_timeout_ms(self) -> int:
        if accepts(self.factory, "replay_timeout_ms"):
            return SUITE_REPLAY_TIMEOUT_MS
        return int(self.capabilities.get("replay_timeout_ms", UNDECLARED_REPLAY_TIMEOUT_MS))

    def build(self, endpoint: str, replay_endpoint: str, *, topic: str, **extra: Any) -> Any:
        """Build the subscriber with the suite's short settings; ``extra`` (the CURVE
        keywords of :mod:`conformance.testing.credentials`) is passed as it is."""
        kwargs: dict[str, Any] = dict(extra)
        if takes(self.factory, "encoding"):
            kwargs["encoding"] = self.encoding
        if accepts(self.factory, "replay_timeout_ms"):
            kwargs["replay_timeout_ms"] = SUITE_REPLAY_TIMEOUT_MS
        if accepts(self.factory, "heartbeat_ivl_ms"):
            kwargs["heartbeat_ivl_ms"] = SUITE_HEARTBEAT_IVL_MS
        if accepts(self.factory, "heartbeat_timeout_ms"):
            kwargs["heartbeat_timeout_ms"] = SUITE_HEARTBEAT_TIMEOUT_MS
        return watchdog.call("subscriber factory", self.factory, endpoint, replay_endpoint,
                             topic=topic, **kwargs)


# --- the fake publisher --------------------------------------------------------------


@dataclass
class ReplayRequest:
    """A replay request as the fake's ROUTER read it."""

    identity: bytes
    frames: list[bytes]
    at: float

    @property
    def start(self) -> int | None:
        """The requested start, or None if the request is malformed."""
        if len(self.frames) != 2 or self.frames[0] != b"" or len(self.frames[1]) != 8:
            return None
        return int.from_bytes(self.frames[1], "big")


#: How the fake answers a request: called with the fake and the request.
ReplayPolicy = Callable[["FakePublisher", ReplayRequest], None]


def answer_fully(fake: FakePublisher, request: ReplayRequest) -> None:
    """Every retained batch with seq >= start, then the end marker (the contract's answer)."""
    if request.start is not None:
        fake.answer(request.identity, request.start)


class FakePublisher:
    """A publisher played with raw sockets: XPUB for the stream, ROUTER for replays.

    ``history`` maps every seq this incarnation published to its payload;
    :meth:`forget` evicts the oldest (retention). Live sending is separate
    from publishing, so a test can lag, drop or repeat live copies.
    """

    def __init__(self, *, topic: str, encoding: Encoding, salt: int = 0,
                 schema: str = "base", layout: ReplayLayout = DEFAULT_REPLAY_LAYOUT,
                 secure: Callable[[zmq.Socket[bytes]], None] | None = None) -> None:
        #: Applied to both sockets before they bind (a CURVE server, EVS-10).
        self.secure = secure
        self.topic = topic.encode()
        self.encoding: Encoding = encoding
        self.schema = SCHEMAS[schema]
        #: The layout replay answers go out in (a test may change it between requests).
        self.layout: ReplayLayout = layout
        self.salt = salt
        self.ctx = zmq.Context()
        self.history: dict[int, bytes] = {}
        self.batches: dict[int, KVEventBatch] = {}
        self.next_seq = 0
        self.requests: list[ReplayRequest] = []
        self.subscriptions = 0
        self.policy: ReplayPolicy = answer_fully
        self._pub, self._router = self._bind("tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.replay_endpoint = self._router.getsockopt_string(zmq.LAST_ENDPOINT)

    def _bind(self, endpoint: str, replay_endpoint: str) -> tuple[zmq.Socket[bytes],
                                                                  zmq.Socket[bytes]]:
        pub: zmq.Socket[bytes] = self.ctx.socket(zmq.XPUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        pub.setsockopt(zmq.SNDHWM, 100_000)
        router: zmq.Socket[bytes] = self.ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        if self.secure is not None:
            self.secure(pub)
            self.secure(router)
        deadline = time.monotonic() + _REBIND_S
        for sock, where in ((pub, endpoint), (router, replay_endpoint)):
            while True:
                try:
                    sock.bind(where)
                    break
                except zmq.ZMQError as exc:  # a restart rebinds a port just released
                    if exc.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                        pub.close(0)
                        router.close(0)
                        raise
                    time.sleep(0.01)
        return pub, router

    # -- publishing -------------------------------------------------------------

    def publish(self, batch: KVEventBatch | None = None, *, live: bool = True) -> int:
        """Number and retain a batch (a fresh one if None); send it live unless told not to."""
        seq = self.next_seq
        self.next_seq += 1
        if batch is None:
            batch = make_batch(seq, self.salt)
        batch = restrict(batch, self.schema)
        self.batches[seq] = batch
        self.history[seq] = self.encode(batch)
        if live:
            self.send_live(seq)
        return seq

    def encode(self, batch: KVEventBatch) -> bytes:
        """``batch`` as this publisher's profile writes it."""
        if self.schema.name == "base":
            return encode_batch(batch, self.encoding)
        return encode_payload(batch, WireProfile(self.layout, self.encoding, self.schema.name))

    def publish_payload(self, payload: bytes, *, live: bool = True) -> int:
        """Number and retain a raw payload (possibly garbage)."""
        seq = self.next_seq
        self.next_seq += 1
        self.history[seq] = payload
        if live:
            self.send_live(seq)
        return seq

    def send_live(self, seq: int, *, topic: bytes | None = None) -> None:
        self.send_frames([self.topic if topic is None else topic, encode_seq(seq),
                          self.history[seq]])

    def send_frames(self, frames: Iterable[bytes]) -> None:
        self._pub.send_multipart(list(frames))

    def forget(self, below: int) -> None:
        """Stop retaining every seq below ``below``."""
        for seq in [s for s in self.history if s < below]:
            del self.history[seq]

    # -- replay ---------------------------------------------------------------------

    def answer(self, identity: bytes, start: int, *, limit: int | None = None,
               end: bool = True) -> int:
        """Send retained batches from ``start`` (at most ``limit``), then the end marker."""
        sent = 0
        for seq in sorted(s for s in self.history if s >= start):
            if limit is not None and sent >= limit:
                return sent
            self.send_replay(identity, seq, self.history[seq])
            sent += 1
        if end:
            self.send_end(identity)
        return sent

    def send_replay(self, identity: bytes, seq: int, payload: bytes) -> None:
        """One replay answer in :attr:`layout`."""
        frames = replay_answer_frames(self.layout, self.topic, encode_seq(seq), payload)
        self.send_answer(identity, frames[1:])

    def send_end(self, identity: bytes) -> None:
        """The end marker in :attr:`layout`."""
        self.send_answer(identity, replay_end_frames(self.layout)[1:])

    def send_answer(self, identity: bytes, frames: list[bytes]) -> None:
        """Raw frames after the delimiter (garbage included)."""
        with contextlib.suppress(zmq.ZMQError):  # a requester that is gone: drop, as ROUTER
            self._router.send_multipart([identity, b"", *frames], zmq.NOBLOCK)

    def pump(self) -> None:
        """Read subscriptions and replay requests; answer requests by ``policy``."""
        if self._pub.closed:
            return  # gone away (an impostor holds the endpoints)
        while True:
            try:
                message = self._pub.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            if message[:1] == b"\x01":
                self.subscriptions += 1
        while True:
            try:
                frames = self._router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            request = ReplayRequest(frames[0], frames[1:], time.monotonic())
            self.requests.append(request)
            self.policy(self, request)

    # -- life cycle -----------------------------------------------------------------

    def go_away(self) -> None:
        """Close both sockets (the endpoints are free for an impostor) until :meth:`restart`."""
        self._pub.close(0)
        self._router.close(0)

    def restart(self, salt: int) -> None:
        """A new incarnation on the same endpoints: seq from 0, nothing retained."""
        self._pub.close(0)
        self._router.close(0)
        self._pub, self._router = self._bind(self.endpoint, self.replay_endpoint)
        self.salt = salt
        self.history.clear()
        self.batches.clear()
        self.next_seq = 0
        self.subscriptions = 0

    def close(self) -> None:
        self._pub.close(0)
        self._router.close(0)
        self.ctx.term()


# --- driving ---------------------------------------------------------------------------


class Session:
    """One subscriber under test and one fake publisher, driven together.

    ``route`` maps the fake's endpoints to the ones the subscriber is given
    (a proxy in between). ``delivered`` accumulates every ``(seq, batch)`` the subscriber's
    ``poll()`` returned. A ``poll()`` that raises fails the test naming
    ``clause``; one that overruns the watchdog is reported as blocked.
    """

    def __init__(self, spec: SubscriberSpec, *, clause: str, topic: str = "kv",
                 fake_topic: str | None = None,
                 route: Callable[[FakePublisher], tuple[str, str]] | None = None,
                 fake_secure: Callable[[zmq.Socket[bytes]], None] | None = None,
                 **subscriber_options: Any) -> None:
        self.clause = clause
        self.fake = FakePublisher(topic=topic if fake_topic is None else fake_topic,
                                  encoding=spec.encoding, schema=spec.schema,
                                  layout=spec.layouts[0], secure=fake_secure)
        self.delivered: list[tuple[int, Any]] = []
        try:
            endpoint, replay = (route(self.fake) if route is not None
                                else (self.fake.endpoint, self.fake.replay_endpoint))
            self.sub = spec.build(endpoint, replay, topic=topic, **subscriber_options)
        except BaseException:
            self.fake.close()
            raise
        self._closed = False

    def poll_once(self, timeout_ms: int = _POLL_MS) -> None:
        try:
            got = watchdog.call("subscriber poll()", self.sub.poll, timeout_ms)
        except CallBlocked:
            raise
        except Exception as exc:
            raise AssertionError(
                f"{self.clause}: poll() raised {type(exc).__name__}: {exc}"
            ) from exc
        self.delivered.extend(got)
        self.fake.pump()

    def drive_until(self, condition: Callable[[], object], *, timeout: float,
                    what: str) -> None:
        """Alternate poll() and the fake until ``condition()`` holds; fail at ``timeout``
        seconds of own time (:class:`~conformance.supervision.runqueue.OwnDeadline`)."""
        deadline = OwnDeadline(timeout)
        while not condition():
            if deadline.expired():
                seqs = self.seqs()
                shown = str(seqs) if len(seqs) <= 40 else (
                    f"{seqs[:20]} ... {seqs[-20:]} ({len(seqs)} in all)")
                raise AssertionError(f"{self.clause}: timed out after {timeout:.1f} s "
                                     f"waiting for: {what}; delivered seqs {shown}")
            self.poll_once()

    def drive_for(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.poll_once()

    def subscribed(self, count: int = 1, timeout: float = 5.0) -> None:
        """Drive until the fake has seen ``count`` subscriptions (no slow joiner)."""
        self.drive_until(lambda: self.fake.subscriptions >= count, timeout=timeout,
                         what="the subscriber's subscription to reach the publisher")

    def seqs(self) -> list[int]:
        return [seq for seq, _ in self.delivered]

    def check_delivered(self, expected: list[tuple[int, KVEventBatch]]) -> None:
        """The subscriber delivered exactly ``expected``: same seqs, order and content."""
        got = self.seqs()
        want = [seq for seq, _ in expected]
        assert got == want, (
            f"{self.clause}: delivered seqs {got}, expected {want} "
            "(every batch once, in seq order)"
        )
        for (seq, batch), (_, got_batch) in zip(expected, self.delivered, strict=True):
            try:
                diff = first_difference(batch, got_batch)
            except ValueError as exc:
                raise AssertionError(f"{self.clause}: seq {seq}: {exc}") from None
            assert diff is None, f"{self.clause}: seq {seq}: {diff}"

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            watchdog.call("subscriber close()", self.sub.close)
        finally:
            self.fake.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

