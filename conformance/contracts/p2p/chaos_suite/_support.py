"""Shared pieces of the chaos clause tests: heartbeat values, bounds, observation.

Bounds (DESIGN.md, "Bounds"): detection is measured from the moment a fault
is in place; a heartbeat already in flight can make it up to one interval
early, so the window is ``[timeout - interval, timeout + interval + slack]``.
The slack is :data:`SLACK_MS` plus the observation granularity (the longest
gap between two observation rounds, each of which polls every node once):
a loaded 2-core CI machine delays libzmq's timers, the monitor event and
the ``poll()`` that reads it.

Recovery after a heal is bounded by the reconnect interval plus the
handshake timeout. The suite cannot read a transport's reconnect settings
through the interface, so it uses the reference transport's documented
values (:data:`RECONNECT_IVL_MAX_MS`, :data:`HANDSHAKE_IVL_MS`) plus the
slack; a transport that recovers more slowly than the reference's settings
allow fails with the measured time in the message.
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from conformance.contracts.p2p.harness import (
    WINDOW_PAUSE_S,
    Connection,
    Node,
    handshake,
    receive,
)
from conformance.contracts.p2p.spec import TransportSpec

__all__ = [
    "HANDSHAKE_IVL_MS",
    "RECONNECT_IVL_MAX_MS",
    "SLACK_MS",
    "Deaths",
    "Heartbeat",
    "Mailbox",
    "Recorder",
    "Tarpit",
    "greet_both_ways",
    "heartbeat_for",
    "report",
    "watch_deaths",
]

#: pytest's ``record_property``.
Recorder = Callable[[str, object], None]

#: Scheduling slack on top of the detection window (see the module docstring).
SLACK_MS = 250
#: The reference transport's reconnect backoff ceiling and handshake limit.
RECONNECT_IVL_MAX_MS = 1000
HANDSHAKE_IVL_MS = 3000


@dataclass(frozen=True)
class Heartbeat:
    """The heartbeat values in force for the transport under test."""

    ivl_ms: int
    timeout_ms: int
    configured: bool

    @property
    def earliest_ms(self) -> int:
        """Earliest correct detection after a fault: ``timeout - interval``."""
        return max(self.timeout_ms - self.ivl_ms, 0)

    def latest_ms(self, granularity_ms: float = 0.0) -> float:
        """Latest correct detection: ``timeout + interval + slack + granularity``."""
        return self.timeout_ms + self.ivl_ms + SLACK_MS + granularity_ms

    @property
    def recovery_bound_ms(self) -> int:
        """Bound on recovery after a heal (reconnect interval + handshake + slack)."""
        return RECONNECT_IVL_MAX_MS + HANDSHAKE_IVL_MS + SLACK_MS

    def describe(self) -> str:
        origin = "suite values" if self.configured else "declared by the transport"
        return f"interval {self.ivl_ms} ms, timeout {self.timeout_ms} ms ({origin})"


def heartbeat_for(spec: TransportSpec, clause: str) -> Heartbeat:
    """The heartbeat values for ``spec``, or skip ``clause`` naming the missing capability.

    Configurable transports get the suite's short values; others must declare
    ``heartbeat_ivl_ms`` and ``heartbeat_timeout_ms``.
    """
    ivl, timeout = spec.heartbeat_ivl_ms, spec.heartbeat_timeout_ms
    if ivl is None or timeout is None:
        missing = [name for name, value in
                   (("heartbeat_ivl_ms", ivl), ("heartbeat_timeout_ms", timeout))
                   if value is None]
        pytest.skip(
            f"{clause}: the transport is not heartbeat_configurable and does not declare "
            f"{' and '.join(missing)} (capabilities: heartbeat_configurable, heartbeat_ivl_ms, "
            "heartbeat_timeout_ms)"
        )
    return Heartbeat(ivl_ms=ivl, timeout_ms=timeout, configured=spec.heartbeat_configurable)


@dataclass
class Deaths:
    """When each watched connection was first seen dead (``time.monotonic()``)."""

    at: dict[str, float] = field(default_factory=dict)
    #: Longest gap between two observation rounds, in milliseconds.
    granularity_ms: float = 0.0
    #: Rounds in which every watched connection was seen alive.
    alive_rounds: int = 0

    def after(self, origin: float) -> dict[str, float]:
        """Death times in milliseconds after ``origin``."""
        return {side: (t - origin) * 1000 for side, t in self.at.items()}


def watch_deaths(
    conns: Mapping[str, Connection],
    *,
    nodes: Iterable[Node],
    until: float,
    stop_when_all_dead: bool = True,
    on_round: Callable[[], object] | None = None,
    done: Callable[[], bool] | None = None,
) -> Deaths:
    """Poll ``nodes`` round after round and note when each connection turns dead.

    Observation: one round polls every open node once, then reads ``alive``
    of every watched connection; the time of the first round that sees a
    connection dead is its detection time. Stops at ``until``
    (``time.monotonic()``) or, with ``stop_when_all_dead``, once all are dead.
    ``on_round()`` (if given) runs once per round, e.g. to keep traffic going;
    ``done()`` (if given) ends the observation early when it returns True.
    """
    node_list = list(nodes)
    deaths = Deaths()
    last = time.monotonic()
    while True:
        for node in node_list:
            if not node.closed:
                node.poll()
        now = time.monotonic()
        deaths.granularity_ms = max(deaths.granularity_ms, (now - last) * 1000)
        last = now
        all_alive = True
        for side, conn in conns.items():
            if side not in deaths.at and not conn.alive:
                deaths.at[side] = now
            if side in deaths.at:
                all_alive = False
        if all_alive:
            deaths.alive_rounds += 1
        if stop_when_all_dead and len(deaths.at) == len(conns):
            return deaths
        if now >= until:
            return deaths
        if on_round is not None:
            on_round()
        if done is not None and done():
            return deaths
        time.sleep(WINDOW_PAUSE_S)


class Mailbox:
    """Everything one node received from one peer, over all its connections to it.

    A node may hold several connection objects for a peer over time (an
    outbound one, the inbound ones ``poll()`` returned after reconnects);
    messages from the peer may land in any of them. :meth:`collect` drains
    every known one (CONN-4: a dead connection's buffered messages stay
    readable) and keeps the messages in arrival order per connection.
    """

    def __init__(self, node: Node, peer_id: str) -> None:
        self.node = node
        self.peer_id = peer_id
        self.messages: list[dict[str, Any]] = []
        self._conns: list[Connection] = []

    def track(self, conn: Connection) -> None:
        if all(c is not conn for c in self._conns):
            self._conns.append(conn)

    def collect(self) -> list[dict[str, Any]]:
        """Pick up new inbound connections from the peer, drain all; return what is new."""
        for conn in self.node.inbound:
            if conn.peer_id == self.peer_id:
                self.track(conn)
        new: list[dict[str, Any]] = []
        for conn in self._conns:
            new.extend(conn.recv())
        self.messages.extend(new)
        return new

    def values(self, key: str) -> list[Any]:
        """``msg[key]`` of every collected message that has ``key``, in order."""
        return [m[key] for m in self.messages if key in m]


@dataclass
class _Held:
    """One connection a :class:`Tarpit` accepted."""

    accepted_at: float
    #: When the peer closed it (``None`` while it is held open).
    closed_at: float | None = None
    received: int = 0


class Tarpit:
    """A hung node on a port: a plain TCP listener that accepts and never writes.

    A ZeroMQ peer connecting to it completes the TCP handshake, sends the
    start of its ZMTP greeting and then waits for a greeting that never
    comes, until its handshake timeout (``ZMQ_HANDSHAKE_IVL``) gives up.
    The tarpit reads and discards what it is sent and notes when a peer
    closes; it never closes an accepted connection itself before
    :meth:`close`, so a swallowed handshake outlives :meth:`close_listener`
    (unlike a toxiproxy ``timeout`` toxic, whose removal closes what it held).

    The listener binds with ``SO_REUSEADDR`` (inherited by accepted sockets),
    so a new node can bind the same port while the accepted connections are
    held. Binding retries for ``bind_window_s`` while the port's previous
    owner releases it. One thread does all socket work (never a socket
    closed from another thread); use it as a context manager so it is
    always stopped.
    """

    def __init__(self, host: str, port: int, *, bind_window_s: float = 3.0) -> None:
        self.host = host
        self.port = port
        self._lock = threading.Lock()
        self._held: list[_Held] = []
        self._listener_closed = threading.Event()
        self._stopping = False
        self._closing_listener = False
        self._error: BaseException | None = None
        self._listener = self._bind(bind_window_s)
        try:
            self._wake_r, self._wake_w = socket.socketpair()
        except BaseException:
            self._listener.close()
            raise
        self._thread = threading.Thread(target=self._run, name=f"tarpit-{port}", daemon=True)
        self._thread.start()

    def _bind(self, window_s: float) -> socket.socket:
        deadline = time.monotonic() + window_s
        while True:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((self.host, self.port))
                sock.listen(64)
                sock.setblocking(False)
                return sock
            except OSError as exc:
                sock.close()
                if exc.errno != errno.EADDRINUSE or time.monotonic() >= deadline:
                    raise OSError(
                        exc.errno, f"tarpit: cannot listen on {self.host}:{self.port}: {exc}"
                    ) from exc
            time.sleep(0.005)

    # -- observation ----------------------------------------------------------

    @property
    def accepted(self) -> int:
        """How many connections were accepted so far."""
        with self._lock:
            return len(self._held)

    def held_since(self, index: int) -> list[float]:
        """Accept times of connections number ``index`` on that are still held open."""
        with self._lock:
            return [h.accepted_at for h in self._held[index:] if h.closed_at is None]

    def closed_since(self, index: int) -> list[float]:
        """When the peers of connections number ``index`` on closed them (if they did)."""
        with self._lock:
            return [h.closed_at for h in self._held[index:] if h.closed_at is not None]

    # -- control --------------------------------------------------------------

    def close_listener(self, timeout: float = 2.0) -> None:
        """Stop accepting (new connections are refused); held connections stay open."""
        self._closing_listener = True
        self._wake()
        if not self._listener_closed.wait(timeout):
            raise AssertionError(f"tarpit on port {self.port}: listener not closed in {timeout} s")
        self._raise_error()

    def close(self) -> None:
        """Close the listener and every held connection, stop the thread (idempotent)."""
        if not self._stopping:
            self._stopping = True
            self._wake()
            self._thread.join(5.0)
            self._wake_w.close()
            if self._thread.is_alive():
                raise AssertionError(f"tarpit on port {self.port}: thread did not stop")
            self._wake_r.close()
        self._raise_error()

    def __enter__(self) -> Tarpit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the thread -------------------------------------------------------------

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # the thread is gone; close() reports why
            self._wake_w.send(b"x")

    def _raise_error(self) -> None:
        if self._error is not None:
            raise AssertionError(f"tarpit on port {self.port} failed: {self._error!r}")

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        conns: dict[socket.socket, _Held] = {}
        listener: socket.socket | None = self._listener
        try:
            sel.register(self._wake_r, selectors.EVENT_READ)
            sel.register(self._listener, selectors.EVENT_READ)
            while not self._stopping:
                if self._closing_listener and listener is not None:
                    sel.unregister(listener)
                    listener.close()
                    listener = None
                    self._listener_closed.set()
                for key, _ in sel.select(timeout=0.5):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if sock is self._wake_r:
                        sock.recv(64)
                    elif sock is listener:
                        self._accept(listener, sel, conns)
                    else:
                        self._read(sock, sel, conns)
        except BaseException as exc:  # reported by close()/close_listener()
            self._error = exc
        finally:
            self._listener_closed.set()
            if listener is not None:
                listener.close()
            for sock in conns:
                sock.close()
            sel.close()

    def _accept(
        self, listener: socket.socket, sel: selectors.BaseSelector,
        conns: dict[socket.socket, _Held],
    ) -> None:
        try:
            sock, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        sock.setblocking(False)
        held = _Held(accepted_at=time.monotonic())
        conns[sock] = held
        sel.register(sock, selectors.EVENT_READ)
        with self._lock:
            self._held.append(held)

    def _read(
        self, sock: socket.socket, sel: selectors.BaseSelector, conns: dict[socket.socket, _Held]
    ) -> None:
        try:
            data = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""  # reset by the peer: closed as well
        held = conns[sock]
        if data:
            held.received += len(data)
            return
        # The peer closed (gave up the handshake): nothing left to hold.
        sel.unregister(sock)
        sock.close()
        del conns[sock]
        with self._lock:
            held.closed_at = time.monotonic()


def greet_both_ways(a: Node, b: Node) -> tuple[Connection, Connection]:
    """``a`` connects to ``b`` and both greet: the connection works both ways."""
    a_out, b_in = handshake(a, b, hello={"hello": "a"})
    b_in.send({"hello": "b"})
    got = receive(a_out, 1, nodes=[b], what="b's answer on the inbound connection, at a")
    assert got == [{"hello": "b"}], f"a received {got!r} instead of b's answer"
    return a_out, b_in


def report(record: Recorder, clause: str, text: str, **values: object) -> str:
    """Record ``values`` as properties and print one line; returns the line."""
    for key, value in values.items():
        record(key, value)
    line = f"{clause}: {text} " + ", ".join(f"{k}={v}" for k, v in values.items())
    print(line)
    return line
