"""The control-channel contract (CTL-1..7): a worker/server request/reply channel.

A *server* answers MessagePack requests ``{"type": str, ...}``; a *client*
(a worker) sends them, one at a time from its caller's point of view, and
sends a periodic ``PING`` whose replies tell it the server is alive. This is
the LMCache shape; a server variant that shipped without a ``PING`` handler
logged "No handler registered for request type PING" on every heartbeat and
its workers could never tell it was alive (CTL-1).

Implementations need not inherit anything here: the conformance suite only
duck-types. This module states the contract in one place.

Server (``factory(endpoint, handlers) -> server``)
    ``endpoint`` is a ZeroMQ endpoint to bind (``tcp://127.0.0.1:5555``);
    ``handlers`` maps request types to ``handler(request) -> reply`` (both
    dicts; ``request`` is the whole decoded request, ``type`` included). The
    server adds them to its own protocol's handlers. ``serve(timeout_ms)``
    does one round of I/O: it waits up to ``timeout_ms`` for requests,
    answers what arrived (a bounded batch) and returns. ``close()`` releases
    everything, idempotently. Calls are never concurrent; the caller runs the
    serve loop (in its own thread, if it likes).

    Capabilities, declared by an attribute ``zmq_conformance_capabilities``
    (a mapping) on the factory:

    - ``request_types``: the protocol's own request types, each with a body
      that must succeed: ``{"PING": {}, "REGISTER": {"worker": "w"}}``.
      ``PING`` must be among them.
    - ``head_of_line``: ``"serial"`` (a slow handler delays the requests
      behind it by at most its own duration) or ``"concurrent"`` (it delays
      no other client). Default ``"serial"``.

Wire (both sides; any REP-compatible envelope)
    A request is ``[envelope..., b"", payload]`` as a REQ or DEALER socket
    sends it; the server replies ``[envelope..., b"", reply]`` with the
    envelope frames echoed, as a REP socket does (so a REQ_CORRELATE or
    request-id frame before the delimiter comes back unchanged). ``payload``
    and ``reply`` are MessagePack maps. An *error reply* is a map with a str
    under ``"error"``; any other map is a success reply. A message without
    an empty delimiter frame is answered ``[b"", error]``.

Client (``factory(endpoint, *, heartbeat_ivl_ms, heartbeat_timeout_ms,
request_timeout_ms, register=None) -> client``)
    ``request(type, body) -> dict`` sends ``{"type": type, **body}`` and
    returns the success reply to *that* request. Every failure raises an
    ``Exception`` (the reference raises :class:`ControlError` subclasses):
    no reply within ``request_timeout_ms`` (:class:`RequestTimeout`), an
    error reply (:class:`RequestRejected`), a closed client. It never
    returns another request's reply, and it stays usable after any failure.
    ``tick()`` drives heartbeats (and anything else pending) without
    blocking; the caller calls it regularly. ``alive`` is False once a PING
    has gone unanswered for ``heartbeat_timeout_ms`` and True again after
    the next reply. ``close()`` releases everything, idempotently.

    Re-registration (CTL-6): ``register`` is ``(type, body)`` or ``None``.
    The client sends that request by itself whenever it (re)connects to a
    server instance: at start, after a server restart, after a partition
    heals. Success is seen on the server as a request of that type arriving
    without the caller asking for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

Message = dict[str, Any]
Handler = Callable[[Message], Message]

#: The heartbeat request type every control protocol has.
PING = "PING"


class ControlError(Exception):
    """Base of the errors the reference client raises on purpose."""


class RequestTimeout(ControlError, TimeoutError):
    """No reply within ``request_timeout_ms`` (CTL-4); the client has rebuilt its socket."""


class RequestRejected(ControlError):
    """The server answered with an error reply (CTL-2, CTL-3); ``reply`` holds it."""

    def __init__(self, message: str, reply: Message) -> None:
        super().__init__(message)
        self.reply = reply


class ClientClosed(ControlError):
    """``request()`` on a closed client."""


class ControlServer(Protocol):
    """What the suite calls on a server."""

    def serve(self, timeout_ms: int) -> object: ...

    def close(self) -> None: ...


class ControlClient(Protocol):
    """What the suite calls on a client."""

    @property
    def alive(self) -> bool: ...

    def request(self, type: str, body: Mapping[str, Any]) -> Message: ...

    def tick(self) -> None: ...

    def close(self) -> None: ...


def is_error_reply(reply: object) -> bool:
    """True for an error reply: a map with a str under ``"error"``."""
    return isinstance(reply, dict) and isinstance(reply.get("error"), str)
