"""How long the host kept processes from running: evidence that a timing verdict is void.

Some verdicts rest on the host running the suite and the implementation
promptly: a request must fail within its timeout plus a stated slack
(CTL-4), a silent server must be marked dead inside a heartbeat window
(CTL-5), a connection must survive a test that never stops heartbeating it
(CONN-2, SEC-2 with heartbeats at interval 100 ms, timeout 500 ms). On an
overloaded host a runnable process can wait hundreds of milliseconds for a
CPU (measured: 771 ms at load 28 on 2 cores); then a correct implementation
misses the bound, or correctly declares a heartbeat-starved connection dead,
and the verdict would blame it for the host.

:func:`stall_ms` answers "did the host stall processes between ``since`` and
``until``, and by how much?". A small meter *process* (not a thread: a
thread also waits for the GIL, so an implementation holding the GIL would
pass for a stalled host) sleeps :data:`PERIOD_S` in a loop and reports every
wake-up later than :data:`REPORTED_LATENESS_S` with both ``CLOCK_MONOTONIC``
stamps, which are system-wide, so they compare with this process's
``time.monotonic()``. It is a sample of the host, not of the implementation's
own threads: a stall it sees is one every process at its priority could see,
and a stall it misses leaves the verdict standing (the error is on the side
of judging).

Callers compare the stall with the slack their bound has, and end the test
with :class:`~conformance.errors.HostStalled` (a run error, and a re-run) only when the
measured stall explains the miss; see ``docs/load-verdicts.md``.

The meter starts on the first call in a process, lives as long as that
process (it exits by itself once its parent is gone, and :func:`stop` ends
it at exit), and costs one wake-up per 10 ms.
"""

from __future__ import annotations

import atexit
import mmap
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Final

from conformance.errors import CallBlocked, HostStalled
from conformance.supervision.runqueue import HostDelay, working_pids

__all__ = ["PERIOD_S", "REPORTED_LATENESS_S", "Window", "excused", "meter_pid", "running",
           "stall_ms", "start", "stolen_ms", "stop"]

#: The meter's sleep.
PERIOD_S: Final = 0.01
#: Wake-ups later than this are reported (shorter lateness is no stall worth excusing).
REPORTED_LATENESS_S: Final = 0.02
#: How long reports are kept (a test's window is shorter).
_KEEP_S: Final = 600.0
_RECORD: Final = struct.Struct("!dd")
#: How long the first use waits for the meter to run.
_START_WAIT_S: Final = 10.0

#: Shared with the meter: its last wake-up, and how many stalls it has reported.
_STAMP: Final = struct.Struct("dQ")
#: How long a read waits for a report the meter has counted but the reader not yet taken.
_IN_FLIGHT_WAIT_S: Final = 1.0

_METER_CODE: Final = f"""
import mmap, os, struct, sys, time
parent = os.getppid()
out = sys.stdout.buffer
rec = struct.Struct("!dd")
stamp = struct.Struct("dQ")
last = mmap.mmap(int(sys.argv[1]), stamp.size)
reports = 0
# Each interval runs from the previous wake-up, not from the sleep's start: a stop that
# lands anywhere in the loop (or before its first sleep) is inside some interval.
prev = time.monotonic()
stamp.pack_into(last, 0, prev, reports)
out.write(rec.pack(prev, 0.0)); out.flush()
while os.getppid() == parent:
    time.sleep({PERIOD_S!r})
    woke = time.monotonic()
    if woke - prev - {PERIOD_S!r} > {REPORTED_LATENESS_S!r}:
        reports += 1
        stamp.pack_into(last, 0, woke, reports)
        out.write(rec.pack(prev, woke)); out.flush()
    else:
        stamp.pack_into(last, 0, woke, reports)
    prev = woke
"""


class _Meter:
    def __init__(self) -> None:
        # Re-entrant: the watchdog's SIGALRM handler reads the meter in the main thread,
        # possibly while the main thread is reading it already.
        self._lock = threading.RLock()
        self._stalls: deque[tuple[float, float]] = deque()
        self._taken = 0  # reports the reader has taken from the pipe
        # The meter's last wake-up, shared: a stall still in progress (the meter has not
        # woken to report it) is seen at its age, as the delay probe sees records in flight.
        with tempfile.TemporaryFile() as backing:
            backing.write(bytes(_STAMP.size))
            backing.flush()
            self._last_wake = mmap.mmap(backing.fileno(), _STAMP.size)
            self._proc = subprocess.Popen(
                # -I -S: no site, no environment; the meter starts in milliseconds.
                [sys.executable, "-I", "-S", "-c", _METER_CODE, str(backing.fileno())],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                pass_fds=(backing.fileno(),))
        assert self._proc.stdout is not None
        self.pid = self._proc.pid
        self._out = self._proc.stdout
        self._started = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True, name="host-stall-meter")
        self._reader.start()
        # The meter's first record says it runs; until then nothing is measured (a window
        # before it reads as "no stall": the verdict stands).
        self._started.wait(_START_WAIT_S)

    def _read(self) -> None:
        while True:
            data = self._out.read(_RECORD.size)
            if len(data) < _RECORD.size:
                return
            slept, woke = _RECORD.unpack(data)
            if not woke:
                self._started.set()
                continue
            with self._lock:
                self._stalls.append((slept, woke))
                while self._stalls and self._stalls[0][1] < woke - _KEEP_S:
                    self._stalls.popleft()
                self._taken += 1

    def overlapping(self, since: float, until: float) -> list[float]:
        """Lateness of every reported wake-up whose sleep overlapped the window, clipped
        to it (seconds)."""
        now = time.monotonic()
        # The meter counts a report (and stamps its wake-up) before writing it, so a
        # report still in the pipe is known here: wait for the reader only then. Before
        # the count moves, the old stamp shows the same stall as one in progress (below).
        _, reported = _STAMP.unpack_from(self._last_wake, 0)
        patience = now + _IN_FLIGHT_WAIT_S
        while self._taken < reported and time.monotonic() < patience:
            time.sleep(0.0005)
        with self._lock:
            spans = [(slept + PERIOD_S, woke) for slept, woke in self._stalls
                     if woke >= since and slept <= until]
        last, _ = _STAMP.unpack_from(self._last_wake, 0)
        if last and now - last - PERIOD_S > REPORTED_LATENESS_S and last <= until:
            spans.append((last + PERIOD_S, now))  # a stall in progress
        return [max(min(woke, until) - max(due, since), 0.0) for due, woke in spans]

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._out.close()
        self._last_wake.close()


