"""Mutant transports: the reference transport with one deliberate defect each.

Every class here subclasses :class:`reference_impl.ZmqTransport` (and, where
the defect lives in a connection, :class:`reference_impl.ZmqConnection`) and
overrides as little as possible, usually one method, so the difference from
the reference is obvious when read side by side. Lines that *are* the defect
carry a ``# MUTATION`` comment. :mod:`conformance.selfcheck.mutants` says, for
each class, which real failure mode it models and which clauses must catch it.

Rules every mutant follows:

- **Deterministic defect.** No randomness: the defect fires on a fixed
  condition (the first send after a reconnect, the second poll after a
  restart, ...), so a kill is reproducible. The one exception,
  :class:`DropsSendsAtRandom`, models a race: its drops come from one
  fixed-seed generator per process, so a self-check run (fixed Hypothesis
  seed, fixed test order) is reproducible, while a re-run of the same test in
  the same process draws different drops, which is what the ``flaky`` verdict
  is for.
- **No hang of the whole run.** Mutants that leak sockets keep them on a list
  that :meth:`_LeakyTransport.close` releases before the reference's
  ``close()`` terminates the context; a leaked socket would otherwise make
  ``Context.term()`` hang forever. The leak is still visible to the suite
  between the leaking call and the transport's close, which is exactly the
  window the clauses (CONN-5, RES-2) inspect. Mutants that block do so in a
  way the suite's watchdog can interrupt (a blocking libzmq call), or for a
  bounded time.
- **Only the transport's own state.** Private attributes of the reference
  are fair game; nothing is patched globally, so mutants can run side by side
  with the reference in one process.

Connection mutants set the reference's ``connection_class`` hook to a
:class:`ZmqConnection` subclass carrying the defect; mutants of the monitor
endpoint override its ``_attach_monitor`` hook.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

import msgspec
import zmq

from reference_impl._monitor import monitor_event
from reference_impl.p2p.interface import (
    ConnectionDeadError,
    Message,
    MessageTooLargeError,
    SendQueueFullError,
)
from reference_impl.p2p.transport import (
    _MONITOR_EVENTS,
    DEFAULT_MAX_MESSAGE_BYTES,
    INCARNATION_SEPARATOR,
    ZmqConnection,
    ZmqTransport,
)

__all__ = [
    "AbortsInSend",
    "AssertsOnRegisteredEntry",
    "BoundedReceiveQueue",
    "BytesArriveAsStr",
    "CloseAbandonsContext",
    "CloseForgetsByPeer",
    "CloseLeaksContext",
    "CloseLeaksMonitor",
    "CloseNeverReturns",
    "CurveDroppedAfterReconnect",
    "CurveKeysLogged",
    "CurveSetAfterBind",
    "DisconnectDebounced",
    "DropsFirstSendAfterReconnect",
    "DropsLargeMessagesUndeclared",
    "DropsSendsAtRandom",
    "DropsSendsBeforeHandshake",
    "DuplicateConnectReplaces",
    "DuplicatesOnReconnect",
    "FirstMessageDeferred",
    "FrameCountUnchecked",
    "HandshakeIvlDefault",
    "HeartbeatNotApplied",
    "HeartbeatRouterOnly",
    "HeartbeatSetAfterConnect",
    "HeartbeatTimeoutNotSet",
    "IdentityDecodedUnguarded",
    "IdlePollWaits",
    "IgnoresDisconnectEvents",
    "LargeIntsWrap",
    "MarkDeadDisablesClose",
    "MarkDeadDiscardsInbox",
    "MarkDeadIsLazy",
    "MonitorEndpointFromFd",
    "MonitorEndpointPerPeer",
    "NoReceiveLimit",
    "NoRouterHandover",
    "NonDictPayloadDelivered",
    "OversizeCrashesPoll",
    "PollSpins",
    "ReceiverAcceptsOversize",
    "RecvReturnsOneAtATime",
    "RecvReturnsSharedList",
    "ReordersMessages",
    "ReportsTwiceAfterRestart",
    "RetireWithoutRelease",
    "SendBlocksAtHwm",
    "SendOnDeadQueues",
    "SendUncheckedSize",
    "SweepsAfterRouting",
    "TrustsColonInIdentity",
    "UnboundedPollBatch",
    "UndecodablePayloadRaises",
    "ZapAllowsEveryone",
]

#: A receive limit so large it never triggers (ZMQ_MAXMSGSIZE is an int64).
_NO_LIMIT = 2**62


# ---------------------------------------------------------------------------
# Shared scaffolding (no defects here)
# ---------------------------------------------------------------------------


class _LeakyTransport(ZmqTransport):
    """Keeps sockets a mutant leaks, and closes them only when the transport closes.

    Without this, ``Context.term()`` in the reference's ``close()`` would wait
    forever for the leaked sockets and hang the run instead of failing it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._leaked: list[zmq.Socket[bytes]] = []
        super().__init__(*args, **kwargs)

    def close(self) -> None:
        for sock in self._leaked:
            sock.close(linger=0)
        self._leaked.clear()
        super().close()


