"""Taking a freed TCP port the instant it is freed: the race of probe-then-bind, on demand.

A client that picks its port by binding a probe socket to port 0, reading the
port and closing the probe, then binding the real socket to that port, has a
window in which the port is free and anyone may take it (vLLM #24756: two
API servers, or an engine's outgoing connection, got the same port). On an
idle machine the window is microseconds and almost never lost, so a test
that waits for the race catches it once in a blue moon. :class:`PortSquatter`
makes the race certain: while it is active, every TCP port that a Python
socket of this process frees by ``close()`` while it was bound and not
connected (a probe, or a listener) is bound and listened on by the suite at
once, before ``close()`` returns, as the other process of #24756 would. A
later bind of that port fails (a listening socket holds its port against
``SO_REUSEADDR``, which libzmq sets), so the client's construction fails.

A correct late-binding client (port 0 given to its own socket, as libzmq's
``tcp://HOST:*``) never frees a port it means to use and never notices the
squatter. What it cannot see: probes made outside Python's ``socket`` module
(C code), and sockets dropped without ``close()``; :func:`reported_but_free`
covers the other half, a client that reports an address it does not hold
yet.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

__all__ = ["PortSquatter", "reported_but_free"]


class PortSquatter:
    """See the module docstring. Use as a context manager; :attr:`taken` lists what it took."""

    def __init__(self) -> None:
        self.taken: list[tuple[str, int]] = []
        self._held: list[socket.socket] = []
        self._lock = threading.Lock()
        self._original: Any = None

    def __enter__(self) -> PortSquatter:
        original = socket.socket.close
        squatter = self

        def close(sock: socket.socket) -> None:
            freed = _freed_port(sock)
            original(sock)
            if freed is not None:
                squatter._take(sock.family, *freed)

        self._original = original
        socket.socket.close = close  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        socket.socket.close = self._original  # type: ignore[method-assign]
        with self._lock:
            held, self._held = self._held, []
        for sock in held:
            sock.close()

    def _take(self, family: int, host: str, port: int) -> None:
        squat = socket.socket(family, socket.SOCK_STREAM)
        try:
            squat.bind((host, port))  # no SO_REUSEADDR: nobody shares it
            squat.listen(1)
        except OSError:
            self._original(squat)
            return
        with self._lock:
            self._held.append(squat)
            self.taken.append((host, port))


def _freed_port(sock: socket.socket) -> tuple[str, int] | None:
    """``(host, port)`` if closing ``sock`` frees a TCP port it bound and is not connected."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.fileno() == -1:
        return None
    if sock.type != socket.SOCK_STREAM:
        return None
    try:
        host, port = sock.getsockname()[:2]
    except OSError:
        return None
    if not port:
        return None
    try:
        sock.getpeername()
    except OSError:
        return str(host), int(port)
    return None  # a connection's local port: not one a server would reuse


def reported_but_free(address: str) -> bool:
    """Whether a ``tcp://HOST:PORT`` address with a numeric host can be bound by anyone now
    (its owner does not hold it yet). Other addresses: ``False`` (not checked)."""
    if not address.startswith("tcp://"):
        return False
    parts = urlsplit(address)
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        return False
    if host is None or not port:
        return False
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with _plain(family) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False  # held (EADDRINUSE), or not a local address: nothing to tell
    return True


@contextlib.contextmanager
def _plain(family: int) -> Iterator[socket.socket]:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        yield sock
    finally:
        sock.close()
