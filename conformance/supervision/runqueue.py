"""How long the host kept one process's threads waiting for a CPU.

The kernel counts, per thread, the time it was runnable but not running
(``run_delay``, the second field of ``/proc/PID/task/TID/schedstat``). A
bound on one known process's own time (an engine's exit, a server's
start-up) subtracts that delay: on an overloaded 2-core host an
interpreter's exit alone took 2.5 s of wall time and a Python server's
start-up more than 15 s, nearly all of it spent in the run queue. A thread
that sleeps or waits for a lock is not runnable, so it is not counted: a
process that hangs or dawdles past its bound still misses it at once.

Where ``/proc`` has no schedstat (not Linux, or a kernel without
``CONFIG_SCHED_INFO``) the delay reads 0 and bounds are plain wall time.
"""

from __future__ import annotations

import os

__all__ = ["HostDelay"]


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
