"""Counting this process's descriptors and threads (RES-1, RES-2, CONN-5).

A transport's sockets live in libzmq, so the suite cannot ask them whether
they were closed; it counts what the operating system sees instead: open file
descriptors (``/proc/self/fd``, ``/dev/fd`` or psutil) and OS threads
(``/proc/self/task`` or psutil), which include libzmq's I/O and reaper
threads that Python's ``threading`` module never sees.

Implementations that run in driver processes (:mod:`conformance.drivers`)
are counted where they live: a snapshot adds what each live driver process
opened since its hello (descriptors keyed ``"pid:fd"``, threads beyond its
hello-time count) and leaves out the pipes and the helper thread this
process keeps for drivers, so a driver started in the middle of a
measurement does not look like a leak (see :func:`add_source`).

Two libzmq facts shape how to use this module:

- The first connection in a context allocates a few descriptors that stay, so
  take the baseline after a warm-up cycle, never before the first use.
- ``zmq_close()`` returns before the descriptors are closed (libzmq's reaper
  thread does it), so compare with :func:`wait_for_release`, which waits for
  the counts to come back down, never with one immediate snapshot.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "ResourceSnapshot",
    "add_source",
    "fd_count",
    "snapshot",
    "supported",
    "wait_for_release",
    "wait_until_stable",
]

_FD_DIRS = ("/proc/self/fd", "/dev/fd")
_TASK_DIR = "/proc/self/task"


@dataclass(frozen=True)
class ResourceSnapshot:
    """Open descriptors (number -> what it points at) and the OS thread count."""

    fds: Mapping[int | str, str]
    threads: int

    @property
    def fd_count(self) -> int:
        return len(self.fds)

    def describe_growth(self, baseline: ResourceSnapshot) -> str:
        """A one-paragraph account of what is open now that was not at ``baseline``."""
        added = {fd: what for fd, what in self.fds.items() if baseline.fds.get(fd) != what}
        kinds: dict[str, int] = {}
        for what in added.values():
            kind = what.split(":", 1)[0] if ":" in what else what
            kinds[kind] = kinds.get(kind, 0) + 1
        detail = ", ".join(f"{n} x {kind}" for kind, n in sorted(kinds.items())) or "none new"
        return (
            f"descriptors {baseline.fd_count} -> {self.fd_count} (new: {detail}); "
            f"threads {baseline.threads} -> {self.threads}"
        )


def supported() -> bool:
    """True when descriptors can be counted on this platform."""
    return _fd_dir() is not None or _psutil_process() is not None


class Source(Protocol):
    """What another part of the suite holds or runs elsewhere (see :func:`add_source`)."""

    def __call__(self, *, targets: bool) -> tuple[set[int], int, dict[str, str], int]: ...


_sources: list[Source] = []


def add_source(source: Source) -> None:
    """Count resources that live outside this process, and leave out some that live in it.

    ``source(targets=...)`` returns ``(hidden_fds, hidden_threads, fds, threads)``:
    this process's descriptors and number of threads that belong to the suite's
    machinery rather than to the implementation (left out), and the
    descriptors (keyed by any unique string) and threads the implementation
    holds in other processes (added). With ``targets`` False the descriptors'
    targets may be left empty: only their number is used (:func:`fd_count`,
    the wait loops), and it must be cheap.
    """
    if source not in _sources:
        _sources.append(source)


def snapshot() -> ResourceSnapshot:
    """Count this process's open descriptors and OS threads now (plus :func:`add_source`'s)."""
    fds: dict[int | str, str] = {fd: what for fd, what in _open_fds().items()}
    threads = _thread_count()
    for source in _sources:
        hidden_fds, hidden_threads, extra_fds, extra_threads = source(targets=True)
        for fd in hidden_fds:
            fds.pop(fd, None)
        fds.update(extra_fds)
        threads += extra_threads - hidden_threads
    return ResourceSnapshot(fds=fds, threads=threads)


def fd_count() -> int:
    """The descriptor count a :func:`snapshot` taken now would have, without reading
    what each descriptor points at.

    A directory listing instead of one ``readlink`` per descriptor: cheap
    enough for every step of a state machine (a snapshot of a few hundred
    descriptors costs about a millisecond of system time).
    """
    return _counts(threads=False)[0]


def wait_until_stable(
    *, drive: Callable[[], object] | None = None, quiet: float = 0.05, timeout: float = 1.0
) -> ResourceSnapshot:
    """A snapshot taken once the counts have not changed for ``quiet`` seconds.

    Use it for baselines: descriptors of sockets closed just before are still
    being released by libzmq. ``drive`` (e.g. polling the live nodes) is
    called between samples (counts only, see :func:`fd_count`). Gives up
    after ``timeout`` and returns a snapshot taken then: a baseline that is
    too high only makes a check more lenient.
    """
    deadline = time.monotonic() + timeout
    last = _counts()
    since = time.monotonic()
    while time.monotonic() < deadline:
        if drive is not None:
            drive()
        time.sleep(0.002)
        now = _counts()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return snapshot()


def wait_for_release(
    baseline: ResourceSnapshot,
    *,
    what: str,
    drive: Callable[[], object] | None = None,
    timeout: float = 5.0,
    fd_slack: int = 0,
    thread_slack: int = 0,
    check_threads: bool = True,
) -> ResourceSnapshot:
    """Wait until descriptors (and threads) are back to ``baseline`` plus slack.

    ``drive`` is called between samples (poll the nodes that are still
    open). Raises ``AssertionError`` starting with ``what`` and listing the
    kinds of descriptors still open after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        fds, threads = _counts()
        fds_ok = fds <= baseline.fd_count + fd_slack
        threads_ok = not check_threads or threads <= baseline.threads + thread_slack
        if fds_ok and threads_ok:
            return snapshot()
        if time.monotonic() >= deadline:
            now = snapshot()
            raise AssertionError(
                f"{what}: resources not released within {timeout:.1f} s: "
                f"{now.describe_growth(baseline)} (allowed slack: {fd_slack} descriptors, "
                f"{thread_slack} threads)"
            )
        if drive is not None:
            drive()
        time.sleep(0.002)


