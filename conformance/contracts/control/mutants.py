"""Mutants of the control-channel reference: one real defect each, and the clause that kills it.

Each entry of :data:`CATALOG` names an implementation object
(``MODULE:ATTR`` with ``server``/``client`` factories) that differs from
``reference_impl.control:REFERENCE`` by one defect seen in deployed control
channels. ``zmq-conformance self-check --contract control`` runs the suite
against each and reports the clauses that failed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from typing import Any, ClassVar, Final

import msgspec
import zmq

from conformance.selfcheck.mutants import Mutant
from reference_impl.control import (
    ControlClient,
    ControlImplementation,
    ControlServer,
    Handler,
    Message,
    Mq05ControlClient,
    Mq05ControlServer,
    MqControlClient,
    MqControlServer,
    RequestRejected,
    RequestTimeout,
    is_error_reply,
)
from reference_impl.control.wire import lookup as wire_lookup

BASE: Final = "reference_impl.control:REFERENCE"
BASE_MQ: Final = "reference_impl.control:REFERENCE_MQ"
BASE_MQ05: Final = "reference_impl.control:REFERENCE_MQ05"
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
        if self._awaiting is not None and not self._answered:
            self._answer, self._answered = reply, True
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


class ReqWaitsOutLostReplyClient(StuckReqClient):
    """Keeps its REQ socket after a timeout and, before the next request, waits (one request
    timeout) for the abandoned reply. A slow handler's late reply does come, so a timeout on
    a slow handler and a stopped server (the request queued, delivered on reconnection) both
    recover; a request the server took and never answered leaves the socket stuck forever."""

    _abandoned = False

    def request(self, type: str, body: Mapping[str, Any]) -> Message:
        if self._abandoned:
            if not self._sock.poll(int(self._timeout * 1000)):
                raise RequestTimeout("still waiting for the reply to an abandoned request")
            self._sock.recv()
            self._abandoned = False
        try:
            return super().request(type, body)
        except RequestTimeout:
            self._abandoned = True
            raise

    def tick(self) -> None:
        if not self._abandoned:
            super().tick()


class SerialisingConcurrentServer(ControlServer):
    """Declares head of line ``concurrent`` but runs handlers inline like the serial reference."""

    zmq_conformance_capabilities: ClassVar[dict[str, Any]] = {
        "request_types": {"PING": {}}, "head_of_line": "concurrent",
    }


class UndelimitedErrorServer(ControlServer):
    """Error replies drop the empty delimiter after a non-empty envelope: ``[id, error]``.
    A DEALER reading the last frame sees an error; a REQ_CORRELATE worker gets nothing."""

    def _send(self, head: list[bytes], reply: Message) -> None:
        if "error" in reply and len(head) > 2 and head[-1] == b"":
            head = head[:-1]
        super()._send(head, reply)


# -- lmcache-mq servers --------------------------------------------------------------


class MqNoPingServer(MqControlServer):
    """LMCache 0.4.2's blend_server_v2 on its own wire: PING declared, no handler, silence."""

    def _builtin_handlers(self) -> dict[str, Handler]:
        return {}


def _pong_str(request: Message) -> Any:
    return "PONG"


class MqPingNotBoolServer(MqControlServer):
    """PING answers a str where the profile's typed result is a bool."""

    def _builtin_handlers(self) -> dict[str, Handler]:
        return {"PING": _pong_str}


class MqUnknownCodeKillsLoopServer(MqControlServer):
    """Decodes the request code as a closed enum outside any guard: an unknown code raises out
    of the serve loop (LMCache 0.4.x's ValidationError)."""

    def _answer_mq(self, frames: list[bytes]) -> None:
        if len(frames) >= 3:
            code = msgspec.msgpack.decode(frames[2])
            if not isinstance(code, int) or code not in self._names:
                raise ValueError(f"Invalid enum value {code!r}")
        super()._answer_mq(frames)


class OwnThreadServer:
    """A server that runs its own I/O thread (as LMCache's does): no ``serve()``.

    ``inner`` serves in a daemon thread until :meth:`close`; an exception ends the thread
    (``threading.excepthook`` sees it), exactly the death the suite must report.
    """

    inner: Any = MqControlServer
    zmq_conformance_capabilities: ClassVar[dict[str, Any]] = dict(
        MqControlServer.zmq_conformance_capabilities)

    def __init__(self, endpoint: str, handlers: Mapping[str, Handler] | None = None) -> None:
        import threading

        self._server = type(self).inner(endpoint, handlers)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="own-io-thread", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._server.serve(10)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._server.close()


class OwnThreadDiesOnUnknownCode(OwnThreadServer):
    inner = MqUnknownCodeKillsLoopServer


# -- lmcache-0.5 servers -------------------------------------------------------------


class Mq05IntsOnlyServer(Mq05ControlServer):
    """Kept 0.4's routing on the 0.5 wire: only int codes select an operation, so an
    operation name (``"ping"``, what the 0.5 profile sends) gets the error reply."""

    def _answer_mq(self, frames: list[bytes]) -> None:
        if len(frames) >= 3:
            with contextlib.suppress(msgspec.DecodeError, ValueError):
                if isinstance(msgspec.msgpack.decode(frames[2]), str):
                    self._send_frames(frames[:3])  # MUTATION: names are not routed
                    return
        super()._answer_mq(frames)