def _leak(conn: ZmqConnection, *sockets: zmq.Socket[bytes]) -> None:
    """Leak ``sockets`` until the transport closes (at once if it is closing already)."""
    transport = conn._transport
    assert isinstance(transport, _LeakyTransport)
    if transport.closed:
        for sock in sockets:
            sock.close(linger=0)
    else:
        transport._leaked.extend(sockets)


def _map_values(value: Any, fn: Callable[[Any], Any]) -> Any:
    """Apply ``fn`` to every leaf of a message (dict keys stay as they are)."""
    if isinstance(value, dict):
        return {key: _map_values(item, fn) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_map_values(item, fn) for item in value]
    return fn(value)


# ---------------------------------------------------------------------------
# Connection lifecycle (CONN-*)
# ---------------------------------------------------------------------------


class _HandshakeGatedConnection(ZmqConnection):
    _handshaken = False

    def send(self, msg: Message) -> None:
        if self.alive and not self._handshaken:
            self._transport._encode(msg)  # still validates, as the reference does
            return  # MUTATION: "not connected yet" -- silently dropped
        super().send(msg)

    def _drain_monitor(self) -> None:
        if self._released:
            return
        while True:
            try:
                frames = self._monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            event = monitor_event(frames)
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._handshaken = True
            elif event == zmq.EVENT_DISCONNECTED and self._alive:
                self._alive = False


class DropsSendsBeforeHandshake(ZmqTransport):
    """Sends are silently dropped until ``poll()`` has seen the connection's handshake."""

    connection_class = _HandshakeGatedConnection


class DuplicateConnectReplaces(ZmqTransport):
    """``connect()`` to a peer with a live connection retires it and returns a new one."""

    def connect(self, peer_id: str) -> ZmqConnection:
        existing = self._connections.get(peer_id)
        if existing is not None:
            self._retire(existing)  # MUTATION: also when it is alive
        return super().connect(peer_id)


class AssertsOnRegisteredEntry(ZmqTransport):
    """``connect()`` asserts that no entry is registered, dead or alive."""

    def connect(self, peer_id: str) -> ZmqConnection:
        if peer_id in self._connections:  # MUTATION: ignores whether it is alive
            raise AssertionError(f"already connected to {peer_id}")
        return super().connect(peer_id)


class _FirstSendLost(ZmqConnection):
    _swallow_next = True

    def send(self, msg: Message) -> None:
        if self._swallow_next and self.alive:
            self._swallow_next = False
            self._transport._encode(msg)
            return  # MUTATION: the first message on a replacement connection vanishes
        super().send(msg)


class DropsFirstSendAfterReconnect(ZmqTransport):
    """Only the first send on a connection that replaced a dead entry is lost."""

    def connect(self, peer_id: str) -> ZmqConnection:
        replaces = peer_id in self._connections
        conn = super().connect(peer_id)
        if replaces:
            conn.__class__ = _FirstSendLost
        return conn


class RetireWithoutRelease(_LeakyTransport):
    """Retiring a dead connection unregisters it but never closes its sockets."""

    def _retire(self, conn: ZmqConnection) -> None:
        conn._alive = False
        self._forget(conn)
        if not conn._released:  # MUTATION: no conn._release()
            _leak(conn, conn._dealer, conn._monitor)


class _InboxDiscardingConnection(ZmqConnection):
    def mark_dead(self) -> None:
        super().mark_dead()
        self._inbox.clear()  # MUTATION


