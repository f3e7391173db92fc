"""What a test process leaves behind when it hangs or dies, and reading it back.

The watchdog (:mod:`conformance.supervision.watchdog`) interrupts a call that blocks,
but only where Python gets control back: not a call stuck in C with the GIL
held, a finalizer that blocks (``Context.__del__`` waiting in ``term()``
during a garbage collection), a thread that spins, or a process killed by
``SIGABRT``/``SIGSEGV`` inside libzmq. For those, the process running the
tests (an xdist worker) keeps a :class:`Sentinel`:

* ``faulthandler`` writes the stack of every thread to a per-worker *trace*
  file on a fatal signal;
* a *stall deadline* (``faulthandler.dump_traceback_later(exit=True)``) ends
  the process, with the stacks, when a test makes no progress for the stall
  limit. Progress is a call into the transport starting (the watchdog reports
  each one), so a long but live test (chaos, Hypothesis shrinking) is never
  cut while a hang is caught within the limit;
* a per-worker *journal* names the test in progress and its clauses.

pytest-xdist then reports the test as crashed and starts a new worker; the
controller reads the journal and trace (:func:`examine`) and reports the
test ``blocked`` (the stall deadline fired) or ``crashed`` (a signal).
Without xdist the deadline still ends a hung run, but nobody is left to
write the report: the CLI always runs workers.
"""

from __future__ import annotations

import faulthandler
import json
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["DEFAULT_STALL_LIMIT_S", "Crash", "Sentinel", "examine"]

#: A test that starts no call into the transport for this long is hung. Above
#: anything legitimate between two calls: a call's own watchdog limit (5 s), a
#: toxiproxy server starting (up to 15 s).
DEFAULT_STALL_LIMIT_S: Final = 30.0
#: The stall deadline is re-armed at most this often (re-arming restarts
#: faulthandler's thread; every call would be too costly).
_REARM_EVERY_S = 1.0
_TRACE_LIMIT = 12000
_TIMEOUT_HEADER = re.compile(r"^Timeout \(")
_FATAL_HEADER = re.compile(r"^Fatal Python error: (.+)$", re.MULTILINE)


def _trace_path(directory: Path, worker: str) -> Path:
    return directory / f"{worker}.trace"


def _journal_path(directory: Path, worker: str) -> Path:
    return directory / f"{worker}.test.json"


class Sentinel:
    """The test process's side: traces on fatal signals, the stall deadline, the journal.

    One per process (``faulthandler`` is process-wide). :meth:`begin` and
    :meth:`end` bracket each test, :meth:`progress` is called on every call
    into the transport, :meth:`finish` bounds the process's own teardown.
    """

    def __init__(self, directory: Path, worker: str, stall_limit: float) -> None:
        if not stall_limit > 0:
            raise ValueError(f"stall limit must be positive, got {stall_limit!r}")
        self.directory = directory
        self.worker = worker
        self.stall_limit = stall_limit
        self._journal = _journal_path(directory, worker)
        self._trace_fd = os.open(
            _trace_path(directory, worker), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600
        )
        self._armed_at: float | None = None

    def begin(self, nodeid: str, clauses: tuple[str, ...], properties: dict[str, str]) -> None:
        """A test starts: journal it, clear the trace, arm the stall deadline."""
        record = {"nodeid": nodeid, "clauses": list(clauses), "properties": properties,
                  "stall_limit": self.stall_limit}
        tmp = self._journal.with_suffix(".tmp")
        tmp.write_text(json.dumps(record), encoding="utf-8")
        tmp.replace(self._journal)
        os.ftruncate(self._trace_fd, 0)
        os.lseek(self._trace_fd, 0, os.SEEK_SET)
        # Again for every test: pytest's own faulthandler plugin points it at stderr.
        faulthandler.enable(file=self._trace_fd, all_threads=True)
        self._arm()

    def progress(self) -> None:
        """The test made progress: push the stall deadline back (cheaply)."""
        if self._armed_at is not None and time.monotonic() - self._armed_at >= _REARM_EVERY_S:
            self._arm()

    def end(self) -> None:
        """The test is over (every phase reported): disarm and clear the journal."""
        faulthandler.cancel_dump_traceback_later()
        self._armed_at = None
        self._journal.unlink(missing_ok=True)

    def finish(self, grace: float) -> None:
        """The session is over: end the process if its teardown takes more than ``grace``.

        Finalizers of a misbehaving transport run at interpreter exit; the
        reports are out by now, so a blocked exit is cut short.
        """
        faulthandler.dump_traceback_later(grace, exit=True, file=self._trace_fd)
        self._armed_at = None

    def _arm(self) -> None:
        faulthandler.dump_traceback_later(self.stall_limit, exit=True, file=self._trace_fd)
        self._armed_at = time.monotonic()