class Mq05SilentOnUnknownServer(Mq05ControlServer):
    """LMCache 0.5.6's ``MessageQueueServer``: an operation it has no handler for (or
    cannot decode) is logged and never answered."""

    def _answer_mq(self, frames: list[bytes]) -> None:
        if len(frames) >= 3:
            try:
                name = wire_lookup(self._names, msgspec.msgpack.decode(frames[2]), "lmcache-0.5")
            except (msgspec.DecodeError, ValueError):
                name = None
            if name is None or name not in self._handlers:
                return  # MUTATION: no reply
        super()._answer_mq(frames)


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
REQ_WAITS_OUT_LOST_REPLY = ControlImplementation(server=ControlServer,
                                                 client=ReqWaitsOutLostReplyClient)
SERIALISING_CONCURRENT = ControlImplementation(server=SerialisingConcurrentServer,
                                               client=ControlClient)
UNDELIMITED_ERROR = ControlImplementation(server=UndelimitedErrorServer, client=ControlClient)
MQ_NO_PING = ControlImplementation(server=MqNoPingServer, client=MqControlClient)
MQ_PING_NOT_BOOL = ControlImplementation(server=MqPingNotBoolServer, client=MqControlClient)
MQ_UNKNOWN_CODE_KILLS_LOOP = ControlImplementation(server=MqUnknownCodeKillsLoopServer,
                                                   client=MqControlClient)
#: The reference's lmcache-mq server on its own I/O thread (correct; for the project's tests).
MQ_OWN_THREAD = ControlImplementation(server=OwnThreadServer, client=MqControlClient)
MQ05_INTS_ONLY = ControlImplementation(server=Mq05IntsOnlyServer, client=Mq05ControlClient)
MQ05_SILENT_ON_UNKNOWN = ControlImplementation(server=Mq05SilentOnUnknownServer,
                                               client=Mq05ControlClient)
MQ_OWN_THREAD_DIES = ControlImplementation(server=OwnThreadDiesOnUnknownCode,
                                           client=MqControlClient)


def _m(name: str, attr: str, description: str, models: str, *clauses: str,
       base: str = BASE) -> Mutant:
    return Mutant(name, f"{_M}:{attr}", description, models, tuple(clauses), base=base)


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
    _m("ctl_req_waits_out_lost_reply", "REQ_WAITS_OUT_LOST_REPLY",
       "the client keeps its REQ socket after a timeout and waits for the abandoned reply, "
       "which never comes when the server stopped holding the request",
       "ctl-req-waits-out-lost-reply",
       "CTL-4"),
    _m("ctl_error_reply_drops_delimiter", "UNDELIMITED_ERROR",
       "error replies drop the empty delimiter after the envelope ([id, error]): a "
       "REQ_CORRELATE worker never gets them", "ctl-error-reply-drops-delimiter", "CTL-2"),
    _m("ctl_concurrent_declared_serial_served", "SERIALISING_CONCURRENT",
       "the server declares head of line concurrent but runs a slow handler inline, "
       "delaying every other client", "ctl-concurrent-declared-serial", "CTL-7"),
    _m("ctl_mq_no_ping_handler", "MQ_NO_PING",
       "lmcache-mq: PING declared but unhandled (LMCache 0.4.2's blend_server_v2; there "
       "silence, here the profile's error reply)", "ctl-mq-no-ping-handler", "CTL-1", base=BASE_MQ),
    _m("ctl_mq_ping_result_not_bool", "MQ_PING_NOT_BOOL",
       "lmcache-mq: PING's typed result is a str, not the declared bool",
       "ctl-mq-typed-result", "CTL-1", base=BASE_MQ),
    _m("ctl_mq_unknown_code_kills_loop", "MQ_UNKNOWN_CODE_KILLS_LOOP",
       "lmcache-mq: an unknown request code raises out of the serve loop (LMCache 0.4.x "
       "decodes it as a closed enum)", "ctl-mq-unknown-code-kills-loop", "CTL-2",
       base=BASE_MQ),
    _m("ctl_mq_own_thread_dies", "MQ_OWN_THREAD_DIES",
       "lmcache-mq, a server with its own I/O thread: an unknown request code kills the "
       "thread and the server answers nothing more", "ctl-mq-own-thread-dies", "CTL-2",
       base=BASE_MQ),
    _m("ctl_mq05_names_unrouted", "MQ05_INTS_ONLY",
       "lmcache-0.5: only int codes are routed (0.4's enum), so the operation name 'ping' "
       "gets the error reply", "ctl-mq05-names-unrouted", "CTL-1", base=BASE_MQ05),
    _m("ctl_mq05_silent_on_unknown_operation", "MQ05_SILENT_ON_UNKNOWN",
       "lmcache-0.5: an unknown or undecodable operation is logged and never answered "
       "(LMCache 0.5.6's MessageQueueServer)", "ctl-mq05-silent-on-unknown", "CTL-2",
       base=BASE_MQ05),
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
