"""Fixtures for the toxiproxy tests: the worker's toxiproxy handle, a TCP echo server,
the real toxiproxy-server binary, and a server of one test's own (embedded or real)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.fixtures import toxiproxy, toxiproxy_reset
from chaos.launcher import BINARY, ENV_SERVER, start_binary
from chaos.proxy import Toxiproxy

__all__ = ["echo_server", "own_server", "real_binary", "toxiproxy", "toxiproxy_reset"]

#: Where CI puts the real server: ``../shared/toxiproxy/`` beside the checkout.
_SHARED_COPY = Path(__file__).resolve().parents[2].parent / "shared" / "toxiproxy" / BINARY


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "chaos: fault-injection tests through a toxiproxy (embedded or real)"
    )


class EchoServer:
    """Threaded TCP echo server on 127.0.0.1 (port 0).

    A read of exactly ``close_command`` makes it close that connection.
    """

    close_command = b"__close__"

    def __init__(self) -> None:
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = int(self._listener.getsockname()[1])
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self.accepted = 0
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._conns.append(conn)
                self.accepted += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while True:
                data = conn.recv(65536)
                if not data or data == self.close_command:
                    break
                conn.sendall(data)
        with contextlib.suppress(OSError):
            conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._conns = self._conns, []
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        self._thread.join(5)


@pytest.fixture
def echo_server() -> Iterator[EchoServer]:
    server = EchoServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def real_binary() -> str:
    """The real toxiproxy-server: ``$TOXIPROXY_SERVER``, else on ``PATH``, else the
    shared copy beside the checkout; the test is skipped when there is none."""
    configured = os.environ.get(ENV_SERVER, "").strip()
    if configured:
        return configured
    on_path = shutil.which(BINARY)
    if on_path:
        return on_path
    if os.access(_SHARED_COPY, os.X_OK):
        return str(_SHARED_COPY)
    pytest.skip(f"no real {BINARY}: set {ENV_SERVER}, put it on PATH, or provide "
                f"../shared/toxiproxy/{BINARY} beside the checkout")


@pytest.fixture(params=["embedded", "binary"])
def own_server(request: pytest.FixtureRequest) -> Iterator[Toxiproxy]:
    """A server of this test alone (the test may pause or kill it), embedded or the
    real binary; stopped at the end."""
    if request.param == "binary":
        lease = start_binary(request.getfixturevalue("real_binary"))
        handle = Toxiproxy(lease.host, lease.port, lease=lease)
    else:
        handle = Toxiproxy.start("embedded")
    try:
        yield handle
    finally:
        handle.stop()
