"""Measure the delay a toxiproxy server really adds while a latency toxic is in place.

A latency toxic of ``L`` +- ``J`` ms promises that every byte crosses the
proxy ``L`` +- ``J`` ms late, and the chaos machine reasons from that promise:
under the suite's heartbeat (interval ``I``, timeout ``T``) the longest gap
between two messages a node receives is at most ``I + L + J``, so a
connection reported dead while ``I + L + J`` stays well below ``T`` is a
false death (HB-2). The proxy server is part of the suite, not of the
implementation under test, and under CPU load it can keep its promise badly
(the embedded Python server was measured emitting chunks up to 225 ms later
than configured). A death then says nothing about the implementation.

:class:`DelayProbe` checks the promise while it is in force: it opens its own
proxy on the same server, puts the same latency toxic on both directions,
and sends a small timestamped record every :data:`PROBE_PERIOD_S` from each
end of one TCP connection through it. Both ends live in this process, so one
monotonic clock stamps sending and receiving and each direction's one-way
delay is exact. :meth:`DelayProbe.worst_delay_ms` is the largest one-way delay
seen so far, counting records still in flight at their age, so a proxy that
stalls right now is seen before its records come out.

The probe measures the server, not the node's own connection: a stall of the
server's event loop or of its host shows up on every proxy at once, which is
the lateness measured under load. The caller adds a stated slack for the rest.
"""

from __future__ import annotations

import selectors
import socket
import struct
import threading
import time
from collections import deque

from chaos.proxy import Proxy, Toxiproxy

__all__ = ["PROBE_PERIOD_S", "DelayProbe"]

#: Each end sends one record this often (well below any latency the machine
#: draws, so several records are always in flight and a stall ages them).
PROBE_PERIOD_S = 0.02

_RECORD = struct.Struct("!d")


class _End:
    """One end of the probe connection: what it sent and has not seen arrive."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sent: deque[float] = deque()  # stamps sent by the *other* end, oldest first
        self.buffer = b""


class DelayProbe:
    """A timestamp stream through its own proxy with ``latency_ms`` +- ``jitter_ms``.

    Start it with :meth:`start` right after the fault it shadows is in place,
    read :meth:`worst_delay_ms` whenever a verdict depends on the delay, and
    :meth:`close` it when the fault heals (idempotent; destroys its proxy).
    """

    def __init__(self, server: Toxiproxy, *, latency_ms: int, jitter_ms: int) -> None:
        self.latency_ms = latency_ms
        self.jitter_ms = jitter_ms
        self._server = server
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._worst_s = 0.0
        self._thread: threading.Thread | None = None
        self._proxy: Proxy | None = None
        self._ends: list[_End] = []
        self._listener: socket.socket | None = None

    def start(self) -> DelayProbe:
        """Create the proxy and its toxics, connect through it, start measuring."""
        listener = socket.create_server(("127.0.0.1", 0))
        self._listener = listener
        port = listener.getsockname()[1]
        self._proxy = self._server.create_proxy(
            self._server.unique_name("delay_probe"), upstream=f"127.0.0.1:{port}")
        for stream in ("upstream", "downstream"):
            self._proxy.add_toxic("latency", stream=stream, name=f"probe_{stream}",
                                  latency=self.latency_ms, jitter=self.jitter_ms)
        client = socket.create_connection(
            (self._proxy.listen_host, self._proxy.listen_port), timeout=5.0)
        listener.settimeout(5.0)
        served, _ = listener.accept()
        for sock in (client, served):
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._ends = [_End(client), _End(served)]
        self._thread = threading.Thread(target=self._run, name="delay-probe", daemon=True)
        self._thread.start()
        return self

    def worst_delay_ms(self) -> float:
        """The largest one-way delay so far, records in flight counted at their age."""
        now = time.monotonic()
        with self._lock:
            worst = self._worst_s
            for end in self._ends:
                if end.sent:
                    worst = max(worst, now - end.sent[0])
        return worst * 1000

    def close(self) -> None:
        """Stop measuring, close both ends and destroy the proxy (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        for end in self._ends:
            end.sock.close()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._proxy is not None:
            proxy, self._proxy = self._proxy, None
            proxy.destroy()

    # -- the measuring thread ------------------------------------------------

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        for index, end in enumerate(self._ends):
            selector.register(end.sock, selectors.EVENT_READ, index)
        next_send = time.monotonic()
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= next_send:
                    for index, end in enumerate(self._ends):
                        self._send(end, self._ends[1 - index], now)
                    next_send = now + PROBE_PERIOD_S
                for key, _ in selector.select(timeout=max(next_send - time.monotonic(), 0)):
                    self._receive(self._ends[key.data])
        except OSError:
            pass  # the proxy went away (server stopped); the last reading stands
        finally:
            selector.close()

    def _send(self, end: _End, other: _End, now: float) -> None:
        with self._lock:
            other.sent.append(now)
        try:
            end.sock.send(_RECORD.pack(now))
        except BlockingIOError:
            with self._lock:
                other.sent.pop()  # not sent; a full buffer is itself seen as age

    def _receive(self, end: _End) -> None:
        data = end.sock.recv(4096)
        if not data:
            raise OSError("probe connection closed")
        end.buffer += data
        now = time.monotonic()
        count = len(end.buffer) // _RECORD.size
        end.buffer = end.buffer[count * _RECORD.size:]
        with self._lock:
            for _ in range(count):
                if end.sent:
                    self._worst_s = max(self._worst_s, now - end.sent.popleft())
