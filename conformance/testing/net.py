"""Hosts and ports for tests of any family: a free port, EADDRINUSE, an address nobody answers.

Every family's harness builds its endpoints on :data:`HOST` with
:func:`free_port`; a bind that then fails with ``EADDRINUSE`` (another
process or xdist worker took the port in between) is recognised by
:func:`is_address_in_use` and retried on a new port by the caller.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import zmq

__all__ = ["HOST", "free_port", "is_address_in_use", "unreachable_address"]

HOST = "127.0.0.1"


def free_port(host: str = HOST) -> int:
    """A TCP port on ``host`` that was free a moment ago.

    Binds port 0, reads the port the kernel chose and closes the socket. The
    port can be taken again before the caller binds it; callers retry on
    ``EADDRINUSE`` (:meth:`Cluster.add_node` does).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def is_address_in_use(exc: BaseException) -> bool:
    """True when ``exc`` (or an exception it was raised from) is ``EADDRINUSE``.

    Transports wrap bind errors in their own exceptions, so the whole chain
    and the message text are inspected.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, zmq.ZMQError) and current.errno == zmq.EADDRINUSE:
            return True
        if isinstance(current, OSError) and current.errno == errno.EADDRINUSE:
            return True
        if "address already in use" in str(current).lower():
            return True
        current = current.__cause__ or current.__context__
    return False


@contextmanager
def unreachable_address(host: str = HOST) -> Iterator[str]:
    """A ``"host:port"`` nobody listens on, for as long as the block runs.

    The port is bound but not listening, so connecting to it is refused, no
    other process can start listening on it, and the kernel cannot hand it
    out as the source port of a connection (which could make a connection to
    it connect to itself).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        yield f"{host}:{sock.getsockname()[1]}"