class MarkDeadDiscardsInbox(ZmqTransport):
    """``mark_dead()`` throws away messages that were received but not yet read."""

    connection_class = _InboxDiscardingConnection


class _LazyDeathConnection(ZmqConnection):
    _doomed = False

    def mark_dead(self) -> None:
        self._doomed = True  # MUTATION: takes effect at the next poll()

    def _drain_monitor(self) -> None:
        if self._doomed:
            self._alive = False
        super()._drain_monitor()


class MarkDeadIsLazy(ZmqTransport):
    """``mark_dead()`` only takes effect at the next ``poll()``."""

    connection_class = _LazyDeathConnection


class _MarkDeadSetsReleased(ZmqConnection):
    def mark_dead(self) -> None:
        super().mark_dead()
        self._released = True  # MUTATION: the very flag close() (via _release) guards on
        _leak(self, self._dealer, self._monitor)


class MarkDeadDisablesClose(_LeakyTransport):
    """``mark_dead()`` sets the flag ``close()`` checks: close() and the sweep release nothing."""

    connection_class = _MarkDeadSetsReleased


class _MonitorLeakingConnection(ZmqConnection):
    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        with contextlib.suppress(zmq.ZMQError):
            self._dealer.disable_monitor()
        self._dealer.close(linger=0)
        _leak(self, self._monitor)  # MUTATION: the monitor's reader is never closed


class CloseLeaksMonitor(_LeakyTransport):
    """Closing or retiring a connection leaks its monitor socket (and nothing else)."""

    connection_class = _MonitorLeakingConnection


class _CloseByPeerConnection(ZmqConnection):
    def close(self) -> None:
        self._alive = False
        self._release()
        del self._transport._connections[self._peer_id]  # MUTATION: by peer, unchecked


class CloseForgetsByPeer(ZmqTransport):
    """``close()`` unregisters by peer id: a second close raises ``KeyError``."""

    connection_class = _CloseByPeerConnection


class _SendChecksClosedOnly(ZmqConnection):
    def send(self, msg: Message) -> None:
        if self._released:  # MUTATION: ignores mark_dead() and detected deaths
            raise ConnectionDeadError(f"send() on closed connection to {self._peer_id}")
        payload = self._transport._encode(msg)
        try:
            self._dealer.send(payload, zmq.NOBLOCK)
        except zmq.Again:
            raise SendQueueFullError(f"send queue to {self._peer_id} is full") from None


class SendOnDeadQueues(ZmqTransport):
    """``send()`` on a dead (not closed) connection queues instead of raising."""

    connection_class = _SendChecksClosedOnly


class MonitorEndpointPerPeer(ZmqTransport):
    """The inproc monitor endpoint is derived from the peer alone."""

    def _attach_monitor(self, dealer: zmq.Socket[bytes], peer_id: str) -> zmq.Socket[bytes]:
        endpoint = f"inproc://monitor-{peer_id}"  # MUTATION: reused on every reconnect
        dealer.monitor(endpoint, _MONITOR_EVENTS)
        monitor: zmq.Socket[bytes] = self._ctx.socket(zmq.PAIR)
        monitor.setsockopt(zmq.LINGER, 0)
        monitor.connect(endpoint)
        return monitor


class MonitorEndpointFromFd(ZmqTransport):
    """The monitor comes from pyzmq's ``get_monitor_socket()`` (endpoint from the fd number)."""

    def _attach_monitor(self, dealer: zmq.Socket[bytes], peer_id: str) -> zmq.Socket[bytes]:
        monitor = dealer.get_monitor_socket(_MONITOR_EVENTS)  # MUTATION: inproc://monitor.s-<fd>
        monitor.setsockopt(zmq.LINGER, 0)
        return monitor


class _RemembersLastSent(ZmqConnection):
    _last_sent: Message | None = None

    def send(self, msg: Message) -> None:
        super().send(msg)
        self._last_sent = msg


class DuplicatesOnReconnect(ZmqTransport):
    """A reconnect replays the last message sent on the connection it replaces."""

    connection_class = _RemembersLastSent

    def connect(self, peer_id: str) -> ZmqConnection:
        old = self._connections.get(peer_id)
        conn = super().connect(peer_id)
        last = getattr(old, "_last_sent", None)
        if last is not None:
            conn.send(last)  # MUTATION: at-least-once "retry" without de-duplication
        return conn


