"""How long the host kept one process's threads waiting for a CPU.

The kernel counts, per thread, the time it was runnable but not running
(``run_delay``, the second field of ``/proc/PID/task/TID/schedstat``). A
bound on one known process's own time (an engine's exit, a server's
start-up) subtracts that delay: on an overloaded 2-core host an
interpreter's exit alone took 2.5 s of wall time and a Python server's
start-up more than 15 s, nearly all of it spent in the run queue. A thread
that sleeps or waits for a lock is not runnable, so it is not counted: a
process that hangs or dawdles past its bound still misses it at once.

The same holds for the suite's own waits for an implementation
(:class:`OwnDeadline`): "the honest peer's message arrives within 2 s" is a
liveness bound, not a contract time, and when the host leaves the test's
threads in the run queue for most of those 2 s the implementation never had
them. At load 19 on 2 cores with four workers, SEC-1 and SEC-3 timed out
that way on the reference.

Where ``/proc`` has no schedstat (not Linux, or a kernel without
``CONFIG_SCHED_INFO``) the delay reads 0 and bounds are plain wall time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable

__all__ = ["HostDelay", "OwnDeadline", "add_pid_source", "working_pids"]

#: An :class:`OwnDeadline` never stretches past this many times its timeout.
MAX_STRETCH = 10

_pid_sources: list[Callable[[], Iterable[int]]] = []


def add_pid_source(source: Callable[[], Iterable[int]]) -> None:
    """Count the processes ``source()`` names (driver processes, process nodes: where an
    implementation's threads run outside this process) in every :class:`OwnDeadline`."""
    if source not in _pid_sources:
        _pid_sources.append(source)


def working_pids() -> list[int]:
    """This process and those the sources of :func:`add_pid_source` name now."""
    pids = [os.getpid()]
    for source in _pid_sources:
        pids.extend(source())
    return pids


class HostDelay:
    """The run-queue wait of ``pid``'s threads since this object was made.

    Threads that appear later count from when they are first seen; a
    process that has exited reads its last sampled value.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._first: dict[str, int] = {}
        self._last: dict[str, int] = {}
        self.seconds()

    def seconds(self) -> float:
        """Sample now; the delay in seconds since construction."""
        for tid, wait_ns in _runqueue_waits(self.pid).items():
            self._first.setdefault(tid, wait_ns)
            self._last[tid] = wait_ns
        return sum(self._last[t] - self._first[t] for t in self._last) / 1e9

    def longest(self) -> float:
        """Sample now; the largest delay of any one thread since construction, in seconds.

        Never more than the wall time passed, however many threads queued at once:
        the measure for a wait whose critical path is not known.
        """
        self.seconds()
        return max((self._last[t] - self._first[t] for t in self._last), default=0) / 1e9


class OwnDeadline:
    """A wait of ``timeout`` seconds of this process's own time.

    :meth:`expired` is wall time until the timeout passes; from then on the
    deadline moves out by the longest run-queue wait of any one thread of
    this process (the test's, the implementation's libzmq I/O threads) or of
    a process a source names (:func:`add_pid_source`: driver processes),
    counted since the first check after a tenth of the timeout, and never past
    :data:`MAX_STRETCH` times the timeout. One thread's wait, not their sum: a
    sum grows faster than the clock when several threads queue at once. Waits
    that succeed early (nearly all) never read ``/proc``; on an idle host the
    deadline is the plain one, so nothing a slow implementation does is
    excused, only the host's queue.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._start = time.monotonic()
        self._due = self._start + timeout
        self._last = self._start + timeout * MAX_STRETCH
        self._count_from = self._start + timeout / 10
        self._delays: list[HostDelay] | None = None

    def expired(self) -> bool:
        """True once ``timeout`` seconds of own time (or the stretch limit) have passed."""
        now = time.monotonic()
        if self._delays is None and now >= self._count_from:
            self._delays = [HostDelay(pid) for pid in working_pids()]
        if now < self._due:
            return False
        if now >= self._last or self._delays is None:
            return True
        self._due = self._start + self.timeout + max(d.longest() for d in self._delays)
        return now >= self._due


def _runqueue_waits(pid: int) -> dict[str, int]:
    """Run-queue wait (ns) of each thread of ``pid`` (empty once it is gone)."""
    waits: dict[str, int] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return waits
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as stat:
                waits[tid] = int(stat.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return waits