_meter: _Meter | None = None
_meter_pid = 0


def _current() -> _Meter:
    global _meter, _meter_pid
    if _meter is None or _meter_pid != os.getpid():
        _meter, _meter_pid = _Meter(), os.getpid()
    return _meter


def start() -> None:
    """Start measuring now (a window can only be judged from when the meter runs)."""
    _current()


def running() -> bool:
    """Whether this process's meter runs (safe to call anywhere, even in a signal handler:
    it never starts one)."""
    return _meter is not None and _meter_pid == os.getpid() and _meter._started.is_set()


def meter_pid() -> int:
    """The meter process's pid (its tests stall it on purpose with SIGSTOP)."""
    return _current().pid


def stall_ms(since: float, until: float | None = None) -> float:
    """The longest stall (ms late past the meter's sleep) that overlapped
    ``[since, until]`` (``time.monotonic()`` values; ``until`` defaults to now).

    0.0 when the host ran the meter promptly throughout (or before the meter
    had started: call :func:`start` at the beginning of the window).
    """
    end = time.monotonic() if until is None else until
    return max(_current().overlapping(since, end), default=0.0) * 1000


def stolen_ms(since: float, until: float | None = None) -> float:
    """The sum of every stall inside ``[since, until]``: how much of the window the host
    kept a runnable process waiting (a lower bound; see the module docstring)."""
    end = time.monotonic() if until is None else until
    return sum(_current().overlapping(since, end)) * 1000


class Window:
    """How long the host kept the working processes waiting since this object was made.

    :meth:`stolen_ms` is the larger of the meter's summed stalls (:func:`stolen_ms`) and
    the longest run-queue wait of any one thread of this process, the driver and node
    processes (:func:`~conformance.supervision.runqueue.working_pids`) and ``pids``
    (:class:`~conformance.supervision.runqueue.HostDelay`). The meter sleeps between
    samples, so a busy host wakes it promptly while processes that compute wait
    their turn: at load 13-22 a PROC-3 "at once" bound, and in CI a CTL-4 request
    timeout, failed on the reference with the meter's sum under the overrun.
    """

    def __init__(self, pids: Iterable[int] = ()) -> None:
        start()
        self.since = time.monotonic()
        self._queues = [HostDelay(pid) for pid in (*working_pids(), *pids)]

    def stolen_ms(self) -> float:
        queued = max((q.longest() for q in self._queues), default=0.0) * 1000
        return max(stolen_ms(self.since), queued)


@contextmanager
def excused(clause: str, *, slack_ms: float, why: str, in_all: bool = False,
            pids: Iterable[int] = ()) -> Iterator[None]:
    """A failed assertion inside becomes :class:`HostStalled` (a run error) when the host
    stalled for at least ``slack_ms`` in one piece meanwhile: a stall that long lets a correct
    implementation miss what the assertion checks (``why`` says why, e.g. "heartbeat
    timeout - interval: a correct transport may declare a starved connection dead").
    With ``in_all`` the stalls are summed (:func:`stolen_ms`): for a bound that many
    short round trips must fit in, where no single stall need be long, together with
    the working processes' run-queue wait (:class:`Window`, ``pids`` added).

    A blocked call (:class:`CallBlocked`) and every other exception pass unchanged; so does
    the failure when the host ran promptly, which is then the verdict it always was.
    """
    start()
    window = Window(pids) if in_all else None
    since = time.monotonic()
    try:
        yield
    except CallBlocked:
        raise
    except AssertionError as exc:
        stalled = window.stolen_ms() if window is not None else stall_ms(since)
        if stalled < slack_ms:
            raise
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        how = "in all" if in_all else "in one piece"
        raise HostStalled(
            f"{clause}: the host stalled processes for {stalled:.0f} ms {how} during this test "
            f"(overloaded), at least the {slack_ms:.0f} ms of {why}; the failure "
            f"({first[:300]}) says nothing about the implementation") from exc


@atexit.register
def stop() -> None:
    """End the meter process (idempotent; also run at exit)."""
    global _meter
    if _meter is not None and _meter_pid == os.getpid():
        _meter.stop()
    _meter = None
