"""The Python driver's side of ``p2p``: a Python transport factory served over the protocol.

``python -m conformance.drivers.python MODULE:ATTR`` serves a p2p
implementation through :class:`TransportService` (the registry's
``python_service``): each request of ``docs/drivers.md``, section 5, becomes
one call of the Python objects, and each exception of
:mod:`reference_impl.p2p.interface` one error kind. The suite's side, the
proxies, is :mod:`conformance.contracts.p2p.driver`.

This module runs in every driver process, which the suite starts for every
node: it imports only the protocol's serving helpers and the interface's
exceptions, never the suite (a driver start is on the suite's critical path).
"""

from __future__ import annotations

import time
from typing import Any, Final

from conformance.drivers.serving import Service, accepts, declared
from reference_impl.p2p.interface import (
    ConnectionDeadError,
    DuplicateConnectionError,
    MessageTooLargeError,
    SendQueueFullError,
)

__all__ = ["CURVE_OPTIONS", "HEARTBEAT_OPTIONS", "OPTIONS", "TransportService"]

#: Keyword arguments a p2p driver may list in ``options``.
#: The CURVE keywords of :mod:`conformance.testing.credentials` (SEC-2).
CURVE_OPTIONS: Final = ("curve_server_secret_key", "curve_allowed_client_keys",
                        "curve_client_secret_key", "curve_server_key")
HEARTBEAT_OPTIONS: Final = ("heartbeat_ivl_ms", "heartbeat_timeout_ms", "heartbeat_ttl_ms")
OPTIONS: Final = (*HEARTBEAT_OPTIONS, *CURVE_OPTIONS)


class TransportService(Service):
    """The Python driver's side of ``p2p``: a transport factory behind handles."""

    constructors = ("transport",)
    error_kinds = (
        (DuplicateConnectionError, "duplicate"),
        (ConnectionDeadError, "dead"),
        (MessageTooLargeError, "too_large"),
        (SendQueueFullError, "queue_full"),
    )

    def hello(self) -> dict[str, Any]:
        answer = super().hello()
        answer["capabilities"] = declared(self.target)
        options = [o for o in HEARTBEAT_OPTIONS if accepts(self.target, o)]
        if len(options) < len(HEARTBEAT_OPTIONS):
            options = []  # the suite passes heartbeats as all three or none
        answer["options"] = options + [o for o in CURVE_OPTIONS if accepts(self.target, o)]
        return answer

    def _construct_transport(self, args: dict[str, Any]) -> Any:
        opts = {k: args.pop(k) for k in OPTIONS if k in args}
        obj = self.target(args["local_id"], args["host"], args["port"], **opts)
        return {"handle": self.new("transport", obj)}

    def _transport_connect(self, obj: Any, peer_id: str) -> Any:
        conn = obj.connect(peer_id)
        return {"handle": self.new("connection", conn), "peer_id": conn.peer_id}

    def _transport_poll(self, obj: Any) -> Any:
        return [{"handle": self.new("connection", c), "peer_id": c.peer_id}
                for c in obj.poll()]

    def _transport_poll_drain(self, obj: Any, connections: list[int] | None = None) -> Any:
        """``poll()``, then ``alive`` and ``recv()`` of each connection named and each new
        one, as a caller polling in a loop does next. A connection whose ``alive`` or
        ``recv()`` raises is left out: the suite asks it directly, and sees the error.
        Only the poll counts in ``elapsed_ns``."""
        new = self._transport_poll(obj)
        started = time.perf_counter_ns()
        handles = dict.fromkeys([*(connections or ()), *(e["handle"] for e in new)])
        drained: list[dict[str, Any]] = []
        for handle in handles:
            try:
                kind, conn = self.objects.get(handle)
                if kind != "connection":
                    continue
                alive = bool(conn.alive)
                messages = list(conn.recv())
            except Exception:
                continue
            drained.append({"handle": handle, "messages": messages, "alive": alive})
        self.overhead_ns += time.perf_counter_ns() - started
        return {"new": new, "drained": drained}

    def _transport_alive_all(self, obj: Any, connections: list[int]) -> Any:
        """``alive`` of each connection named, in order; nil for one whose ``alive``
        raised (or that is not a connection): the suite asks it directly."""
        out: list[bool | None] = []
        for handle in connections:
            try:
                kind, conn = self.objects.get(handle)
                out.append(bool(conn.alive) if kind == "connection" else None)
            except Exception:
                out.append(None)
        return out

    def _transport_close(self, obj: Any) -> None:
        obj.close()

    def _connection_peer_id(self, obj: Any) -> Any:
        return obj.peer_id

    def _connection_alive(self, obj: Any) -> Any:
        return bool(obj.alive)

    def _connection_send(self, obj: Any, msg: Any) -> None:
        obj.send(msg)

    def _connection_send_many(self, obj: Any, msgs: list[Any], keep_going: bool = False
                              ) -> Any:
        """``send()`` of each message, back to back, stopping after the first that
        raised unless ``keep_going``; each send's own time."""
        outcomes: list[dict[str, Any] | None] = []
        elapsed: list[int] = []
        for msg in msgs:
            started = time.perf_counter_ns()
            try:
                obj.send(msg)
            except Exception as exc:
                elapsed.append(time.perf_counter_ns() - started)
                outcomes.append(self.error(exc))
                if keep_going:
                    continue
                break
            elapsed.append(time.perf_counter_ns() - started)
            outcomes.append(None)
        return {"outcomes": outcomes, "elapsed_ns": elapsed}

    def _connection_recv(self, obj: Any) -> Any:
        return list(obj.recv())

    def _connection_mark_dead(self, obj: Any) -> None:
        obj.mark_dead()

    def _connection_close(self, obj: Any) -> None:
        obj.close()