# ---------------------------------------------------------------------------
# Polling and routing (POLL-*)
# ---------------------------------------------------------------------------


class ReportsTwiceAfterRestart(ZmqTransport):
    """An inbound connection from a peer seen before is returned by two polls."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._seen: set[str] = set()
        self._report_again: list[ZmqConnection] = []

    def poll(self) -> list[ZmqConnection]:
        again, self._report_again = self._report_again, []
        return again + super().poll()  # MUTATION: re-announced on the next poll

    def _route(self, frames: list[bytes], new: list[ZmqConnection]) -> None:
        known = len(new)
        super()._route(frames, new)
        for conn in new[known:]:
            if conn.peer_id in self._seen:
                self._report_again.append(conn)
            self._seen.add(conn.peer_id)


class FirstMessageDeferred(ZmqTransport):
    """A new inbound connection is returned before its first message is readable."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deferred: list[tuple[ZmqConnection, Message]] = []

    def poll(self) -> list[ZmqConnection]:
        deferred, self._deferred = self._deferred, []
        for conn, msg in deferred:
            conn._deliver(msg)
        return super().poll()

    def _route(self, frames: list[bytes], new: list[ZmqConnection]) -> None:
        known = len(new)
        super()._route(frames, new)
        for conn in new[known:]:
            # MUTATION: the messages that opened the connection wait for the next poll()
            self._deferred.extend((conn, msg) for msg in conn.recv())


