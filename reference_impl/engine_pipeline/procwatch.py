"""Watching another process for its end, without being its parent.

A client watches the engine processes it learnt from their HELLO (their pid);
an engine watches the clients it was welcomed by. On Linux a pidfd becomes
readable when its process terminates, so the watch sits in the same
``zmq.Poller`` as the sockets and a death is seen at once; elsewhere
:meth:`ProcessWatch.exited` falls back to ``kill(pid, 0)``.
"""

from __future__ import annotations

import os
import select

__all__ = ["ProcessWatch"]


class ProcessWatch:
    """The end of process ``pid``: :meth:`exited`, and :attr:`fd` for a poller (or ``None``)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd: int | None = None
        opener = getattr(os, "pidfd_open", None)
        if opener is not None:
            try:
                self.fd = opener(pid)
            except OSError:
                self.fd = None
        self._gone = self.fd is None and not _exists(pid)

    def exited(self) -> bool:
        """Whether the process has terminated (a zombie counts as terminated)."""
        if self._gone:
            return True
        if self.fd is not None:
            ready, _, _ = select.select([self.fd], [], [], 0)
            self._gone = bool(ready)
        else:
            self._gone = not _exists(self.pid)
        return self._gone

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
