"""The ``control`` contract through a driver: server and client proxies.

:class:`ControlDriver` is the implementation object the control suite
receives (``server`` and/or ``client`` factories, as the driver's hello
``sides`` declares). The server's handlers must be
:class:`~conformance.drivers.behaviours.StandardHandler`s: the driver gets
their behaviour names, and each ``serve()`` round brings back the requests
they ran, which are recorded in the suite's log as if the handlers had run
here. Calls follow ``docs/drivers.md``, section 7.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Final

from conformance.drivers.behaviours import Request, StandardHandler
from conformance.drivers.process import DriverCrashed
from conformance.drivers.protocol import Hello
from conformance.drivers.remote import ErrorTable, Remote, build, signature
from conformance.drivers.serving import Refused, TwoSidedService, declared
from conformance.errors import ConfigError
from conformance.supervision import watchdog
from reference_impl.control.interface import ClientClosed, RequestRejected, RequestTimeout

__all__ = ["CONTROL_BEHAVIOURS", "ClientFactory", "ControlDriver", "ControlService",
           "DriverClient", "DriverServer", "ServerFactory", "python_handler"]

CONTRACT: Final = "control"
#: The control handlers' standard behaviour names (``docs/drivers.md``, section 7).
CONTROL_BEHAVIOURS: Final = ("echo", "slow", "raise", "bad_reply", "register")
CLIENT_OPTIONS: Final = ("heartbeat_ivl_ms", "heartbeat_timeout_ms", "request_timeout_ms")
#: The CURVE keywords (CTL-8) the bridge forwards to a control driver.
CURVE_SERVER_OPTIONS: Final = ("curve_server_secret_key", "curve_allowed_client_keys")
CURVE_CLIENT_OPTIONS: Final = ("curve_client_secret_key", "curve_server_key")


def _rejected(message: str, error: Mapping[str, Any]) -> Exception:
    reply = error.get("reply")
    return RequestRejected(message, dict(reply) if isinstance(reply, Mapping) else {})


ERRORS: ErrorTable = {
    "timeout": lambda message, error: RequestTimeout(message),
    "rejected": _rejected,
    "closed": lambda message, error: ClientClosed(message),
}


class ServerFactory:
    """``server(endpoint, handlers)``: one control server in one driver process."""

    resources_counted: Final = True

    def __init__(self, command: str, hello: Hello) -> None:
        self.driver_command = command
        self.zmq_conformance_capabilities = dict(hello.capabilities)
        self.__signature__ = signature(("endpoint", "handlers"), ())

    def __call__(self, endpoint: str, handlers: Mapping[str, Callable[..., Any]],
                 **curve: Any) -> DriverServer:
        """``curve``: the CURVE server keywords (CTL-8), passed to the driver as they are."""
        names: dict[str, str] = {}
        for kind, handler in handlers.items():
            if not isinstance(handler, StandardHandler):
                raise ConfigError(
                    f"control server through a driver: the handler for {kind!r} is a plain "
                    "Python callable; a driver can only run the standard behaviours of "
                    "docs/drivers.md (conformance.drivers.behaviours.StandardHandler)")
            names[kind] = handler.behaviour
        args = {"endpoint": endpoint, "handlers": names,
                **{k: v for k, v in curve.items() if k in CURVE_SERVER_OPTIONS}}
        process, result = build(self.driver_command, CONTRACT, "server", args, ERRORS,
                                what=f"server factory({endpoint!r})")
        return DriverServer(process, int(result["handle"]),
                            f"server on {endpoint} ({process.label})", handlers)

    def __repr__(self) -> str:
        return f"<control server driver {self.driver_command!r}>"


class ClientFactory:
    """``client(endpoint, *, heartbeat_ivl_ms, heartbeat_timeout_ms, request_timeout_ms,
    register=None)``: one control client in one driver process."""

    resources_counted: Final = True

    def __init__(self, command: str, hello: Hello) -> None:
        self.driver_command = command
        self.__signature__ = signature(("endpoint",), (*CLIENT_OPTIONS, "register"))

    def __call__(self, endpoint: str, *, heartbeat_ivl_ms: int, heartbeat_timeout_ms: int,
                 request_timeout_ms: int, register: Any = None, **curve: Any) -> DriverClient:
        args = {"endpoint": endpoint, "heartbeat_ivl_ms": heartbeat_ivl_ms,
                "heartbeat_timeout_ms": heartbeat_timeout_ms,
                "request_timeout_ms": request_timeout_ms,
                "register": list(register) if register is not None else None,
                **{k: v for k, v in curve.items() if k in CURVE_CLIENT_OPTIONS}}
        process, result = build(self.driver_command, CONTRACT, "client", args, ERRORS,
                                what=f"client factory({endpoint!r})")
        return DriverClient(process, int(result["handle"]),
                            f"client of {endpoint} ({process.label})", request_timeout_ms)

    def __repr__(self) -> str:
        return f"<control client driver {self.driver_command!r}>"


class ControlDriver:
    """The implementation object: ``server`` and ``client`` as the hello's ``sides`` say."""

    def __init__(self, command: str, hello: Hello) -> None:
        if not hello.sides:
            raise ConfigError(f"driver {command!r} declares no 'sides' in its hello; the "
                              "control contract needs 'server' and/or 'client' "
                              "(docs/drivers.md, section 3)")
        sides = set(hello.sides)
        unknown = sides - {"server", "client"}
        if unknown:
            raise ConfigError(f"driver {command!r}: unknown side {sorted(unknown)[0]!r} in its "
                              "hello; the control contract has 'server' and 'client'")
        self.driver_command = command
        self.server = ServerFactory(command, hello) if "server" in sides else None
        self.client = ClientFactory(command, hello) if "client" in sides else None
        if self.server is None and hello.capabilities:
            raise ConfigError(f"driver {command!r}: control capabilities are declared by the "
                              "server side, and this driver has none")

    def __call__(self) -> ControlDriver:
        return self

    def __repr__(self) -> str:
        return f"<control driver {self.driver_command!r}>"


