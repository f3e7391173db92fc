"""Mutants of the control-channel reference: one real defect each, and the clause that kills it.

Each entry of :data:`CATALOG` names an implementation object
(``MODULE:ATTR`` with ``server``/``client`` factories) that differs from
``reference_impl.control:REFERENCE`` by one defect seen in deployed control
channels. ``zmq-conformance self-check --contract control`` runs the suite
against each and reports the clauses that failed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Final

import msgspec
import zmq

from conformance.selfcheck.mutants import Mutant
from reference_impl.control import (
    ControlClient,
    ControlImplementation,
    ControlServer,
    Handler,
    Message,
    RequestRejected,
    RequestTimeout,
    is_error_reply,
)

BASE: Final = "reference_impl.control:REFERENCE"
_M = "conformance.contracts.control.mutants"


# -- servers -------------------------------------------------------------------


class NoPingServer(ControlServer):
    """Declares PING but registers no handler for it: "No handler registered ... PING" forever."""

    def _builtin_handlers(self) -> dict[str, Handler]:
        return {}


class SilentOnUnknownServer(ControlServer):
    """Logs an unknown request type and sends nothing back."""

    def _send(self, head: list[bytes], reply: Message) -> None:
        if str(reply.get("error", "")).startswith("No handler registered"):
            return
        super()._send(head, reply)


class RaisingHandlerKillsLoopServer(ControlServer):
    """Calls handlers without a guard: an exception escapes serve() and ends the loop."""

    def _dispatch(self, kind: str, request: Message) -> Message:
        handler = self._handlers.get(kind)
        if handler is None:
            return super()._dispatch(kind, request)
        return handler(request)


class BlockingReplyServer(ControlServer):
    """ROUTER_MANDATORY and a blocking send: a client that stops reading stalls everyone."""

    def __init__(self, endpoint: str, handlers: Mapping[str, Handler] | None = None,
                 **options: Any) -> None:
        super().__init__(endpoint, handlers, **options)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)

    def _send(self, head: list[bytes], reply: Message) -> None:
        try:
            self._sock.send_multipart([*head, msgspec.msgpack.encode(reply)])
        except zmq.ZMQError:
            self.dropped_replies += 1


# -- clients -------------------------------------------------------------------


class ArrivalMatchedClient(ControlClient):
    """Hands the waiting request whatever reply arrives first (a PONG, a late reply)."""

    def _on_reply(self, rid: int, reply: Message) -> None:
        if self._awaiting is not None and self._answer is None:
            self._answer = reply
            self._alive = True
            if self._ping is not None and rid == self._ping[0]:
                self._ping = None
            return
        super()._on_reply(rid, reply)


class RegistersOnceClient(ControlClient):
    """Registers on its first connection only; a restarted server never hears of it."""

    _registered_once = False

    def _on_connected(self) -> None:
        if not self._registered_once:
            self._registered_once = True
            super()._on_connected()


class NeverDeadClient(ControlClient):
    """Sends PINGs but never marks the server dead when they go unanswered."""

    def _on_heartbeat_timeout(self) -> None:
        self._ping = None
        self._next_ping_at = time.monotonic()


class StuckReqClient:
    """A REQ socket kept after a timeout: every later send raises EFSM (no lazy pirate)."""

    def __init__(self, endpoint: str, *, heartbeat_ivl_ms: int = 1000,
                 heartbeat_timeout_ms: int = 3000, request_timeout_ms: int = 2500,
                 register: tuple[str, Mapping[str, Any]] | None = None) -> None:
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.REQ)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(endpoint)
        self._ivl, self._hb = heartbeat_ivl_ms / 1000, heartbeat_timeout_ms / 1000
        self._timeout = request_timeout_ms / 1000
        self._register = register
        self._ping_sent: float | None = None
        self._next_ping = time.monotonic()
        self.alive = True

    def request(self, type: str, body: Mapping[str, Any]) -> Message:
        self._settle_ping(self._hb)
        if self._register is not None:
            kind, reg = self._register
            self._register = None
            self.request(kind, reg)
        self._sock.send(msgspec.msgpack.encode({"type": type, **body}))
        if not self._sock.poll(int(self._timeout * 1000)):
            raise RequestTimeout(f"no reply to {type!r}")
        reply: Message = msgspec.msgpack.decode(self._sock.recv())
        self.alive = True
        if is_error_reply(reply):
            raise RequestRejected(str(reply["error"]), reply)
        return reply

    def _settle_ping(self, wait_s: float) -> None:
        if self._ping_sent is None:
            return
        if self._sock.poll(int(wait_s * 1000)):
            self._sock.recv()
            self.alive = True
            self._ping_sent = None
        elif time.monotonic() - self._ping_sent >= self._hb:
            self.alive = False
            self._ping_sent = None

    def tick(self) -> None:
        self._settle_ping(0)
        now = time.monotonic()
        if self._ping_sent is None and now >= self._next_ping:
            self._next_ping = now + self._ivl
            try:
                self._sock.send(msgspec.msgpack.encode({"type": "PING"}))
                self._ping_sent = now
            except zmq.ZMQError:
                self.alive = False

    def close(self) -> None:
        self._sock.close(linger=0)
        self._ctx.term()


# -- implementations and the catalog ---------------------------------------------

class ZapAllowsEveryoneServer(ControlServer):
    """Its ZAP handler answers 200 to every CURVE client: anyone who knows the server's
    public key is served."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self._zap is not None:
            self._zap._policy = lambda client_key, address: True  # MUTATION: allow all


