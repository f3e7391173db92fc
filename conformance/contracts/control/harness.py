"""Servers, clients and raw wire peers for the control-channel suite.

The server under test runs its serve loop in a thread of its own
(:class:`ServerRunner`): ``request()`` on a client blocks until the reply
comes, so client and server cannot share one thread. The runner builds,
serves and closes the server in that thread (a ZeroMQ socket never changes
threads). Calls into the server cannot be interrupted from the main thread,
so the runner notes when each ``serve()`` started and :meth:`ServerRunner.check`
(called by every wait of the suite) raises :class:`CallBlocked` when one has
run past the watchdog limit, or reports the exception that killed the loop.

A server without ``serve()`` runs its own I/O thread (LMCache's does): the
runner builds it and then only watches the threads its factory started. One
that ends with an exception is reported as the dead loop it is ("the
server's I/O thread 'mq-server-thread' died: ValidationError: ..."), under
the clause of the test whose input killed it (:attr:`Rig.clause`).

The suite's own waits (a raw peer waiting for a reply, :meth:`Rig.wait_until`)
report progress to the stall deadline (:func:`conformance.supervision.watchdog.progress`):
waiting for a silent server is a "no reply" failure, never ``blocked``.

Every call into a client runs on the main thread under
:func:`conformance.supervision.watchdog.guard`: ``request()`` gets its own timeout plus
the watchdog limit, the others the limit.

Suite values: heartbeat interval 100 ms, timeout 500 ms, request timeout
400 ms; bounds carry :data:`SLACK_MS` for a loaded 2-core machine.
"""

from __future__ import annotations

import itertools
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NoReturn, Self, TypeVar

import zmq

from conformance.contracts.control.spec import ControlSpec
from conformance.contracts.control.wire import PROFILES, Reply, WireProfile
from conformance.drivers.behaviours import StandardHandler
from conformance.errors import CallBlocked, RunError
from conformance.supervision import host_stall, watchdog
from conformance.supervision.runqueue import OwnDeadline
from conformance.testing.credentials import SuiteCredentials
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
    "run_error",
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
#: The positional order of the suite's request bodies (lmcache-mq carries values, not keys).
SUITE_PARAMS: dict[str, tuple[str, ...]] = {
    ECHO: ("nonce", "data"), SLOW: ("nonce", "ms"), FAIL: ("nonce",), BAD: ("nonce",),
    REGISTER: ("worker",),
}
_nonces = itertools.count(1)


def nonce() -> int:
    """A number no other request of this process carries."""
    return next(_nonces)


