"""Servers, clients and raw wire peers for the control-channel suite.

The server under test runs its serve loop in a thread of its own
(:class:`ServerRunner`): ``request()`` on a client blocks until the reply
comes, so client and server cannot share one thread. The runner builds,
serves and closes the server in that thread (a ZeroMQ socket never changes
threads). Calls into the server cannot be interrupted from the main thread,
so the runner notes when each ``serve()`` started and :meth:`ServerRunner.check`
(called by every wait of the suite) raises :class:`CallBlocked` when one has
run past the watchdog limit, or reports the exception that killed the loop.

Every call into a client runs on the main thread under
:func:`conformance.supervision.watchdog.guard`: ``request()`` gets its own timeout plus
the watchdog limit, the others the limit.

Suite values: heartbeat interval 100 ms, timeout 500 ms, request timeout
400 ms; bounds carry :data:`SLACK_MS` for a loaded 2-core machine.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Self, TypeVar

import msgspec
import zmq

from conformance.contracts.control.spec import ControlSpec
from conformance.errors import CallBlocked
from conformance.supervision import watchdog
from conformance.testing.net import HOST, free_port, is_address_in_use

__all__ = [
    "HEARTBEAT_IVL_MS",
    "HEARTBEAT_TIMEOUT_MS",
    "REQUEST_TIMEOUT_MS",
    "SLACK_MS",
    "Client",
    "Rig",
    "ServerRunner",
    "SuiteHandlers",
    "WireClient",
]

T = TypeVar("T")

HEARTBEAT_IVL_MS = 100
HEARTBEAT_TIMEOUT_MS = 500
REQUEST_TIMEOUT_MS = 400
#: Scheduling slack on top of every timing bound.
SLACK_MS = 250
#: Reconnect backoff ceiling a client may use (the reference's libzmq setting).
RECONNECT_MAX_MS = 1000
#: One round of the serve loop.
SERVE_ROUND_MS = 10
#: How long :meth:`Rig.restart_server` retries a port the old server still holds.
_REBIND_WINDOW_S = 3.0

ECHO, SLOW, FAIL, BAD, REGISTER = "ZMQC_ECHO", "ZMQC_SLOW", "ZMQC_FAIL", "ZMQC_BAD", "ZMQC_REGISTER"

_CLAUSE = re.compile(r"CTL-\d+")
_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder()
_nonces = itertools.count(1)


def nonce() -> int:
    """A number no other request of this process carries."""
    return next(_nonces)


@dataclass(frozen=True)
class Seen:
    """One request a suite handler ran: server generation, type, nonce, when."""

    generation: int
    type: str
    nonce: Any
    at: float


@dataclass
class SuiteHandlers:
    """The handlers the suite adds to every server, and a log of what they ran.

    ``ZMQC_ECHO`` answers ``{"nonce": n, "data": d}`` with the request's own
    values; ``ZMQC_SLOW`` sleeps ``ms`` first; ``ZMQC_FAIL`` raises;
    ``ZMQC_BAD`` returns a list instead of a dict; ``ZMQC_REGISTER`` answers
    ``{"registered": True}``. They run in the server's thread; the log is
    appended to under a lock.
    """

    log: list[Seen] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def for_generation(self, generation: int) -> dict[str, Callable[[dict[str, Any]], Any]]:
        def note(request: dict[str, Any]) -> None:
            with self._lock:
                self.log.append(Seen(generation, str(request.get("type")), request.get("nonce"),
                                     time.monotonic()))

        def echo(request: dict[str, Any]) -> dict[str, Any]:
            note(request)
            return {"nonce": request.get("nonce"), "data": request.get("data")}

        def slow(request: dict[str, Any]) -> dict[str, Any]:
            note(request)
            time.sleep(float(request.get("ms", 0)) / 1000)
            return {"nonce": request.get("nonce"), "slept_ms": request.get("ms")}

        def fail(request: dict[str, Any]) -> dict[str, Any]:
            note(request)
            raise RuntimeError("the suite's ZMQC_FAIL handler raised on purpose (CTL-3)")

        def bad(request: dict[str, Any]) -> Any:
            note(request)
            return ["not", "a", "dict"]

        def register(request: dict[str, Any]) -> dict[str, Any]:
            note(request)
            return {"registered": True}

        return {ECHO: echo, SLOW: slow, FAIL: fail, BAD: bad, REGISTER: register}

    def seen(self, *, type: str | None = None, generation: int | None = None) -> list[Seen]:
        with self._lock:
            return [s for s in self.log
                    if (type is None or s.type == type)
                    and (generation is None or s.generation == generation)]


class ServerRunner:
    """A server under test, built, served and closed in a thread of its own.

    ``start()`` returns once the factory returned (or raises what it raised,
    or :class:`CallBlocked` after the watchdog limit). ``error`` holds the
    exception that ended the serve loop, if any.
    """

    def __init__(self, factory: Callable[..., Any], endpoint: str,
                 handlers: Mapping[str, Callable[[dict[str, Any]], Any]], *,
                 generation: int, limit: float | None = None) -> None:
        self.factory = factory
        self.endpoint = endpoint
        self.handlers = dict(handlers)
        self.generation = generation
        self.limit = watchdog.default_limit() if limit is None else limit
        self.error: BaseException | None = None
        self.close_error: BaseException | None = None
        self.rounds = 0
        self._in_call: tuple[str, float] | None = None
        #: A call overran the limit and :meth:`check` said so: the verdict stands.
        self._reported_block = False
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._build_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"ctl-server-{endpoint}")

    def start(self) -> ServerRunner:
        self._thread.start()
        if not self._ready.wait(self.limit):
            raise CallBlocked(f"server factory({self.endpoint!r})", self.limit)
        if self._build_error is not None:
            raise self._build_error
        return self

    def _run(self) -> None:
        try:
            self._in_call = ("factory", time.monotonic())
            server = self.factory(self.endpoint, self.handlers)
            self._in_call = None
        except BaseException as exc:
            self._build_error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            while not self._stop.is_set():
                self._in_call = ("serve()", time.monotonic())
                server.serve(SERVE_ROUND_MS)
                self._in_call = None
                self.rounds += 1
        except BaseException as exc:
            self.error = exc
            self._in_call = None
        try:
            self._in_call = ("close()", time.monotonic())
            server.close()
        except BaseException as exc:
            self.close_error = exc
        self._in_call = None

    @property
    def serving(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def check(self, clause: str = "CTL-3") -> None:
        """Raise if the serve loop died or a call into the server has overrun the limit."""
        if self.error is not None:
            raise AssertionError(
                f"{clause}: the server's serve loop died: serve() raised "
                f"{type(self.error).__name__}: {self.error}; the server must keep serving"
            ) from self.error
        current = self._in_call
        if current is not None and time.monotonic() - current[1] > self.limit:
            self._reported_block = True
            raise CallBlocked(f"server.{current[0]} on {self.endpoint}", self.limit)

    def stop(self) -> None:
        """End the loop and close the server (in its thread); wait up to the limit.

        Once :meth:`check` has reported a blocked call, the test's verdict stands on
        that full-limit block, so the wait is cut to
        :data:`conformance.supervision.watchdog.AFTER_BLOCK_LIMIT_S` (as the watchdog cuts every
        later guard of the test): the stuck call is not waited out a second time.
        """
        self._stop.set()
        if self._thread.is_alive():
            wait = watchdog.AFTER_BLOCK_LIMIT_S if self._reported_block else self.limit
            self._thread.join(wait + SERVE_ROUND_MS / 1000)
        if self._thread.is_alive():
            what = self._in_call[0] if self._in_call else "serve()"
            raise CallBlocked(f"server.{what} on {self.endpoint} (while stopping)", self.limit)
        if self.close_error is not None:
            raise AssertionError(f"server.close() raised {self.close_error!r}")


class Client:
    """A client under test; every call guarded by the watchdog, results type-checked."""

    def __init__(self, raw: Any, name: str, request_timeout_ms: int) -> None:
        self.raw = raw
        self.name = name
        self.request_timeout_ms = request_timeout_ms
        self.closed = False

    def request(self, kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
        limit = self.request_timeout_ms / 1000 + watchdog.default_limit()
        with watchdog.guard(f"{self.name}.request({kind!r})", limit):
            reply = self.raw.request(kind, dict(body))
        if not isinstance(reply, dict):
            raise AssertionError(f"{self.name}.request({kind!r}) returned a "
                                 f"{type(reply).__name__}, not a dict")
        return reply

    def attempt(self, kind: str, body: Mapping[str, Any]) -> tuple[dict[str, Any] | None,
                                                                     Exception | None, float]:
        """``request()``; returns (reply, exception, seconds). ``CallBlocked`` propagates."""
        started = time.monotonic()
        try:
            reply = self.request(kind, body)
        except CallBlocked:
            raise
        except Exception as exc:
            return None, exc, time.monotonic() - started
        return reply, None, time.monotonic() - started

    def tick(self) -> None:
        with watchdog.guard(f"{self.name}.tick()"):
            self.raw.tick()

    @property
    def alive(self) -> bool:
        with watchdog.guard(f"{self.name}.alive"):
            value = self.raw.alive
        if not isinstance(value, bool):
            raise AssertionError(f"{self.name}.alive is {value!r}, not a bool")
        return value

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with watchdog.guard(f"{self.name}.close()"):
            self.raw.close()


class WireClient:
    """A raw pyzmq peer of the server: speaks (or breaks) the wire format by hand.

    ``kind`` is ``zmq.DEALER`` (frames as given) or ``zmq.REQ`` (libzmq adds
    the delimiter). Replies are read with a deadline; silence returns None.
    """

    def __init__(self, endpoint: str, kind: int = zmq.DEALER, **options: int) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(kind)
        self.kind = kind
        self.sock.setsockopt(zmq.LINGER, 0)
        for name, value in options.items():
            self.sock.setsockopt(getattr(zmq, name.upper()), value)
        self.sock.connect(endpoint)

    def send(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames, zmq.NOBLOCK)

    def recv(self, timeout_s: float) -> list[bytes] | None:
        if self.sock.poll(max(int(timeout_s * 1000), 1)):
            return self.sock.recv_multipart()
        return None

    def ask(self, request: dict[str, Any] | bytes, timeout_s: float) -> Any:
        """Send one well-framed request; the decoded reply, or None after ``timeout_s``.

        A DEALER sends ``[id, b"", payload]`` and skips replies with another
        id; a REQ sends ``[payload]``.
        """
        payload = request if isinstance(request, bytes) else _ENCODER.encode(request)
        if self.kind == zmq.REQ:
            self.sock.send(payload)
            frames = self.recv(timeout_s)
            return None if frames is None else decode(frames[-1])
        rid = nonce().to_bytes(8, "big")
        self.send([rid, b"", payload])
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            frames = self.recv(left)
            if frames is None:
                return None
            if frames[0] == rid:
                return decode(frames[-1])
        return None

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


def decode(payload: bytes) -> Any:
    """MessagePack-decode a reply; undecodable bytes come back as ``bytes``."""
    try:
        return _DECODER.decode(payload)
    except (msgspec.DecodeError, ValueError):
        return payload


def error_text(reply: Any) -> str | None:
    """The error of an error reply (a map with a str ``error``), else None."""
    if isinstance(reply, dict) and isinstance(reply.get("error"), str):
        return str(reply["error"])
    return None


class Rig:
    """One server (restartable, on a fixed port) and its clients; closes everything.

    ``client_endpoint`` is where clients connect: the server's own endpoint,
    or a proxy's in front of it (:meth:`front`, used by the chaos suite).
    """

    def __init__(self, spec: ControlSpec) -> None:
        self.spec = spec
        self.handlers = SuiteHandlers()
        self.port = 0
        self.generation = 0
        self.runner: ServerRunner | None = None
        self.client_endpoint = ""
        self.clients: list[Client] = []
        self.wires: list[WireClient] = []
        self._abandoned: list[Any] = []

    @property
    def server_endpoint(self) -> str:
        return f"tcp://{HOST}:{self.port}"

    # -- server ---------------------------------------------------------------

    def reserve_port(self) -> str:
        """Fix the server's port without starting it; returns the clients' endpoint."""
        if self.port == 0:
            self.port = free_port()
            self.client_endpoint = self.client_endpoint or self.server_endpoint
        return self.client_endpoint

    def start_server(self) -> ServerRunner:
        """Start the server (a fresh port the first time, the same port afterwards)."""
        factory = self.spec.server_or_reference()
        if self.port == 0:
            for attempt in range(8):
                self.port = free_port()
                try:
                    return self._start(factory)
                except Exception as exc:
                    if isinstance(exc, CallBlocked) or not is_address_in_use(exc) or attempt == 7:
                        raise
            raise AssertionError("unreachable")
        deadline = time.monotonic() + _REBIND_WINDOW_S
        while True:
            try:
                return self._start(factory)
            except Exception as exc:
                if isinstance(exc, CallBlocked) or not is_address_in_use(exc) \
                        or time.monotonic() >= deadline:
                    raise
                time.sleep(0.005)

    def _start(self, factory: Callable[..., Any]) -> ServerRunner:
        self.generation += 1
        runner = ServerRunner(factory, self.server_endpoint,
                              self.handlers.for_generation(self.generation),
                              generation=self.generation)
        runner.start()
        self.runner = runner
        if not self.client_endpoint:
            self.client_endpoint = self.server_endpoint
        return runner

    def stop_server(self) -> None:
        runner, self.runner = self.runner, None
        if runner is not None:
            try:
                runner.check()
            finally:
                try:
                    runner.stop()
                except CallBlocked:
                    self._abandoned.append(runner)
                    raise

    def restart_server(self) -> ServerRunner:
        self.stop_server()
        return self.start_server()

    def check(self) -> None:
        if self.runner is not None:
            self.runner.check()

    # -- clients --------------------------------------------------------------

    def client(self, name: str = "client", *, register: bool = True,
               **overrides: int) -> Client:
        """A client under test (or the reference) on :attr:`client_endpoint`."""
        factory = self.spec.client_or_reference()
        options: dict[str, Any] = {
            "heartbeat_ivl_ms": HEARTBEAT_IVL_MS,
            "heartbeat_timeout_ms": HEARTBEAT_TIMEOUT_MS,
            "request_timeout_ms": REQUEST_TIMEOUT_MS,
        }
        options.update(overrides)
        if register:
            options["register"] = (REGISTER, {"worker": name})
        with watchdog.guard(f"client factory({self.client_endpoint!r}) for {name}"):
            raw = factory(self.client_endpoint, **options)
        client = Client(raw, name, int(options["request_timeout_ms"]))
        self.clients.append(client)
        return client

    def wire(self, kind: int = zmq.DEALER, **options: int) -> WireClient:
        wire = WireClient(self.client_endpoint, kind, **options)
        self.wires.append(wire)
        return wire

    # -- driving --------------------------------------------------------------

    def wait_until(self, condition: Callable[[], T], *, what: str, timeout: float,
                   tick: Iterable[Client] = ()) -> T:
        """Tick ``tick`` and check the server until ``condition()`` holds; fail naming ``what``."""
        clients = list(tick)
        deadline = time.monotonic() + timeout
        while True:
            self.check()
            result = condition()
            if result:
                return result
            if time.monotonic() >= deadline:
                # A clause named at the start of ``what`` leads the message (the verdict
                # blames the clause a message starts with).
                clause, sep, rest = what.partition(": ")
                if sep and _CLAUSE.fullmatch(clause):
                    raise AssertionError(
                        f"{clause}: timed out after {timeout:.2f} s waiting for: {rest}")
                raise AssertionError(f"timed out after {timeout:.2f} s waiting for: {what}")
            for client in clients:
                client.tick()
            time.sleep(0.001)

    def drive(self, seconds: float, tick: Iterable[Client] = ()) -> None:
        """Tick ``tick`` for ``seconds`` (a window, not a synchroniser)."""
        clients = list(tick)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.check()
            for client in clients:
                client.tick()
            time.sleep(0.001)

    # -- teardown -------------------------------------------------------------

    def close(self) -> None:
        errors: list[BaseException] = []
        for client in self.clients:
            try:
                client.close()
            except Exception as exc:
                self._abandoned.append(client.raw)
                errors.append(exc)
        for wire in self.wires:
            wire.close()
        try:
            self.stop_server()
        except Exception as exc:
            errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        try:
            self.close()
        except Exception as close_error:
            if exc is None:
                raise
            exc.add_note(f"also, while closing the rig: {close_error!r}")


@contextmanager
def rig(spec: ControlSpec, *, server: bool = True) -> Iterator[Rig]:
    """A :class:`Rig` with its server started (unless ``server=False``)."""
    with Rig(spec) as r:
        if server:
            r.start_server()
        yield r