class SweepsAfterRouting(ZmqTransport):
    """``poll()`` routes traffic first and retires dead connections afterwards."""

    def poll(self) -> list[ZmqConnection]:
        self._check_open()
        new: list[ZmqConnection] = []
        for _ in range(self.poll_batch):  # MUTATION: routing moved before the sweep
            try:
                frames = self._router.recv_multipart(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                break
            self._route(frames, new)
        for conn in list(self._connections.values()):
            conn._drain_monitor()
        for conn in [c for c in self._connections.values() if not c.alive]:
            self._retire(conn)
        return new


class FrameCountUnchecked(ZmqTransport):
    """``poll()`` unpacks identity and payload without checking the frame count."""

    def _route(self, frames: list[bytes], new: list[ZmqConnection]) -> None:
        identity, payload = frames  # MUTATION: ValueError out of poll() on 1 or 3+ frames
        super()._route([identity, payload], new)


class IdentityDecodedUnguarded(ZmqTransport):
    """The routing identity is decoded outside any error handling."""

    def _route(self, frames: list[bytes], new: list[ZmqConnection]) -> None:
        if len(frames) == 2:
            frames[0].decode("utf-8")  # MUTATION: UnicodeDecodeError out of poll()
        super()._route(frames, new)


class TrustsColonInIdentity(ZmqTransport):
    """A UTF-8 routing identity is split on ``:`` and its port parsed, unguarded."""

    def _route(self, frames: list[bytes], new: list[ZmqConnection]) -> None:
        if len(frames) == 2:
            try:
                text = frames[0].decode("utf-8")
            except UnicodeDecodeError:
                text = None
            if text is not None:
                # The reference's incarnation tag is split off; the rest is trusted.
                peer_id = text.partition(INCARNATION_SEPARATOR)[0]
                _host, port = peer_id.rsplit(":", 1)  # MUTATION: ValueError without ':'
                int(port)  # MUTATION: ValueError on a non-numeric port
        super()._route(frames, new)


class UndecodablePayloadRaises(ZmqTransport):
    """The MessagePack payload is decoded outside any error handling."""

    def _route(self, frames: list[bytes], new: list[ZmqConnection]) -> None:
        if len(frames) == 2 and len(frames[1]) <= self.max_message_bytes:
            self._decoder.decode(frames[1])  # MUTATION: DecodeError out of poll()
        super()._route(frames, new)


class NonDictPayloadDelivered(ZmqTransport):
    """A payload that decodes to a non-dict (list, str, int, ...) is handed to the caller.

    The reference decodes with ``Decoder(dict[str, Any])``, which rejects
    anything but a string-keyed map; this mutant decodes untyped, the common
    ``msgpack.unpackb(payload)`` pattern, and checks nothing afterwards.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._decoder = msgspec.msgpack.Decoder()  # MUTATION: untyped decoding


class OversizeCrashesPoll(ZmqTransport):
    """No receive limit in libzmq; the size check in ``poll()`` raises instead of dropping."""

    def __init__(self, *args: Any, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 **kwargs: Any) -> None:
        super().__init__(*args, max_message_bytes=_NO_LIMIT, **kwargs)  # MUTATION: no MAXMSGSIZE
        self.max_message_bytes = max_message_bytes

    def _route(self, frames: list[bytes], new: list[ZmqConnection]) -> None:
        if len(frames) == 2 and len(frames[1]) > self.max_message_bytes:
            raise MessageTooLargeError(f"inbound frame of {len(frames[1])} bytes")  # MUTATION
        super()._route(frames, new)


class IdlePollWaits(ZmqTransport):
    """``poll()`` waits up to 150 ms for traffic when there is none."""

    idle_wait_ms: ClassVar[int] = 150

    def poll(self) -> list[ZmqConnection]:
        self._check_open()
        self._router.poll(self.idle_wait_ms)  # MUTATION: blocks when idle
        return super().poll()


class _DeafConnection(ZmqConnection):
    def _drain_monitor(self) -> None:
        if self._released:
            return
        while True:
            try:
                self._monitor.recv_multipart(zmq.NOBLOCK)  # MUTATION: events read, ignored
            except zmq.Again:
                return


class IgnoresDisconnectEvents(ZmqTransport):
    """Monitor events are drained but a disconnect never marks the connection dead."""

    connection_class = _DeafConnection


class _DebouncedConnection(ZmqConnection):
    grace_s: ClassVar[float] = 10.0
    _lost_at: float | None = None

    def _drain_monitor(self) -> None:
        if self._released:
            return
        while True:
            try:
                frames = self._monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            event = monitor_event(frames)
            if event == zmq.EVENT_DISCONNECTED and self._lost_at is None:
                self._lost_at = time.monotonic()  # MUTATION: only remembered
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._lost_at = None
        if self._lost_at is not None and time.monotonic() - self._lost_at > self.grace_s:
            self._alive = False  # MUTATION: dead only after a long grace period


class DisconnectDebounced(ZmqTransport):
    """A disconnect marks the connection dead only if it lasts 10 s ("ride out blips")."""

    connection_class = _DebouncedConnection


class UnboundedPollBatch(ZmqTransport):
    """``poll()`` routes until the ROUTER is empty, however long a flood lasts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.poll_batch = 2**62  # MUTATION: no bound on one poll()'s work


# ---------------------------------------------------------------------------
# Messages (MSG-*)
# ---------------------------------------------------------------------------


class BytesArriveAsStr(ZmqTransport):
    """bytes values are sent as MessagePack str (old "raw" type): they arrive as str."""

    def _encode(self, msg: Message) -> bytes:
        if isinstance(msg, dict):
            # MUTATION: bytes -> str, like msgpack's use_bin_type=False
            msg = _map_values(msg, lambda v: v.decode("latin-1") if isinstance(v, bytes) else v)
        return super()._encode(msg)


def _wrap_int64(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 2**63:
        return value - 2**64  # MUTATION: unsigned 64-bit read as signed
    return value


class LargeIntsWrap(ZmqTransport):
    """Integers from 2**63 up arrive negative (an int64 where uint64 was needed)."""

    def _encode(self, msg: Message) -> bytes:
        if isinstance(msg, dict):
            msg = _map_values(msg, _wrap_int64)
        return super()._encode(msg)


class _PairSwappingConnection(ZmqConnection):
    _held: Message | None = None

    def send(self, msg: Message) -> None:
        if self._held is None and self.alive:
            self._transport._encode(msg)
            self._held = msg  # MUTATION: held back until the next send (or poll)
            return
        super().send(msg)
        self._flush()

    def _flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and self.alive:
            super().send(held)


class ReordersMessages(ZmqTransport):
    """Two sends between polls go out in swapped order."""

    connection_class = _PairSwappingConnection

    def poll(self) -> list[ZmqConnection]:
        for conn in list(self._connections.values()):
            if isinstance(conn, _PairSwappingConnection):
                conn._flush()
        return super().poll()


class _SharedListConnection(ZmqConnection):
    _returned: list[Message] | None = None

    def recv(self) -> list[Message]:
        if self._returned is None:
            self._returned = []
        self._returned.clear()  # MUTATION: the caller's previous result is emptied
        self._returned.extend(self._inbox)
        self._inbox.clear()
        return self._returned


class RecvReturnsSharedList(ZmqTransport):
    """``recv()`` returns the same list object every time and refills it."""

    connection_class = _SharedListConnection


class _OneAtATimeConnection(ZmqConnection):
    def recv(self) -> list[Message]:
        return [self._inbox.popleft()] if self._inbox else []  # MUTATION: one per call


class RecvReturnsOneAtATime(ZmqTransport):
    """``recv()`` returns one message per call instead of everything pending."""

    connection_class = _OneAtATimeConnection


class _BlockingSendConnection(ZmqConnection):
    def send(self, msg: Message) -> None:
        if not self.alive:
            raise ConnectionDeadError(f"send() on dead connection to {self._peer_id}")
        self._dealer.send(self._transport._encode(msg))  # MUTATION: no zmq.NOBLOCK


class SendBlocksAtHwm(ZmqTransport):
    """``send()`` is a blocking libzmq send: instant until the high-water mark, then stuck."""

    connection_class = _BlockingSendConnection


class _LargeDroppingConnection(ZmqConnection):
    def send(self, msg: Message) -> None:
        if self.alive and len(self._transport._encode(msg)) > 64 * 1024:
            return  # MUTATION: a hidden 64 KiB buffer; larger messages vanish
        super().send(msg)


class DropsLargeMessagesUndeclared(ZmqTransport):
    """Messages over 64 KiB are silently dropped, and no ``max_message_bytes`` is declared."""

    connection_class = _LargeDroppingConnection
    zmq_conformance_capabilities: ClassVar[dict[str, Any]] = {  # type: ignore[misc]
        key: value for key, value in ZmqTransport.zmq_conformance_capabilities.items()
        if key != "max_message_bytes"  # MUTATION: the limit is not declared
    }


class _RandomlyDroppingConnection(ZmqConnection):
    def send(self, msg: Message) -> None:
        transport = self._transport
        assert isinstance(transport, DropsSendsAtRandom)
        if self.alive and transport.rng.random() < transport.drop_probability:
            transport._encode(msg)
            return  # MUTATION: a race that loses about one message in 3000
        super().send(msg)


class DropsSendsAtRandom(ZmqTransport):
    """``send()`` silently loses a message with probability 1/3000 (a race, not a rule).

    The drops come from one generator per process with a fixed seed, shared by
    every instance: the same sequence of sends in a fresh process loses the
    same messages, a re-run in the same process continues the sequence. A
    subclass may set its own ``drop_probability`` and ``rng``.
    """

    connection_class = _RandomlyDroppingConnection
    drop_probability: ClassVar[float] = 1 / 3000
    rng: ClassVar[random.Random] = random.Random(93)


class SendUncheckedSize(ZmqTransport):
    """``send()`` does not enforce the size limit (only the receiver does)."""

    def _encode(self, msg: Message) -> bytes:
        if not isinstance(msg, dict):
            raise TypeError(f"a message must be a dict, not {type(msg).__name__}")
        if not all(isinstance(key, str) for key in msg):
            raise TypeError("a message's keys must be strings")
        return self._encoder.encode(msg)  # MUTATION: no max_message_bytes check


class ReceiverAcceptsOversize(ZmqTransport):
    """No receive limit at all: oversize frames are delivered (only send() checks)."""

    def __init__(self, *args: Any, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 **kwargs: Any) -> None:
        super().__init__(*args, max_message_bytes=_NO_LIMIT, **kwargs)  # MUTATION
        self._send_limit = max_message_bytes

    def _encode(self, msg: Message) -> bytes:
        payload = super()._encode(msg)
        if len(payload) > self._send_limit:
            raise MessageTooLargeError(
                f"encoded message is {len(payload)} bytes; the limit is {self._send_limit}"
            )
        return payload


# ---------------------------------------------------------------------------
# Resources (RES-*)
# ---------------------------------------------------------------------------


class CloseLeaksContext(ZmqTransport):
    """``close()`` closes every socket but never terminates the context."""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for conn in list(self._connections.values()):
            conn._alive = False
            conn._release()
        self._connections.clear()
        self._router.close(linger=0)
        # MUTATION: no self._ctx.term(): libzmq's I/O and reaper threads and their
        # descriptors stay until the context is garbage-collected.


class CloseAbandonsContext(ZmqTransport):
    """``close()`` closes the ROUTER, then forgets its connections and its context."""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._router.close(linger=0)
        # MUTATION: the DEALERs, their monitors and the context stay open; the
        # transport drops its references and leaves them to the garbage collector,
        # whose Context.__del__ then waits in term() for sockets nobody closes.
        self._connections = {}
        del self._ctx


# ---------------------------------------------------------------------------
# Misbehaving processes: calls that never return, crash or spin
# ---------------------------------------------------------------------------


class CloseNeverReturns(ZmqTransport):
    """``close()`` releases everything, then waits forever for a peer that never answers."""

    def close(self) -> None:
        already = self._closed
        super().close()
        if not already:
            # MUTATION: a "goodbye" handshake whose answer never comes; no timeout.
            threading.Event().wait()


class _AbortingConnection(ZmqConnection):
    def send(self, msg: Message) -> None:
        if not self.inbound:
            os.abort()  # MUTATION: libzmq's zmq_assert firing, in effect
        super().send(msg)


class AbortsInSend(ZmqTransport):
    """``send()`` on an outbound connection kills the process (an assertion in C code)."""

    connection_class = _AbortingConnection


class BoundedReceiveQueue(ZmqTransport):
    """Every socket keeps libzmq's bounded receive queue, as most transports do.

    Harmless until a peer fills the ROUTER's queue while the node is busy and
    then closes: with heartbeats on, libzmq 4.3 then aborts the process.
    """

    def _apply_common_options(self, sock: zmq.Socket[bytes]) -> None:
        super()._apply_common_options(sock)
        sock.setsockopt(zmq.RCVHWM, 1000)  # MUTATION: libzmq's default, bounded


class PollSpins(ZmqTransport):
    """``poll()`` busy-waits, forever, for a connection to become ready."""

    def poll(self) -> list[ZmqConnection]:
        new = super().poll()
        if self._connections:
            while True:  # MUTATION: waits for a readiness flag nothing ever sets
                pass
        return new


# ---------------------------------------------------------------------------
# Heartbeats (HB-*, chaos)
# ---------------------------------------------------------------------------


class HeartbeatNotApplied(ZmqTransport):
    """No ZMTP heartbeat options on any socket."""

    def _apply_common_options(self, sock: zmq.Socket[bytes]) -> None:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.HANDSHAKE_IVL, self.handshake_ivl_ms)
        # MUTATION: HEARTBEAT_IVL / _TIMEOUT / _TTL never set


class HeartbeatRouterOnly(ZmqTransport):
    """Heartbeat options on the bound ROUTER only; the DEALERs never PING.

    The DEALERs (whose monitors are the only liveness signal) then notice a
    partition only through the remote ROUTER's TTL, not their own timeout.
    """

    def _apply_common_options(self, sock: zmq.Socket[bytes]) -> None:
        if sock.type == zmq.ROUTER:  # MUTATION
            super()._apply_common_options(sock)
            return
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.HANDSHAKE_IVL, self.handshake_ivl_ms)