class PlainAfterRebuildClient(ControlClient):
    """Only its first socket is a CURVE client: a lazy-pirate rebuild connects in
    plaintext, to whatever listens on the endpoint."""

    def _secure(self, sock: zmq.Socket[bytes]) -> None:
        if self.rebuilds == 0:
            super()._secure(sock)
        # MUTATION: a rebuilt socket gets no CURVE options


class NoReceiveLimitServer(ControlServer):
    """Binds without ZMQ_MAXMSGSIZE: a raw peer announcing a huge frame makes libzmq
    buffer every byte it sends."""

    def __init__(self, endpoint: str, handlers: Mapping[str, Handler] | None = None,
                 **kwargs: Any) -> None:
        kwargs["max_message_bytes"] = -1  # MUTATION: no receive limit
        super().__init__(endpoint, handlers, **kwargs)


NO_RECEIVE_LIMIT = ControlImplementation(server=NoReceiveLimitServer, client=ControlClient)
ZAP_ALLOWS_EVERYONE = ControlImplementation(server=ZapAllowsEveryoneServer, client=ControlClient)
PLAIN_AFTER_REBUILD = ControlImplementation(server=ControlServer, client=PlainAfterRebuildClient)
NO_PING = ControlImplementation(server=NoPingServer, client=ControlClient)
SILENT_ON_UNKNOWN = ControlImplementation(server=SilentOnUnknownServer, client=ControlClient)
HANDLER_EXCEPTION_KILLS_LOOP = ControlImplementation(server=RaisingHandlerKillsLoopServer,
                                                     client=ControlClient)
BLOCKING_REPLY = ControlImplementation(server=BlockingReplyServer, client=ControlClient)
STUCK_REQ = ControlImplementation(server=ControlServer, client=StuckReqClient)
ARRIVAL_MATCHED = ControlImplementation(server=ControlServer, client=ArrivalMatchedClient)
REGISTERS_ONCE = ControlImplementation(server=ControlServer, client=RegistersOnceClient)
NEVER_DEAD = ControlImplementation(server=ControlServer, client=NeverDeadClient)


def _m(name: str, attr: str, description: str, models: str, *clauses: str) -> Mutant:
    return Mutant(name, f"{_M}:{attr}", description, models, tuple(clauses), base=BASE)


CATALOG: Final[tuple[Mutant, ...]] = (
    _m("ctl_no_ping_handler", "NO_PING",
       "the server declares PING but has no handler for it (\"No handler registered for "
       "request type PING\" on every heartbeat)", "ctl-no-ping-handler", "CTL-1"),
    _m("ctl_silent_on_unknown_type", "SILENT_ON_UNKNOWN",
       "an unknown request type gets no reply at all", "ctl-silent-on-unknown", "CTL-2"),
    _m("ctl_handler_exception_kills_loop", "HANDLER_EXCEPTION_KILLS_LOOP",
       "a handler's exception escapes serve() and ends the serve loop",
       "ctl-handler-exception-kills-loop", "CTL-3"),
    _m("ctl_stuck_req_socket", "STUCK_REQ",
       "the client keeps its REQ socket after a timeout, so every later request raises EFSM",
       "ctl-stuck-req", "CTL-4"),
    _m("ctl_replies_matched_by_arrival", "ARRIVAL_MATCHED",
       "the client takes the first reply to arrive (a PONG) as the answer to its request",
       "ctl-matched-by-arrival", "CTL-5"),
    _m("ctl_heartbeat_never_marks_dead", "NEVER_DEAD",
       "unanswered PINGs never make alive False", "ctl-never-dead", "CTL-5"),
    _m("ctl_no_reregistration", "REGISTERS_ONCE",
       "the client registers on its first connection only, never after a server restart",
       "ctl-no-reregistration", "CTL-6"),
    _m("ctl_blocking_reply_send", "BLOCKING_REPLY",
       "ROUTER_MANDATORY with a blocking send: a client that stops reading stalls the server",
       "ctl-blocking-reply", "CTL-7"),
    _m("ctl_zap_allows_everyone", "ZAP_ALLOWS_EVERYONE",
       "the server's ZAP handler allows every client key", "zap-allows-everyone", "CTL-8"),
    _m("ctl_plain_after_rebuild", "PLAIN_AFTER_REBUILD",
       "the client drops CURVE when it rebuilds its socket after a timeout",
       "curve-dropped-on-reconnect", "CTL-8"),
    _m("ctl_no_receive_limit", "NO_RECEIVE_LIMIT",
       "the server binds without ZMQ_MAXMSGSIZE: a stranger's announced 1 GiB frame is "
       "buffered byte by byte", "unbounded-receive-buffer", "CTL-9"),
)
