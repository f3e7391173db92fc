"""The ``control`` contract through a driver: server and client proxies.

:class:`ControlDriver` is the implementation object the control suite
receives (``server`` and/or ``client`` factories, as the driver's hello
``sides`` declares). The server's handlers must be
:class:`~conformance.drivers.behaviours.StandardHandler`s: the driver gets
their behaviour names, and each ``serve()`` round brings back the requests
they ran, which are recorded in the suite's log as if the handlers had run
here. Calls follow ``docs/drivers.md``, section 7; the Python driver's side
is :mod:`conformance.contracts.control.service`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Final

from conformance.contracts.control.service import CURVE_CLIENT_OPTIONS, CURVE_SERVER_OPTIONS
from conformance.drivers.behaviours import StandardHandler
from conformance.drivers.process import DriverCrashed
from conformance.drivers.protocol import Hello
from conformance.drivers.remote import ErrorTable, Remote, build, signature
from conformance.errors import ConfigError
from conformance.supervision import watchdog
from reference_impl.control.interface import ClientClosed, RequestRejected, RequestTimeout

__all__ = ["ClientFactory", "ControlDriver", "DriverClient", "DriverServer", "ServerFactory"]

CONTRACT: Final = "control"
CLIENT_OPTIONS: Final = ("heartbeat_ivl_ms", "heartbeat_timeout_ms", "request_timeout_ms")


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