class DriverServer(Remote):
    """A server in a driver process; ``serve()`` records what its behaviours ran."""

    errors: ClassVar[ErrorTable] = ERRORS

    def __init__(self, process: Any, handle: int, name: str,
                 handlers: Mapping[str, Callable[..., Any]]) -> None:
        super().__init__(process, handle, name)
        self._handlers = dict(handlers)

    def serve(self, timeout_ms: int) -> object:
        got = self._call("serve", {"timeout_ms": timeout_ms},
                         limit=timeout_ms / 1000 + watchdog.default_limit())
        log = got.get("log", []) if isinstance(got, Mapping) else None
        if not isinstance(log, list):
            raise DriverCrashed(f"serve() on {self._name}: the driver answered {got!r:.200}, "
                                "not a map with a 'log' array")
        for request in log:
            handler = self._handlers.get(str(request.get("type"))) \
                if isinstance(request, dict) else None
            if isinstance(handler, StandardHandler):
                handler.record(request)
        return None

    def close(self) -> None:
        self._closing("close")


class DriverClient(Remote):
    """A client in a driver process: ``request()``, ``tick()``, ``alive``, ``close()``."""

    errors: ClassVar[ErrorTable] = ERRORS

    def __init__(self, process: Any, handle: int, name: str, request_timeout_ms: int) -> None:
        super().__init__(process, handle, name)
        self._request_timeout_s = request_timeout_ms / 1000

    @property
    def alive(self) -> Any:
        return self._call("alive")

    def request(self, type: str, body: Mapping[str, Any]) -> Any:
        return self._call("request", {"type": type, "body": dict(body)},
                          limit=self._request_timeout_s + watchdog.default_limit())

    def tick(self) -> None:
        self._call("tick")

    def close(self) -> None:
        self._closing("close")


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

    def _side(self, name: str) -> Any:
        side = getattr(self.target, name, None)
        if side is None:
            raise Refused("unsupported", f"the implementation has no {name}")
        return side

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