def suite_body(kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` of one of the suite's request types with every field, in positional order
    (missing ones ``None``); other types' bodies unchanged."""
    params = SUITE_PARAMS.get(kind)
    if params is None:
        return dict(body)
    return {name: body.get(name) for name in params}


def field_of(request: Mapping[str, Any], name: str) -> Any:
    """Field ``name`` of a request a suite handler received: by key (rep-envelope) or by
    position in ``args`` (lmcache-mq)."""
    if name in request:
        return request[name]
    args = request.get("args")
    params = SUITE_PARAMS.get(str(request.get("type")), ())
    if isinstance(args, list) and name in params and params.index(name) < len(args):
        return args[params.index(name)]
    return None


class _ThreadDeaths:
    """Exceptions that ended threads of this process (chained into ``threading.excepthook``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_thread: dict[int, BaseException] = {}
        self._hook: Callable[[threading.ExceptHookArgs], object] | None = None

    def install(self) -> None:
        """Chain into the current hook, unless ours still is it (pytest swaps the hook per
        test, so every server start checks)."""
        with self._lock:
            if self._hook is not None and threading.excepthook is self._hook:
                return
            previous = threading.excepthook

            def hook(args: threading.ExceptHookArgs) -> None:
                if args.thread is not None and args.exc_value is not None:
                    with self._lock:
                        self._by_thread[id(args.thread)] = args.exc_value
                previous(args)

            self._hook = hook
            threading.excepthook = hook

    def of(self, thread: threading.Thread) -> BaseException | None:
        with self._lock:
            return self._by_thread.get(id(thread))


_deaths = _ThreadDeaths()


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
                self.log.append(Seen(generation, str(request.get("type")),
                                     field_of(request, "nonce"), time.monotonic()))

        def echo(request: dict[str, Any]) -> dict[str, Any]:
            note(request)
            return {"nonce": field_of(request, "nonce"), "data": field_of(request, "data")}

        def slow(request: dict[str, Any]) -> dict[str, Any]:
            note(request)
            ms = field_of(request, "ms")
            time.sleep(float(ms or 0) / 1000)
            return {"nonce": field_of(request, "nonce"), "slept_ms": ms}

        def fail(request: dict[str, Any]) -> dict[str, Any]:
            note(request)
            raise RuntimeError("the suite's ZMQC_FAIL handler raised on purpose (CTL-3)")

        def bad(request: dict[str, Any]) -> Any:
            note(request)
            return ["not", "a", "dict"]

        def register(request: dict[str, Any]) -> dict[str, Any]:
            note(request)
            return {"registered": True}

        # Standard behaviours (docs/drivers.md): a driver runs them by name, and the
        # bridge records what it ran through ``note``.
        return {ECHO: StandardHandler("echo", echo, note),
                SLOW: StandardHandler("slow", slow, note),
                FAIL: StandardHandler("raise", fail, note),
                BAD: StandardHandler("bad_reply", bad, note),
                REGISTER: StandardHandler("register", register, note)}

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
                 generation: int, limit: float | None = None,
                 options: Mapping[str, Any] | None = None) -> None:
        self.factory = factory
        #: Keyword arguments of the factory (the CURVE keys, CTL-8).
        self.options = dict(options or {})
        self.endpoint = endpoint
        self.handlers = dict(handlers)
        self.generation = generation
        self.limit = watchdog.default_limit() if limit is None else limit
        self.error: BaseException | None = None
        self.close_error: BaseException | None = None
        self.rounds = 0
        #: The server has no ``serve()``: it runs its own I/O thread(s).
        self.self_driven = False
        #: Threads the factory started (the server's own I/O, watched for death).
        self.threads: list[threading.Thread] = []
        self._in_call: tuple[str, float] | None = None
        #: A call overran the limit and :meth:`check` said so: the verdict stands.
        self._reported_block = False
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._pause = threading.Event()
        self._paused = threading.Event()
        self._build_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"ctl-server-{endpoint}")

    def start(self) -> ServerRunner:
        host_stall.start()
        self._thread.start()
        if not self._ready.wait(self.limit):
            raise CallBlocked(f"server factory({self.endpoint!r})", self.limit)
        if self._build_error is not None:
            raise self._build_error
        return self

    def _run(self) -> None:
        _deaths.install()
        before = set(threading.enumerate())
        try:
            self._in_call = ("factory", time.monotonic())
            server = self.factory(self.endpoint, self.handlers, **self.options)
            self._in_call = None
        except BaseException as exc:
            self._build_error = exc
            self._ready.set()
            return
        me = threading.current_thread()
        self.threads = [t for t in threading.enumerate() if t not in before and t is not me]
        serve = getattr(server, "serve", None)
        self.self_driven = serve is None
        self._ready.set()
        try:
            if serve is None:
                self._stop.wait()
            while serve is not None and not self._stop.is_set():
                if self._pause.is_set():
                    self._paused.set()
                    self._stop.wait(SERVE_ROUND_MS / 1000)
                    continue
                self._in_call = ("serve()", time.monotonic())
                serve(SERVE_ROUND_MS)
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

    def pause(self) -> bool:
        """Stop calling ``serve()`` (requests stay queued in the server, unanswered) until
        :meth:`stop`; True once the loop is paused, False for a server that runs its own
        I/O thread (it cannot be paused from outside)."""
        if self.self_driven:
            return False
        self._pause.set()
        deadline = time.monotonic() + self.limit
        while not self._paused.wait(SERVE_ROUND_MS / 1000):
            self.check()
            if time.monotonic() >= deadline:
                raise CallBlocked(f"server.serve() on {self.endpoint} (while pausing)", self.limit)
        return True

    @property
    def serving(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def dead_loop(self) -> str | None:
        """What ended the server's loop (its serve() raised, an I/O thread died), or None."""
        if self.error is not None:
            return (f"the server's serve loop died: serve() raised "
                    f"{type(self.error).__name__}: {self.error}")
        for thread in self.threads:
            exc = _deaths.of(thread)
            if exc is not None:
                return (f"the server's I/O thread {thread.name!r} died: "
                        f"{type(exc).__name__}: {_first_line(exc)}")
        if self.self_driven and self.threads and not self._stop.is_set() \
                and not any(t.is_alive() for t in self.threads):
            names = ", ".join(repr(t.name) for t in self.threads)
            return f"the server's I/O thread {names} ended while the server was open"
        return None

    def check(self, clause: str = "CTL-3") -> None:
        """Raise if the server's loop died or a call into the server has overrun the limit."""
        dead = self.dead_loop()
        if dead is not None:
            raise AssertionError(f"{clause}: {dead}; the server must keep serving") \
                from self.error
        current = self._in_call
        if current is not None and time.monotonic() - current[1] > self.limit \
                and time.monotonic() - current[1] - host_stall.stolen_ms(current[1]) / 1000 \
                > self.limit:
            # The limit counts only time the host let processes run, as the watchdog's
            # does: a call the host stretched past it is not blocked yet.
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
    """A client under test; every call guarded by the watchdog, results type-checked.

    Under rep-envelope a reply must be a dict; under a profile with typed
    results (``typed``) it may be any value.
    """

    def __init__(self, raw: Any, name: str, request_timeout_ms: int, *,
                 typed: bool = False) -> None:
        self.raw = raw
        self.name = name
        self.request_timeout_ms = request_timeout_ms
        self.typed = typed
        self.closed = False

    def request(self, kind: str, body: Mapping[str, Any]) -> Any:
        limit = self.request_timeout_ms / 1000 + watchdog.default_limit()
        with watchdog.guard(f"{self.name}.request({kind!r})", limit):
            reply = self.raw.request(kind, suite_body(kind, body))
        if not self.typed and not isinstance(reply, dict):
            raise AssertionError(f"{self.name}.request({kind!r}) returned a "
                                 f"{type(reply).__name__}, not a dict")
        return reply

    def attempt(self, kind: str, body: Mapping[str, Any]) -> tuple[Any, Exception | None,
                                                                     float]:
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


def run_error(message: str) -> NoReturn:
    """End the test as an error of the run, not a verdict on the implementation: the suite's
    own peer failed (``message`` says how), so the test is skipped with that reason."""
    raise RunError(message)


class WireClient:
    """A raw pyzmq peer of the server: speaks (or breaks) the wire format by hand.

    ``kind`` is ``zmq.DEALER`` (frames as given) or ``zmq.REQ`` (libzmq adds
    the delimiter). ``profile`` (default rep-envelope) frames :meth:`call`'s
    requests and reads its replies, with ``codes`` for lmcache-mq. Replies
    are read with a deadline; silence returns None. While waiting, ``watch``
    (the rig's check: a dead server loop) runs every few milliseconds and the
    wait counts as progress (:func:`conformance.supervision.watchdog.progress`).
    """

    def __init__(self, endpoint: str, kind: int = zmq.DEALER, *,
                 secure: Callable[[zmq.Socket[bytes]], None] | None = None,
                 profile: WireProfile | None = None, codes: Mapping[str, Any] | None = None,
                 watch: Callable[[], None] | None = None, clause: str = "CTL-1",
                 **options: int) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(kind)
        self.kind = kind
        self.profile = profile or PROFILES["rep-envelope"]
        self.codes = dict(codes or {})
        self.watch = watch
        self.clause = clause
        self.sock.setsockopt(zmq.LINGER, 0)
        if secure is not None:
            secure(self.sock)
        for name, value in options.items():
            self.sock.setsockopt(getattr(zmq, name.upper()), value)
        self.sock.connect(endpoint)

    def send(self, frames: list[bytes]) -> None:
        try:
            self.sock.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            run_error("the suite's raw peer could not queue a request (zmq.Again: its send "
                      "queue is full)")

    def recv(self, timeout_s: float) -> list[bytes] | None:
        """The next message, or None after ``timeout_s``. Once a wait of the running test
        went unanswered, later waits of that test (Hypothesis shrinking it, re-runs) are
        cut to :data:`AFTER_SILENCE_S`: the verdict stands on the full wait, and a silent
        server costs seconds, not minutes, per failing test."""
        full = timeout_s
        if _silence.seen():
            timeout_s = min(timeout_s, AFTER_SILENCE_S)
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if self.sock.poll(max(min(int(left * 1000), _WATCH_EVERY_MS), 1)):
                return self.sock.recv_multipart()
            watchdog.progress()
            if self.watch is not None:
                self.watch()
            if time.monotonic() >= deadline:
                if full >= 1.0:
                    _silence.note()
                return None

    def call(self, kind: str, body: Mapping[str, Any], timeout_s: float) -> Reply | None:
        """One well-formed request of type ``kind`` through the profile; its reply, or None
        after ``timeout_s``. A reply that does not decode under the profile fails
        :attr:`clause`, naming the profile."""
        body = suite_body(kind, body)
        if self.kind == zmq.REQ:
            self.sock.send(self.profile.request(0, kind, body, self.codes)[-1])
            frames = self.recv(timeout_s)
            return None if frames is None else self._read([b"", b"", *frames])
        rid = nonce()
        correlation = self.profile.correlation(rid)
        self.send(self.profile.request(rid, kind, body, self.codes))
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            frames = self.recv(left)
            if frames is None:
                return None
            if frames and frames[0] == correlation:
                return self._read(frames)
        return None

    def _read(self, frames: list[bytes]) -> Reply:
        reply = self.profile.read(frames)
        if reply is None:
            raise AssertionError(
                f"{self.clause}: the reply {frames!r:.160} does not decode under wire profile "
                f"{self.profile.name} ({self.profile.summary})")
        return reply

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


_WATCH_EVERY_MS = 20
#: A raw peer's wait once the running test has met silence (see :meth:`WireClient.recv`).
AFTER_SILENCE_S = 0.2


class _Silence:
    """Which test (``PYTEST_CURRENT_TEST``'s node ID) has seen a reply never come."""

    def __init__(self) -> None:
        self._test: str | None = None

    @staticmethod
    def _current() -> str | None:
        current = os.environ.get("PYTEST_CURRENT_TEST")
        return current.rsplit(" ", 1)[0] if current else None

    def note(self) -> None:
        self._test = self._current()

    def seen(self) -> bool:
        current = self._current()
        return current is not None and current == self._test


_silence = _Silence()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


class Rig:
    """One server (restartable, on a fixed port) and its clients; closes everything.

    ``client_endpoint`` is where clients connect: the server's own endpoint,
    or a proxy's in front of it (:meth:`front`, used by the chaos suite).
    """

    def __init__(self, spec: ControlSpec, *, clause: str = "CTL-3",
                 credentials: SuiteCredentials | None = None) -> None:
        self.spec = spec
        #: The clause a dead server loop is reported under (the test's own).
        self.clause = clause
        #: CURVE keys of the honest server and clients (``None``: authentication off).
        self.credentials = credentials
        self._server_factory: Callable[..., Any] | None = None
        self._server_options: dict[str, Any] = {}
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

    def start_impostor(self, factory: Callable[..., Any],
                       options: Mapping[str, Any]) -> ServerRunner:
        """Start ``factory(endpoint, handlers, **options)`` instead of the server under
        test (an impostor server, CTL-8); later (re)starts run the impostor too."""
        self._server_factory = factory
        self._server_options = dict(options)
        return self.start_server()

    def start_server(self) -> ServerRunner:
        """Start the server (a fresh port the first time, the same port afterwards).

        The server under test gets the rig's credentials (CURVE on) if it has any.
        """
        factory = self._server_factory or self.spec.server_or_reference()
        if self._server_factory is None:
            self._server_options = (self.credentials.server_kwargs()
                                    if self.credentials is not None else {})
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
                              generation=self.generation,
                              options=self._server_options)
        runner.start()
        self.runner = runner
        if not self.client_endpoint:
            self.client_endpoint = self.server_endpoint
        return runner

    def stop_server(self) -> None:
        runner, self.runner = self.runner, None
        if runner is not None:
            try:
                runner.check(self.clause)
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
            self.runner.check(self.clause)

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
        if self.credentials is not None:
            options.update(self.credentials.client_kwargs())
        with watchdog.guard(f"client factory({self.client_endpoint!r}) for {name}"):
            raw = factory(self.client_endpoint, **options)
        client = Client(raw, name, int(options["request_timeout_ms"]),
                        typed=self.spec.capabilities.wire != "rep-envelope")
        self.clients.append(client)
        return client

    def wire(self, kind: int = zmq.DEALER, *,
             secure: Callable[[zmq.Socket[bytes]], None] | None = None,
             **options: int) -> WireClient:
        """A raw peer of the server speaking the declared profile, watching the server;
        ``secure`` makes it a CURVE client before it connects (CTL-8)."""
        wire = WireClient(self.client_endpoint, kind, profile=self.spec.profile,
                          codes=self.spec.capabilities.codes(), watch=self.check,
                          clause=self.clause, secure=secure, **options)
        self.wires.append(wire)
        return wire

    # -- driving --------------------------------------------------------------

    def wait_until(self, condition: Callable[[], T], *, what: str, timeout: float,
                   tick: Iterable[Client] = ()) -> T:
        """Tick ``tick`` and check the server until ``condition()`` holds; fail naming ``what``
        after ``timeout`` seconds of own time (:class:`.runqueue.OwnDeadline`)."""
        clients = list(tick)
        deadline = OwnDeadline(timeout)
        while True:
            self.check()
            watchdog.progress()
            result = condition()
            if result:
                return result
            if deadline.expired():
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
            watchdog.progress()
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
def rig(spec: ControlSpec, *, server: bool = True, clause: str = "CTL-3",
        credentials: SuiteCredentials | None = None) -> Iterator[Rig]:
    """A :class:`Rig` with its server started (unless ``server=False``); a dead server loop
    is reported under ``clause``."""
    with Rig(spec, clause=clause, credentials=credentials) as r:
        if server:
            r.start_server()
        yield r
