"""Running the suite's pytest child so that nothing outlives the CLI.

The child runs in its own session (process group), so everything it starts
(xdist workers, embedded toxiproxy servers) can be signalled as one group,
and the kernel ends it if the CLI dies (:mod:`conformance.supervision.lifeline`).

* SIGINT or SIGTERM to the CLI: the group gets SIGINT (pytest's interrupt,
  which still writes the reports of what ran), then SIGKILL after
  :data:`STOP_GRACE_S`; a second signal kills at once.
* The child wrote its report but does not exit (a finalizer of the
  transport blocks its interpreter's exit): killed after
  :data:`EXIT_GRACE_S`.
* When the child has exited, whatever is left in its group is killed.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Final

from conformance.supervision import lifeline

__all__ = ["EXIT_GRACE_S", "STOP_GRACE_S", "Outcome", "run"]

#: After SIGINT, how long the group has to write its reports and exit.
STOP_GRACE_S: Final = 5.0
#: After the report was written, how long the child has to exit on its own
#: (xdist gives its workers 10 s to exit before killing them).
EXIT_GRACE_S: Final = 20.0
_TICK_S = 0.1


@dataclass(frozen=True)
class Outcome:
    """How the child ended: its exit status and the signal that stopped us, if any."""

    returncode: int
    interrupted_by: int | None = None


def run(command: Sequence[str], *, report: Path | None = None,
        env: Mapping[str, str] | None = None) -> Outcome:
    """Run ``command`` as a supervised child (see the module docstring), in ``env``
    (default: this process's environment)."""
    before = _mtime(report)
    received: list[int] = []
    with _catching(received):
        proc = subprocess.Popen(
            list(command), start_new_session=True, preexec_fn=lifeline.preexec(),
            env=dict(env) if env is not None else None,
        )
        group = proc.pid
        exited = _exit_descriptor(proc.pid)
        signalled_at: float | None = None
        reported_at: float | None = None
        while proc.poll() is None:
            if received and signalled_at is None:
                signalled_at = time.monotonic()
                _signal_group(group, signal.SIGINT)
            if len(received) > 1 or (
                signalled_at is not None and time.monotonic() - signalled_at > STOP_GRACE_S
            ):
                _signal_group(group, signal.SIGKILL)
            if reported_at is None and _mtime(report) != before:
                reported_at = time.monotonic()
            if reported_at is not None and time.monotonic() - reported_at > EXIT_GRACE_S:
                _signal_group(group, signal.SIGKILL)
            _wait_a_tick(proc, exited)
        _reap_group(group)
        if exited is not None:
            os.close(exited)
    return Outcome(proc.returncode, received[0] if received else None)


def _exit_descriptor(pid: int) -> int | None:
    """A descriptor that becomes readable when ``pid`` exits (Linux ``pidfd``), or ``None``."""
    with contextlib.suppress(AttributeError, OSError):
        return os.pidfd_open(pid)
    return None


def _wait_a_tick(proc: subprocess.Popen[bytes], exited: int | None) -> None:
    """Wait up to :data:`_TICK_S` for the child to exit.

    ``Popen.wait(timeout)`` polls with sleeps of half a millisecond and more,
    a few hundred wake-ups a second for the whole run; a ``pidfd`` in
    ``select`` sleeps until the child exits, a signal arrives or the tick ends.
    """
    if exited is None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(_TICK_S)
        return
    select.select([exited], [], [], _TICK_S)
    proc.poll()


def _mtime(path: Path | None) -> int | None:
    if path is None:
        return None
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def _signal_group(group: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, sig)


def _reap_group(group: int) -> None:
    """Stop what the child left in its process group: SIGTERM, then SIGKILL."""
    _signal_group(group, signal.SIGTERM)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.02)
    _signal_group(group, signal.SIGKILL)


@contextlib.contextmanager
def _catching(received: list[int]) -> Iterator[None]:
    """Record SIGINT/SIGTERM in ``received`` instead of dying (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def note(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    saved = {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