class HeartbeatTimeoutNotSet(ZmqTransport):
    """Only HEARTBEAT_IVL is set: the timeout defaults to the interval, TTL to none."""

    def _apply_common_options(self, sock: zmq.Socket[bytes]) -> None:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.HEARTBEAT_IVL, self.heartbeat_ivl_ms)
        sock.setsockopt(zmq.HANDSHAKE_IVL, self.handshake_ivl_ms)
        # MUTATION: HEARTBEAT_TIMEOUT and HEARTBEAT_TTL never set


class HeartbeatSetAfterConnect(HeartbeatNotApplied):
    """Heartbeat options are set after ``bind()``/``connect()``, where libzmq ignores them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._set_heartbeats(self._router)  # MUTATION: after bind()

    def _open_dealer(self, peer_id: str) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
        dealer, monitor = super()._open_dealer(peer_id)
        self._set_heartbeats(dealer)  # MUTATION: after connect()
        return dealer, monitor

    def _set_heartbeats(self, sock: zmq.Socket[bytes]) -> None:
        sock.setsockopt(zmq.HEARTBEAT_IVL, self.heartbeat_ivl_ms)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, self.heartbeat_timeout_ms)
        sock.setsockopt(zmq.HEARTBEAT_TTL, self.heartbeat_ttl_ms)


class HandshakeIvlDefault(ZmqTransport):
    """ZMQ_HANDSHAKE_IVL left at libzmq's 30 s: a swallowed reconnect stalls recovery."""

    def _apply_common_options(self, sock: zmq.Socket[bytes]) -> None:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.HEARTBEAT_IVL, self.heartbeat_ivl_ms)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, self.heartbeat_timeout_ms)
        sock.setsockopt(zmq.HEARTBEAT_TTL, self.heartbeat_ttl_ms)
        # MUTATION: HANDSHAKE_IVL not set (30 000 ms)