@dataclass(frozen=True)
class Crash:
    """What became of a test whose process died: ``verdict`` is blocked or crashed."""

    verdict: str
    reason: str
    trace: str
    clauses: tuple[str, ...]
    properties: dict[str, str]


def examine(directory: Path, worker: str, nodeid: str) -> Crash:
    """Read what ``worker`` left behind about ``nodeid`` (called after it died).

    ``clauses`` is empty when the journal names another test (the worker died
    between tests): the caller then knows only the node ID.
    """
    clauses: tuple[str, ...] = ()
    properties: dict[str, str] = {}
    stall_limit = DEFAULT_STALL_LIMIT_S
    try:
        record = json.loads(_journal_path(directory, worker).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        record = None
    if isinstance(record, dict) and record.get("nodeid") == nodeid:
        clauses = tuple(str(c) for c in record.get("clauses", ()))
        properties = {str(k): str(v) for k, v in dict(record.get("properties", {})).items()}
        stall_limit = float(record.get("stall_limit", stall_limit))
    try:
        trace = _trace_path(directory, worker).read_text(encoding="utf-8", errors="replace")
    except OSError:
        trace = ""
    trace = _test_thread_first(trace.strip())
    if len(trace) > _TRACE_LIMIT:
        trace = trace[:_TRACE_LIMIT] + "\n... (clipped)"
    if _TIMEOUT_HEADER.match(trace):
        reason = (f"no progress for {stall_limit:.0f} s (a call, finalizer or thread hung "
                  f"where the watchdog cannot interrupt it); worker {worker} ended")
        suite_frame = _innermost_hypothesis_frame(trace)
        if suite_frame is not None:
            reason += (f"; the test's thread was in Hypothesis's own code ({suite_frame}), "
                       "not in a call into the implementation: suspect the suite or an "
                       "overloaded host")
        return Crash("blocked", reason, trace, clauses, properties)
    fatal = _FATAL_HEADER.search(trace)
    what = fatal.group(1).strip() if fatal else "no fatal signal recorded (killed?)"
    reason = f"worker {worker} died: {_signal_name(what)}"
    return Crash("crashed", reason, trace, clauses, properties)


def _test_thread_first(trace: str) -> str:
    """Put the stack of the thread running the test first (faulthandler lists threads
    in its own order; the test's is the one in pytest's runner)."""
    lines = trace.splitlines()
    header: list[str] = []
    while lines and not lines[0].startswith(("Thread 0x", "Current thread 0x")):
        header.append(lines.pop(0))
    blocks: list[list[str]] = []
    for line in lines:
        if line.startswith(("Thread 0x", "Current thread 0x")) or not blocks:
            blocks.append([])
        blocks[-1].append(line)
    blocks.sort(key=lambda block: not any("_pytest/runner.py" in line for line in block))
    return "\n".join(header + [line for block in blocks for line in block])


_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line \d+ in (?P<func>\S+)')


def _innermost_hypothesis_frame(trace: str) -> str | None:
    """``"func in path"`` when the innermost frame of the test's thread (first in
    ``trace``, see :func:`_test_thread_first`) is in Hypothesis's package; else
    ``None``. Every test's stack holds Hypothesis frames further out; only the
    innermost says what the thread was doing when the deadline fired."""
    lines = trace.splitlines()
    starts = [i for i, line in enumerate(lines)
              if line.startswith(("Thread 0x", "Current thread 0x"))]
    if not starts:
        return None
    end = starts[1] if len(starts) > 1 else len(lines)
    block = lines[starts[0] + 1:end]
    if not any("_pytest/runner.py" in line for line in block):
        return None  # the test's thread is not known
    for line in block:
        frame = _FRAME.match(line)
        if frame is not None:
            path = frame.group("path").replace("\\", "/")
            if "/hypothesis/" not in path:
                return None
            return f"{frame.group('func')} in {'/'.join(path.split('/')[-3:])}"
    return None


def _signal_name(what: str) -> str:
    """``"Aborted"`` -> ``"Aborted (SIGABRT)"``: faulthandler names the signal by its text."""
    for sig in (signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL):
        if signal.strsignal(sig) == what or what.startswith(sig.name):
            return f"{what} ({sig.name})"
    return what
