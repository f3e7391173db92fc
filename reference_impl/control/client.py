"""The reference control client: a DEALER with request ids and lazy-pirate rebuilds.

Why a DEALER and not a REQ: a REQ socket that lost a reply refuses to send
again (EFSM) and cannot have a PING in flight next to a request. The DEALER
sends ``[request id (8 bytes), b"", payload]``; a REP-compatible server
echoes the id frame, so every reply is matched to its own request by id, and
PONGs, registration replies and late replies of abandoned requests are never
taken for the answer the caller waits for (CTL-5).

Lazy pirate: when a request times out, or a PING goes unanswered for the
heartbeat timeout, the socket is closed (linger 0) and a new one connected.
That discards requests still queued for a dead server (they would otherwise
run late, on a server that restarted) and replies that might still arrive,
and it forces a fresh TCP connection, so a half-open one never pins the
client (CTL-4).

Heartbeats: at most one PING in flight; the next one goes out one interval
after the previous was sent. A PING unanswered for ``heartbeat_timeout_ms``
makes ``alive`` False; any reply makes it True again. After a silent
partition the first PING that cannot be answered leaves within one interval,
so detection lands in ``[timeout, timeout + interval]`` (CTL-5).

Wire: ``rep-envelope`` by default; with ``wire="lmcache-mq"`` (or
``"lmcache-0.5"``, where the code is an operation name or legacy int and PING
carries a nil instance id) the DEALER sends ``[request id, request code,
*arguments]`` (a body's values are the
positional arguments) and a reply's result frame is returned as it is, typed
(``True`` for LMCache's PING); a reply without a result frame is that
profile's error reply and raises :class:`RequestRejected` (see
:mod:`reference_impl.control.wire`).

Re-registration: a socket monitor reports every completed ZMTP handshake,
i.e. every (re)connection to a server instance: at start, after the server
restarted, after a partition healed or a rebuild. Each one makes the client
send its ``register`` request by itself, before the caller's next request
(CTL-6).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Mapping
from typing import Any

import msgspec
import zmq

from reference_impl._curve import CurveClient, client_config
from reference_impl._frames import readable as _readable
from reference_impl._frames import recv_frames, send_frames
from reference_impl._monitor import monitor_event
from reference_impl.control import wire as wire_profiles
from reference_impl.control.interface import (
    PING,
    ClientClosed,
    ControlError,
    RequestRejected,
    RequestTimeout,
    is_error_reply,
)

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder()
_instances = itertools.count()
#: Longest gap between two looks at the socket monitor inside request().
_EVENTS_EVERY_S = 0.005
# Plain ints: pyzmq's enum arithmetic costs microseconds per call on the hot path.
_NOBLOCK, _RCVTIMEO = int(zmq.NOBLOCK), int(zmq.RCVTIMEO)


class ControlClient:
    """``ControlClient(endpoint, *, heartbeat_ivl_ms, heartbeat_timeout_ms, request_timeout_ms)``.

    Args:
        endpoint: the server's endpoint (``tcp://host:port``).
        heartbeat_ivl_ms: PING interval.
        heartbeat_timeout_ms: an unanswered PING older than this marks the
            server dead.
        request_timeout_ms: :meth:`request` raises :class:`RequestTimeout`
            after this long without the reply.
        register: ``(type, body)`` sent by the client itself on every
            (re)connection to a server, or ``None``.
        reconnect_ivl_ms / reconnect_ivl_max_ms: libzmq's reconnect backoff.
        curve_client_secret_key, curve_server_key: CURVE, off by default (see
            :mod:`reference_impl._curve`): every socket the client opens,
            rebuilt ones included, is a CURVE client pinned to the server key.
        wire: the wire profile, ``"rep-envelope"``, ``"lmcache-mq"`` or ``"lmcache-0.5"``.
        codes: the positional wires' identifier table (type name -> int code, or on
            lmcache-0.5 an operation name or legacy int); default
            :func:`reference_impl.control.wire.default_codes` of the wire.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        heartbeat_ivl_ms: int = 1000,
        heartbeat_timeout_ms: int = 3000,
        request_timeout_ms: int = 2500,
        register: tuple[str, Mapping[str, Any]] | None = None,
        reconnect_ivl_ms: int = 100,
        reconnect_ivl_max_ms: int = 1000,
        curve_client_secret_key: str | bytes | None = None,
        curve_server_key: str | bytes | None = None,
        wire: str = wire_profiles.REP_ENVELOPE,
        codes: Mapping[str, wire_profiles.Code] | None = None,
    ) -> None:
        self._curve: CurveClient | None = client_config(curve_client_secret_key, curve_server_key)
        for name, value in (
            ("heartbeat_ivl_ms", heartbeat_ivl_ms),
            ("heartbeat_timeout_ms", heartbeat_timeout_ms),
            ("request_timeout_ms", request_timeout_ms),
            ("reconnect_ivl_ms", reconnect_ivl_ms),
            ("reconnect_ivl_max_ms", reconnect_ivl_max_ms),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int (milliseconds), got {value!r}")
        self._mq = wire_profiles.check_profile(wire) in wire_profiles.POSITIONAL
        self._codes = dict(wire_profiles.default_codes(wire) if codes is None else codes)
        # LMCache 0.5's ping carries the worker's instance id; nil is an untracked prober.
        self._ping_frames = self._request_frames(
            PING, wire_profiles.PING_BODY_05 if wire == wire_profiles.LMCACHE_05 else {})
        if register is not None:
            kind, body = register
            self._register_payload: list[bytes] | None = self._request_frames(kind, body)
        else:
            self._register_payload = None
        self.endpoint = endpoint
        self._ivl = heartbeat_ivl_ms / 1000
        self._hb_timeout = heartbeat_timeout_ms / 1000
        self._req_timeout = request_timeout_ms / 1000
        self._reconnect = (reconnect_ivl_ms, reconnect_ivl_max_ms)
        self._instance = next(_instances)
        self._ids = itertools.count(1)
        self._generation = 0
        self._closed = False
        self._alive = True
        self._ping: tuple[int, float] | None = None
        self._next_ping_at = time.monotonic()
        self._need_register = False
        self._registration: tuple[int, float] | None = None
        #: Statistics, for tests and benchmarks.
        self.rebuilds = 0
        self.registrations = 0
        self._awaiting: int | None = None
        self._rcvtimeo = -1
        self._events_due = 0.0
        self._answer: Any = None
        self._answered = False
        self._ctx = zmq.Context()
        self._sock: zmq.Socket[bytes] | None = None
        self._monitor: zmq.Socket[bytes] | None = None
        try:
            self._open()
        except BaseException:
            self._ctx.destroy(linger=0)
            raise

    # -- the interface ---------------------------------------------------------

    @property
    def alive(self) -> bool:
        """False once a PING went unanswered for the heartbeat timeout; True after a reply."""
        return self._alive

    def request(self, type: str, body: Mapping[str, Any]) -> Any:
        """Send ``{"type": type, **body}``; return its success reply or raise (see the module).

        Under ``lmcache-mq`` the reply is the typed result, whatever its type.
        """
        if self._closed:
            raise ClientClosed(f"request({type!r}) on a closed ControlClient")
        payload = self._request_frames(type, body)
        now = time.monotonic()
        if now >= self._events_due:
            # Socket events (a reconnection to register on) at most every few
            # milliseconds: back-to-back requests skip the system call.
            self._events_due = now + _EVENTS_EVERY_S
            assert self._monitor is not None
            if _readable(self._monitor):
                self._drain_monitor()
        self._housekeeping(now)
        rid = next(self._ids)
        self._awaiting, self._answer, self._answered = rid, None, False
        try:
            self._send(rid, payload)
            deadline = time.monotonic() + self._req_timeout
            while not self._answered:
                now = time.monotonic()
                if now >= deadline:
                    self._rebuild()
                    raise RequestTimeout(
                        f"no reply to {type!r} from {self.endpoint} within "
                        f"{self._req_timeout * 1000:.0f} ms (socket rebuilt)"
                    )
                self._io(min(deadline, self._next_event()) - now)
            answer = self._answer
        finally:
            self._awaiting, self._answer, self._answered = None, None, False
        if is_error_reply(answer):
            raise RequestRejected(f"{type!r} rejected by {self.endpoint}: {answer['error']}",
                                  answer)
        return answer

    def tick(self) -> None:
        """Drive heartbeats, registration and socket events; never blocks."""
        if not self._closed:
            self._io(0)

    def close(self) -> None:
        """Close the sockets and terminate the context (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._close_sockets()
        self._ctx.term()

    # -- I/O ---------------------------------------------------------------------

    def _io(self, wait_s: float) -> None:
        """Wait up to ``wait_s`` for a reply, take in replies and events, run due heartbeat work.

        The wait is a blocking receive with ``ZMQ_RCVTIMEO`` (the cheapest
        wait pyzmq offers). Monitor events are read without waiting: they
        only matter at the next heartbeat step, which bounds the wait.
        """
        sock, monitor = self._sock, self._monitor
        assert sock is not None and monitor is not None
        if wait_s > 0:
            # Whole 10 ms steps (never more than asked): the option changes rarely, so
            # back-to-back requests skip the call.
            wait_ms = wait_s * 1000
            timeout = int(wait_ms // 10 * 10) if wait_ms >= 10 else math.ceil(wait_ms)
            if timeout != self._rcvtimeo:
                sock.setsockopt(_RCVTIMEO, timeout)
                self._rcvtimeo = timeout
            # A try block, not contextlib.suppress: no context manager per request.
            try:  # noqa: SIM105
                self._take(recv_frames(sock))
            except zmq.Again:
                pass
            if self._answered:
                return  # the caller's reply: the rest waits for the next call
        elif _readable(sock):
            self._drain_replies()
        if _readable(monitor):
            self._drain_monitor()
        self._housekeeping(time.monotonic())

    def _next_event(self) -> float:
        """When heartbeat work is next due (``time.monotonic()``)."""
        if self._ping is not None:
            return self._ping[1] + self._hb_timeout
        return self._next_ping_at

    def _housekeeping(self, now: float) -> None:
        if self._ping is not None and now - self._ping[1] >= self._hb_timeout:
            self._on_heartbeat_timeout()
            now = time.monotonic()
        if self._ping is None and now >= self._next_ping_at:
            rid = next(self._ids)
            if self._send(rid, self._ping_frames, quiet=True):
                self._ping = (rid, now)
            self._next_ping_at = now + self._ivl
        if self._registration is not None and now - self._registration[1] >= self._req_timeout:
            self._registration = None  # lost: try again below
        if self._need_register and self._registration is None and self._register_payload:
            rid = next(self._ids)
            if self._send(rid, self._register_payload, quiet=True):
                self._registration = (rid, now)

    def _on_heartbeat_timeout(self) -> None:
        """The server is silent: mark it dead and start over on a fresh socket.

        Not while a request waits: its message may sit in this socket's
        queue, about to cross a connection being re-established, and
        :meth:`request` rebuilds on its own timeout anyway.
        """
        self._alive = False
        if self._awaiting is None:
            self._rebuild(carry_ping=False)
        else:
            self._ping = None
        self._next_ping_at = time.monotonic()

    def _send(self, rid: int, payload: list[bytes], *, quiet: bool = False) -> bool:
        assert self._sock is not None
        if self._mq:
            frames = [wire_profiles.encode(rid), *payload]
        else:
            frames = [rid.to_bytes(8, "big"), b"", *payload]
        try:
            send_frames(self._sock, frames, _NOBLOCK)
        except zmq.Again:
            if quiet:
                return False
            raise ControlError(f"send queue to {self.endpoint} is full") from None
        return True

    def _drain_replies(self) -> None:
        sock = self._sock
        assert sock is not None
        while _readable(sock):
            self._take(recv_frames(sock, _NOBLOCK))

    def _take(self, frames: list[bytes]) -> None:
        if self._mq:
            self._take_mq(frames)
            return
        if len(frames) != 3 or len(frames[0]) != 8 or frames[1] != b"":
            return  # not an answer to anything we sent
        try:
            reply = _DECODER.decode(frames[2])
        except (msgspec.DecodeError, ValueError):
            return
        if isinstance(reply, dict):
            self._on_reply(int.from_bytes(frames[0], "big"), reply)

    def _take_mq(self, frames: list[bytes]) -> None:
        rid = wire_profiles.mq_id(frames[0]) if len(frames) in (2, 3) else None
        if rid is None:
            return  # not an answer to anything we sent
        if len(frames) == 2:
            self._on_reply(rid, {"error": "answered without a result (the lmcache-mq error "
                                          "reply)"})
            return
        try:
            result = wire_profiles.decode(frames[2])
        except ValueError:
            return
        self._on_reply(rid, result)

    def _on_reply(self, rid: int, reply: Any) -> None:
        """Route one reply by its request id; anything unmatched is stale and dropped."""
        self._alive = True
        if self._ping is not None and rid == self._ping[0]:
            self._ping = None
        elif self._registration is not None and rid == self._registration[0]:
            self._registration = None
            if not is_error_reply(reply):
                self._need_register = False
                self.registrations += 1
        elif rid == self._awaiting:
            self._answer, self._answered = reply, True

    def _drain_monitor(self) -> None:
        monitor = self._monitor
        assert monitor is not None
        while _readable(monitor):
            frames = monitor.recv_multipart(zmq.NOBLOCK)
            event = monitor_event(frames)
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._on_connected()

    def _on_connected(self) -> None:
        """A ZMTP handshake with a server instance completed: (re-)register."""
        if self._register_payload is not None:
            self._need_register = True
            self._registration = None

    # -- sockets ---------------------------------------------------------------------

    def _open(self) -> None:
        self._generation += 1
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RECONNECT_IVL, self._reconnect[0])
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, self._reconnect[1])
        self._secure(sock)
        address = f"inproc://ctl-client-{self._instance}-{self._generation}"
        sock.monitor(address, zmq.EVENT_HANDSHAKE_SUCCEEDED)
        monitor = self._ctx.socket(zmq.PAIR)
        monitor.setsockopt(zmq.LINGER, 0)
        monitor.connect(address)
        sock.connect(self.endpoint)
        self._sock, self._monitor = sock, monitor
        self._rcvtimeo = -1

    def _secure(self, sock: zmq.Socket[bytes]) -> None:
        """CURVE client options on a socket about to connect (a no-op when CURVE is off)."""
        if self._curve is not None:
            self._curve.apply(sock)

    def _close_sockets(self) -> None:
        # The monitored socket first: closing the monitor's reader first can hang teardown.
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        if self._monitor is not None:
            self._monitor.close(linger=0)
            self._monitor = None

    def _rebuild(self, *, carry_ping: bool = True) -> None:
        """Lazy pirate: a fresh socket; whatever was queued or in flight is abandoned.

        A PING in flight is lost with the socket, but its deadline is not:
        a replacement goes out at once on the new socket and inherits the
        lost one's send time, so a rebuild never postpones detection (CTL-5).
        """
        lost = self._ping if carry_ping else None
        self._close_sockets()
        self._ping = None
        self._registration = None
        self.rebuilds += 1
        self._open()
        if lost is not None:
            rid = next(self._ids)
            if self._send(rid, self._ping_frames, quiet=True):
                self._ping = (rid, lost[1])


    def _request_frames(self, kind: str, body: Mapping[str, Any]) -> list[bytes]:
        """The frames after the request id: one payload, or lmcache-mq's code and arguments."""
        payload = _encode_request(kind, body)  # validates both profiles' inputs alike
        if not self._mq:
            return [payload]
        try:
            return wire_profiles.mq_request(kind, body, self._codes)
        except KeyError as exc:
            raise ValueError(str(exc.args[0])) from None


def _encode_request(kind: str, body: Mapping[str, Any]) -> bytes:
    if not isinstance(kind, str):
        raise TypeError(f"request type must be a str, got {type(kind).__name__}")
    # A plain dict skips the ABC's isinstance (microseconds per request).
    if type(body) is not dict and not isinstance(body, Mapping):
        raise TypeError(f"request body must be a mapping, got {type(body).__name__}")
    if "type" in body:
        raise ValueError("request body must not contain 'type' (it is the first argument)")
    try:
        return _ENCODER.encode({"type": kind, **body})
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"request body is not MessagePack-encodable: {exc}") from None