class NoRouterHandover(ZmqTransport):
    """The ROUTER is bound without ZMQ_ROUTER_HANDOVER.

    Its DEALERs present the plain ``local_id``, the common shape: the
    reference tags each DEALER's identity, so a reconnect of its own never
    needs a handover, but a peer of the plain shape (or a DEALER that
    reconnects itself) does.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The reference sets ROUTER_HANDOVER before bind(); unlike most options
        # it is read per connection, so clearing it here takes effect.
        self._router.setsockopt(zmq.ROUTER_HANDOVER, 0)  # MUTATION

    def _routing_id(self) -> bytes:
        return self.local_id.encode()  # the plain shape's identity, reused by every DEALER


# -- authentication (SEC-2) ---------------------------------------------------------


class CurveSetAfterBind(ZmqTransport):
    """The ROUTER's CURVE server options are set after ``bind()``, where libzmq ignores
    them: the listener accepts plain peers (DEALERs are still CURVE clients)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self._curve_server is not None:
            self._curve_server.apply(self._router)  # MUTATION: after bind()

    def _secure_router(self, router: zmq.Socket[bytes]) -> None:
        pass  # MUTATION: nothing before bind()


class ZapAllowsEveryone(ZmqTransport):
    """The ZAP handler answers 200 to every CURVE client: anyone who knows the server's
    public key gets in."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self._zap is not None:
            self._zap._policy = lambda client_key, address: True  # MUTATION: allow all


class CurveKeysLogged(ZmqTransport):
    """The configuration, secret keys included, is logged at DEBUG when CURVE is on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self._curve_server is not None and self._curve_client is not None:
            logging.getLogger("reference_impl").debug(
                "CURVE on: server secret %s, client secret %s",  # MUTATION: keys logged
                self._curve_server.secret_key.decode(), self._curve_client.secret_key.decode())


class CurveDroppedAfterReconnect(ZmqTransport):
    """Only the first DEALER to each peer is a CURVE client; a reconnect (CONN-3) opens a
    plain one, which the peer's CURVE ROUTER refuses."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._secured_peers: set[str] = set()
        super().__init__(*args, **kwargs)

    def _open_dealer(self, peer_id: str) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
        self._next_peer = peer_id
        return super()._open_dealer(peer_id)

    def _secure_dealer(self, dealer: zmq.Socket[bytes]) -> None:
        if self._next_peer in self._secured_peers:
            return  # MUTATION: a reconnect's DEALER is plain
        self._secured_peers.add(self._next_peer)
        super()._secure_dealer(dealer)


class NoReceiveLimit(ZmqTransport):
    """No ZMQ_MAXMSGSIZE on the ROUTER (oversize messages are still dropped by poll()):
    a raw peer announcing a huge frame makes libzmq buffer every byte it sends."""

    def _secure_router(self, router: zmq.Socket[bytes]) -> None:
        router.setsockopt(zmq.MAXMSGSIZE, -1)  # MUTATION: no receive limit
        super()._secure_router(router)