def _counts(*, threads: bool = True) -> tuple[int, int]:
    """(descriptors, threads) as :func:`snapshot` would count them, from listings only
    (threads 0 unless asked for)."""
    path = _fd_dir()
    numbers: set[int] = set()
    if path is None:
        fds = len(_open_fds())
    else:
        numbers = {int(name) for name in os.listdir(path) if name.isdigit()}
        # The listing's own descriptor is among them (snapshot() drops it as the one
        # that no longer resolves); hidden descriptors are open, so never that one.
        fds = len(numbers) - 1
    tasks = _thread_count() if threads else 0
    for source in _sources:
        hidden_fds, hidden_threads, extra_fds, extra_threads = source(targets=False)
        fds += len(extra_fds) - len(hidden_fds & numbers if path is not None else hidden_fds)
        tasks += extra_threads - hidden_threads
    return fds, tasks


@functools.cache
def _fd_dir() -> str | None:
    for path in _FD_DIRS:
        if os.path.isdir(path):
            return path
    return None


def _open_fds() -> dict[int, str]:
    path = _fd_dir()
    if path is None:
        process = _psutil_process()
        if process is None:
            raise RuntimeError("cannot count file descriptors on this platform")
        return {i: "fd" for i in range(process.num_fds())}
    fds: dict[int, str] = {}
    # listdir's own directory descriptor is listed too; it is closed again at
    # once, so drop entries that no longer resolve.
    for name in os.listdir(path):
        try:
            fd = int(name)
        except ValueError:
            continue
        try:
            fds[fd] = os.readlink(os.path.join(path, name))
        except OSError:
            try:  # no readlink on /dev/fd (macOS): keep it if it is still open
                os.fstat(fd)
            except OSError:
                continue
            fds[fd] = "fd"
    return fds


def _thread_count() -> int:
    try:
        return len(os.listdir(_TASK_DIR))
    except OSError:
        pass
    process = _psutil_process()
    if process is not None:
        return int(process.num_threads())
    return threading.active_count()


def _psutil_process() -> Any:
    if "psutil" not in sys.modules:
        try:
            import psutil
        except ImportError:
            return None
    import psutil

    return psutil.Process()
