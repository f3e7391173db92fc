"""Child processes that never outlive their parent.

Everything the suite starts (the CLI's pytest child, its xdist workers, the
embedded toxiproxy server, self-check's runs) must end when the process that
started it ends, even when that one is killed with SIGKILL and can clean up
nothing. Two mechanisms, because neither is enough alone:

* Linux ``PR_SET_PDEATHSIG``: the kernel signals the child when its parent
  dies. It is tied to the parent *thread* that forked, so it is only set up
  for children forked from the main thread, and it does not fire when the
  parent died before the call (checked right after).
* A daemon thread in the child that polls ``getppid()`` and ends the process
  when it has been reparented (any platform, any forking thread).

:func:`preexec` is for ``subprocess.Popen(preexec_fn=...)`` (the launcher of
the toxiproxy server, the CLI); :func:`bind_to_parent` is for a process
to call on itself (xdist workers, which execnet starts).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["bind_to_parent", "preexec", "process_alive"]

_PR_SET_PDEATHSIG = 1
#: How often the watcher thread checks whether the parent is still there.
_POLL_S = 0.5


def _load_prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Resolved at import, before any fork: a child between fork and exec must not dlopen().
_PRCTL = _load_prctl()


def _set_pdeathsig(sig: int) -> None:
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, sig, 0, 0, 0)


def preexec(
    sig: int = signal.SIGTERM, *, thread_outlives_child: bool = False
) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the kernel send ``sig`` to the child when we die.

    ``None`` (no ``preexec_fn``) off Linux, or outside the main thread unless
    the caller promises that the forking thread outlives the child (it waits
    for it): the death signal follows the forking *thread*, so a child forked
    by a short-lived helper thread would be killed when that thread ends.
    """
    if _PRCTL is None:
        return None
    if not thread_outlives_child and threading.current_thread() is not threading.main_thread():
        return None
    return lambda: _set_pdeathsig(sig)


def bind_to_parent(
    sig: int = signal.SIGTERM, *, on_orphan: Callable[[], None] | None = None
) -> None:
    """End this process when its parent dies (call it early, from the main thread).

    Sets ``PR_SET_PDEATHSIG`` (Linux) and starts a daemon thread that notices
    a reparenting within half a second; then it calls ``on_orphan`` (default:
    ``os._exit(1)``: nobody is left to report to, and finalizers of a
    misbehaving transport could block a normal exit).
    """
    parent = os.getppid()
    if threading.current_thread() is threading.main_thread():
        _set_pdeathsig(sig)
    action = on_orphan or (lambda: os._exit(1))
    if os.getppid() != parent:
        action()
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_POLL_S)
        action()

    threading.Thread(target=watch, name="zmq-conformance-lifeline", daemon=True).start()


def process_alive(pid: int) -> bool:
    """Whether a process with id ``pid`` exists (one of another user's counts too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
