"""The Python driver's side of ``control``: Python servers and clients served over the protocol.

``python -m conformance.drivers.python MODULE:ATTR`` serves a control
implementation through :class:`ControlService` (the registry's
``python_service``): each request of ``docs/drivers.md``, section 7, becomes
one call of the Python objects. A server's handlers arrive as standard
behaviour names and run as :func:`python_handler` writes them out; the
requests they ran go back to the suite with each ``serve`` round. The
suite's side, the proxies, is :mod:`conformance.contracts.control.driver`.

This module runs in every driver process: it imports only the protocol's
serving helpers and the interface's exceptions, never the suite.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from conformance.drivers.behaviours import Request
from conformance.drivers.serving import TwoSidedService, declared
from reference_impl.control.interface import ClientClosed, RequestRejected, RequestTimeout

__all__ = ["CONTROL_BEHAVIOURS", "CURVE_CLIENT_OPTIONS", "CURVE_SERVER_OPTIONS",
           "ControlService", "python_handler"]

#: The control handlers' standard behaviour names (``docs/drivers.md``, section 7).
CONTROL_BEHAVIOURS: Final = ("echo", "slow", "raise", "bad_reply", "register")
#: The CURVE keywords (CTL-8) the bridge forwards to a control driver.
CURVE_SERVER_OPTIONS: Final = ("curve_server_secret_key", "curve_allowed_client_keys")
CURVE_CLIENT_OPTIONS: Final = ("curve_client_secret_key", "curve_server_key")


class _ServedServer:
    """A control server in the Python driver and the log of what its behaviours ran."""

    def __init__(self) -> None:
        self.server: Any = None
        self._log: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def note(self, request: dict[str, Any]) -> None:
        with self._lock:
            self._log.append(dict(request))

    def drain(self) -> list[dict[str, Any]]:
        with self._lock:
            log, self._log = self._log, []
        return log


class ControlService(TwoSidedService):
    """The Python driver's side of ``control``: the ``server`` and ``client`` factories."""

    constructors = ("server", "client")
    family = "control"
    error_kinds = (
        (RequestRejected, "rejected"),
        ((RequestTimeout, TimeoutError), "timeout"),
        (ClientClosed, "closed"),
    )

    def hello(self) -> dict[str, Any]:
        answer = super().hello()
        server = getattr(self.target, "server", None)
        answer["capabilities"] = declared(server) if server is not None else {}
        return answer

    def _construct_server(self, args: dict[str, Any]) -> Any:
        side = self._side("server")
        holder = _ServedServer()
        handlers = {kind: python_handler(behaviour, holder.note)
                    for kind, behaviour in dict(args["handlers"]).items()}
        curve = {k: args[k] for k in CURVE_SERVER_OPTIONS if k in args}
        holder.server = side(args["endpoint"], handlers, **curve)
        return {"handle": self.new("server", holder)}

    def _construct_client(self, args: dict[str, Any]) -> Any:
        side = self._side("client")
        register = args.pop("register", None)
        obj = side(args.pop("endpoint"), register=tuple(register) if register else None, **args)
        return {"handle": self.new("client", obj)}

    def _server_serve(self, holder: _ServedServer, timeout_ms: int) -> Any:
        serve = getattr(holder.server, "serve", None)
        if callable(serve):
            serve(timeout_ms)
        else:  # a server with its own I/O thread
            threading.Event().wait(timeout_ms / 1000)
        return {"log": holder.drain()}

    def _server_close(self, holder: _ServedServer) -> None:
        holder.server.close()

    def _client_request(self, obj: Any, type: str, body: Mapping[str, Any]) -> Any:
        return obj.request(type, dict(body))

    def _client_tick(self, obj: Any) -> None:
        obj.tick()

    def _client_alive(self, obj: Any) -> Any:
        return bool(obj.alive)

    def _client_close(self, obj: Any) -> None:
        obj.close()


class HandlerRaised(RuntimeError):
    """What the ``raise`` behaviour raises in the Python driver."""


def python_handler(behaviour: str, log: Callable[[Request], None]) -> Callable[[Request], Any]:
    """The handler ``behaviour`` names, logging each request it runs through ``log``."""
    if behaviour == "echo":
        def echo(request: Request) -> Any:
            log(request)
            return {"nonce": request.get("nonce"), "data": request.get("data")}
        return echo
    if behaviour == "slow":
        def slow(request: Request) -> Any:
            log(request)
            time.sleep(float(request.get("ms", 0) or 0) / 1000)
            return {"nonce": request.get("nonce"), "slept_ms": request.get("ms")}
        return slow
    if behaviour == "raise":
        def fail(request: Request) -> Any:
            log(request)
            raise HandlerRaised("the standard 'raise' behaviour raised on purpose (CTL-3)")
        return fail
    if behaviour == "bad_reply":
        def bad(request: Request) -> Any:
            log(request)
            return ["not", "a", "dict"]
        return bad
    if behaviour == "register":
        def register(request: Request) -> Any:
            log(request)
            return {"registered": True}
        return register
    raise ValueError(f"unknown standard behaviour {behaviour!r}; known: "
                     f"{', '.join(CONTROL_BEHAVIOURS)}")
