"""Mutant transports that only process faults expose (PROC-1..3).

Same rules as :mod:`conformance.selfcheck.transports`: each class subclasses
the reference, changes as little as possible, and marks the defect with
``# MUTATION``. What sets these apart is *when* the defect shows: a pause
(SIGSTOP) that the node's kernel hides from TCP, the first ``poll()`` after
such a stall, or a death that skips ``close()``. Proxies and in-process
restarts never trigger them.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
from typing import Any, ClassVar

import zmq

from reference_impl._monitor import monitor_event
from reference_impl.p2p.transport import ZmqConnection, ZmqTransport, _bracket

__all__ = ["StaleIdentityLock", "StallSuppressesDisconnects", "TcpKeepaliveLiveness"]


class TcpKeepaliveLiveness(ZmqTransport):
    """Liveness from TCP alone: keepalive probes and disconnect events, no ZMTP heartbeat.

    A stopped process's kernel answers keepalive probes and ACKs data, so a
    pause never produces a disconnect event.
    """

    def _apply_common_options(self, sock: zmq.Socket[bytes]) -> None:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.HANDSHAKE_IVL, self.handshake_ivl_ms)
        # MUTATION: TCP keepalive instead of HEARTBEAT_IVL / _TIMEOUT / _TTL
        sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
        sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, 1)
        sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, 1)
        sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, 1)


class _StallBlindConnection(ZmqConnection):
    def _drain_monitor(self) -> None:
        if self._released:
            return
        transport: Any = self._transport
        while True:
            try:
                frames = self._monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            event = monitor_event(frames)
            if event != zmq.EVENT_DISCONNECTED or not self._alive:
                continue
            if transport._in_stall_grace():
                continue  # MUTATION: a disconnect right after our own stall is "not real"
            self._alive = False


class StallSuppressesDisconnects(ZmqTransport):
    """After a stall (a gap between polls longer than timeout + interval), disconnects read
    during the next heartbeat timeout are taken for artefacts of the stall and dropped.

    The node that was paused therefore never learns that its peers gave up on it:
    its connections stay ``alive`` and swallow the peers' reconnects.
    """

    connection_class = _StallBlindConnection
    _last_poll_at: float | None = None
    _grace_until: float = 0.0

    def poll(self) -> list[ZmqConnection]:
        now = time.monotonic()
        stall_s = (self.heartbeat_timeout_ms + self.heartbeat_ivl_ms) / 1000
        if self._last_poll_at is not None and now - self._last_poll_at > stall_s:
            self._grace_until = now + self.heartbeat_timeout_ms / 1000  # MUTATION
        self._last_poll_at = now
        return super().poll()

    def _in_stall_grace(self) -> bool:
        return time.monotonic() < self._grace_until


class StaleIdentityLock(ZmqTransport):
    """Guards "one node per identity" with a lock file that only ``close()`` removes.

    A node that dies without closing leaves the lock behind; its replacement
    finds the identity "still held" and stays unbound until the lock is older
    than :attr:`lease_s`, so it is unreachable right after a restart. A clean
    close (every in-process restart) removes the lock, so nothing else shows it.
    """

    #: Age after which a lock counts as abandoned and is taken over.
    lease_s: ClassVar[float] = 30.0

    def __init__(self, local_id: str, host: str, port: int, **kwargs: Any) -> None:
        super().__init__(local_id, host, port, **kwargs)
        self._lock_path = os.path.join(
            tempfile.gettempdir(),
            "zmqc-mutant-identity-" + re.sub(r"[^A-Za-z0-9]", "_", f"{host}_{port}") + ".lock",
        )
        self._endpoint = f"tcp://{_bracket(host)}:{port}"
        self._owns_lock = self._take_lock()
        if not self._owns_lock:
            self._router.unbind(self._endpoint)  # MUTATION: wait for the "old owner"

    def _take_lock(self) -> bool:
        try:
            fd = os.open(self._lock_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            try:
                age = time.time() - os.stat(self._lock_path).st_mtime
            except FileNotFoundError:
                return self._take_lock()
            if age < self.lease_s:
                return False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._lock_path)
            return self._take_lock()
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True

    def poll(self) -> list[ZmqConnection]:
        if not self._owns_lock and not self.closed and self._take_lock():
            self._owns_lock = True
            self._router.bind(self._endpoint)
        return super().poll()

    def close(self) -> None:
        if self._owns_lock and not self.closed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._lock_path)
            self._owns_lock = False
        super().close()
