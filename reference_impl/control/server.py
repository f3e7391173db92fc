"""The reference control server: one ROUTER, REP-compatible envelopes, never silent.

Every request gets exactly one reply (CTL-1..3): a handler's dict, or an
error reply ``{"error": ...}`` for an unknown type, a malformed request or a
handler that raised. The serve loop never dies because of a request.

Wire: ``rep-envelope`` by default, ``lmcache-mq`` with ``wire="lmcache-mq"``,
``lmcache-0.5`` with ``wire="lmcache-0.5"`` (operation names or legacy ints;
see :mod:`reference_impl.control.wire`); under both positional wires a handler
receives ``{"type": name, "args": [positional arguments]}`` and may return
any MessagePack value (a typed result: the built-in PING returns ``True``,
as LMCache's does), ``None`` for no result frame.

Head of line: ``serial``. Handlers run inline in :meth:`serve`, so a slow
handler delays the requests queued behind it by its own duration and no
more (CTL-7). Replies are sent without blocking: a reply to a client that
vanished, or whose queue is full, is dropped and counted, never waited for.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from typing import Any, ClassVar

import msgspec
import zmq

from reference_impl._curve import CurveServer, ZapHandler, ZapPolicy, server_config
from reference_impl._frames import readable as _readable
from reference_impl._frames import recv_frames, send_frames
from reference_impl.control import wire as wire_profiles
from reference_impl.control.interface import PING, Handler, Message

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder()
# Plain ints: pyzmq's enum arithmetic costs microseconds per call on the hot path.
_NOBLOCK, _RCVTIMEO = int(zmq.NOBLOCK), int(zmq.RCVTIMEO)


def _pong(request: Message) -> Message:
    return {"type": "PONG"}


def _ping_true(request: Message) -> Any:
    return True


class ControlServer:
    """``ControlServer(endpoint, handlers)``: bind a ROUTER on ``endpoint`` and answer requests.

    Args:
        endpoint: where to bind (``tcp://host:port``).
        handlers: request type -> handler, added to the built-in ``PING``.
        max_batch: most requests one :meth:`serve` answers, so a flood cannot
            hold the caller.
        max_message_bytes: frames above this are refused by libzmq
            (``ZMQ_MAXMSGSIZE``): the sender's connection is dropped.
        curve_server_secret_key, curve_allowed_client_keys, curve_zap_handler:
            CURVE, off by default (see :mod:`reference_impl._curve`): the
            ROUTER becomes a CURVE server that lets in only the allowed client
            keys (or whom the handler allows); :meth:`serve` answers the ZAP
            requests.
        wire: the wire profile, ``"rep-envelope"``, ``"lmcache-mq"`` or ``"lmcache-0.5"``.
        codes: the positional wires' identifier table (type name -> int code, or on
            lmcache-0.5 an operation name or legacy int; there every type also answers
            to its name in lower case); default
            :func:`reference_impl.control.wire.default_codes` of the wire.
    """

    #: Declared to the conformance suite (see ``reference_impl.control.interface``).
    zmq_conformance_capabilities: ClassVar[dict[str, Any]] = {
        "request_types": {PING: {}},
        "head_of_line": "serial",
        "authentication": True,
    }

    def __init__(
        self,
        endpoint: str,
        handlers: Mapping[str, Handler] | None = None,
        *,
        max_batch: int = 1000,
        max_message_bytes: int = 16 * 1024 * 1024,
        curve_server_secret_key: str | bytes | None = None,
        curve_allowed_client_keys: Collection[str | bytes] | None = None,
        curve_zap_handler: ZapPolicy | None = None,
        wire: str = wire_profiles.REP_ENVELOPE,
        codes: Mapping[str, wire_profiles.Code] | None = None,
    ) -> None:
        self._curve: CurveServer | None = server_config(
            curve_server_secret_key, curve_allowed_client_keys, curve_zap_handler)
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self._wire = wire_profiles.check_profile(wire)
        self._mq = wire in wire_profiles.POSITIONAL
        table = dict(wire_profiles.default_codes(wire) if codes is None else codes)
        self._names = wire_profiles.operation_names(table, wire)
        self._handlers: dict[str, Handler] = self._builtin_handlers()
        self._handlers.update(handlers or {})
        self._max_batch = max_batch
        self.dropped_replies = 0
        self.served = 0
        self._closed = False
        self._ctx = zmq.Context()
        self._zap: ZapHandler | None = None
        try:
            if self._curve is not None:
                self._zap = ZapHandler(self._ctx, self._curve.policy)
            self._sock = self._ctx.socket(zmq.ROUTER)
            self._sock.setsockopt(zmq.LINGER, 0)
            self._sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
            self._secure(self._sock)
            self._sock.bind(endpoint)
        except BaseException:
            self._ctx.destroy(linger=0)
            raise
        self._rcvtimeo = -1
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        if self._zap is not None:
            self._poller.register(self._zap.socket, zmq.POLLIN)

    def _secure(self, sock: zmq.Socket[bytes]) -> None:
        """CURVE server options on the ROUTER, before bind() (a no-op when CURVE is off)."""
        if self._curve is not None:
            self._curve.apply(sock)

    def _builtin_handlers(self) -> dict[str, Handler]:
        """The protocol's own handlers (a hook for subclasses)."""
        return {PING: _ping_true if self._mq else _pong}

    def serve(self, timeout_ms: int) -> int:
        """Wait up to ``timeout_ms`` for requests, answer up to ``max_batch``; return how many.

        Without CURVE the wait is a blocking receive with ``ZMQ_RCVTIMEO``
        (set only when ``timeout_ms`` changes): libzmq waits on the socket's
        own mailbox exactly as ``zmq_poll`` would, without the poller's
        Python layer and a second call to take the message. With CURVE the
        ZAP socket must be answered while waiting, so the wait is a poll of
        both (:meth:`_wait_authenticating`). What is queued after the first
        request is taken without waiting (``ZMQ_EVENTS``, no exception per
        message).
        """
        if self._closed:
            raise RuntimeError("serve() on a closed ControlServer")
        sock = self._sock
        try:
            if self._zap is None:
                timeout = max(timeout_ms, 0)
                if timeout != self._rcvtimeo:
                    sock.setsockopt(_RCVTIMEO, timeout)
                    self._rcvtimeo = timeout
                frames = recv_frames(sock)
            elif self._wait_authenticating(timeout_ms):
                frames = recv_frames(sock, _NOBLOCK)
            else:
                return 0
        except zmq.Again:  # the wait ended without a request
            return 0
        self._answer(frames)
        answered = 1
        while answered < self._max_batch and _readable(sock):
            self._answer(recv_frames(sock, _NOBLOCK))
            answered += 1
        self.served += answered
        return answered

    def _wait_authenticating(self, timeout_ms: int) -> bool:
        """Wait up to ``timeout_ms`` for a request, answering ZAP requests meanwhile."""
        assert self._zap is not None
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        while True:
            self._zap.serve()
            if _readable(self._sock):
                return True
            left_ms = (deadline - time.monotonic()) * 1000
            if left_ms <= 0:
                return False
            self._poller.poll(max(1, int(left_ms)))

    def _answer(self, frames: list[bytes]) -> None:
        if self._mq:
            self._answer_mq(frames)
            return
        identity, rest = frames[0], frames[1:]
        try:
            split = rest.index(b"")
        except ValueError:
            self._send([identity, b""], {"error": "malformed request: no empty delimiter frame"})
            return
        envelope, body = rest[: split + 1], rest[split + 1 :]
        if len(body) != 1:
            self._send([identity, *envelope],
                       {"error": f"malformed request: {len(body)} payload frames, expected 1"})
            return
        self._send([identity, *envelope], self._reply_to(body[0]))

    def _answer_mq(self, frames: list[bytes]) -> None:
        """``[identity, id, code, *args]``: echo id and code, then the typed result.

        Anything that cannot be answered with a result gets the profile's error
        reply, the echoed frames alone (a message without even an id frame is
        dropped: there is nothing to echo).
        """
        if len(frames) < 2:
            self.dropped_replies += 1
            return
        head = frames[:3]
        if len(frames) < 3 or wire_profiles.mq_id(frames[1]) is None:
            self._send_frames(head)
            return
        try:
            code = wire_profiles.decode(frames[2])
            args = [wire_profiles.decode(frame) for frame in frames[3:]]
        except ValueError:
            self._send_frames(head)
            return
        name = wire_profiles.lookup(self._names, code, self._wire)
        handler = self._handlers.get(name) if name is not None else None
        if name is None or handler is None:
            self._send_frames(head)
            return
        try:
            result = handler({"type": name, "args": args})
            tail = [] if result is None else [wire_profiles.encode(result)]
        except Exception:
            tail = []
        self._send_frames(head + tail)

    def _send_frames(self, frames: list[bytes]) -> None:
        try:
            send_frames(self._sock, frames, _NOBLOCK)
        except zmq.ZMQError:  # EAGAIN (queue full), EHOSTUNREACH: the client is gone
            self.dropped_replies += 1

    def _reply_to(self, payload: bytes) -> Message:
        try:
            request = _DECODER.decode(payload)
        except (msgspec.DecodeError, ValueError) as exc:
            return {"error": f"malformed request: undecodable MessagePack ({exc})"}
        if not isinstance(request, dict):
            return {"error": f"malformed request: a {type(request).__name__}, not a map"}
        kind = request.get("type")
        if not isinstance(kind, str):
            return {"error": "malformed request: no str 'type'"}
        return self._dispatch(kind, request)

    def _dispatch(self, kind: str, request: Message) -> Message:
        """Run the handler for ``kind``; every failure becomes an error reply."""
        handler = self._handlers.get(kind)
        if handler is None:
            return {"error": f"No handler registered for request type {kind}", "type": kind}
        try:
            reply = handler(request)
        except Exception as exc:
            return {"error": f"handler for {kind} raised {type(exc).__name__}: {exc}",
                    "type": kind}
        if not isinstance(reply, dict):
            return {"error": f"handler for {kind} returned a {type(reply).__name__}, not a dict",
                    "type": kind}
        return reply

    def _send(self, head: list[bytes], reply: Message) -> None:
        try:
            payload = _ENCODER.encode(reply)
        except (TypeError, ValueError, OverflowError) as exc:
            payload = _ENCODER.encode({"error": f"unencodable reply: {exc}"})
        try:
            send_frames(self._sock, [*head, payload], _NOBLOCK)
        except zmq.ZMQError:  # EAGAIN (queue full), EHOSTUNREACH: the client is gone
            self.dropped_replies += 1

    def close(self) -> None:
        """Close the socket and terminate the context (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._sock.close(linger=0)
        if self._zap is not None:
            self._zap.close()
        self._ctx.term()

