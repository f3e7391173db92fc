"""Per-clause progress while a run goes, for the person or the CI log watching it.

A run of the suite takes 40-60 s; pytest's dots say nothing about which
clause is being checked. :class:`Progress` follows the run clause by clause:

* on a terminal (``live``): one line, rewritten in place at every change and
  every half second: clauses done / total, the clause running, elapsed time;
* elsewhere (a CI log, a pipe): one line per clause as soon as its last
  test finished, with its verdict, the number of its tests and their time.

A clause is done when every test planned for it has finished, so the plan
(each test's clause IDs, from the collection) must be known: it is given by
:meth:`Progress.plan`, possibly several times (xdist workers collect the same
tests). Without a plan (a remote worker's collection cannot be seen) only
the running clause and the count of finished tests are shown, and clause
lines come with the final summary.

Thread-safe: the ticker thread (which redraws the live line every half
second so the elapsed time moves) and the pytest hooks share one lock.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Final, TextIO

from conformance.contracts import CLAUSES
from conformance.reporting.verdicts import FAILING, ClauseVerdict

__all__ = ["Progress"]

_TICK_S: Final = 0.5
_CLEAR: Final = "\r\x1b[K"
_TITLE_WIDTH: Final = 44


class Progress:
    """See the module docstring. ``judge(clause_id)`` gives a done clause's verdict."""

    def __init__(
        self,
        stream: TextIO,
        *,
        live: bool,
        judge: Callable[[str], ClauseVerdict],
        clock: Callable[[], float] = time.monotonic,
        tick_s: float | None = _TICK_S,
        width: Callable[[], int] | None = None,
    ) -> None:
        self._stream = stream
        self._live = live
        self._judge = judge
        self._clock = clock
        self._tick_s = tick_s
        self._width = width or (lambda: shutil.get_terminal_size().columns)
        self._started_at = clock()
        self._lock = threading.Lock()
        self._planned: dict[str, tuple[str, ...]] = {}  # nodeid -> clause IDs
        self._pending: dict[str, set[str]] = {}  # clause ID -> nodeids not finished
        self._done: list[str] = []
        self._running: dict[str, tuple[str, ...]] = {}  # nodeid -> clause IDs
        self._finished_tests = 0
        self._shown = False
        self._closed = False
        self._ticker: threading.Thread | None = None
        if live and tick_s is not None:
            self._ticker = threading.Thread(target=self._tick, name="zmq-progress", daemon=True)
            self._ticker.start()

    # -- what the run tells us ------------------------------------------------------

    def plan(self, tests: Mapping[str, Iterable[str]]) -> None:
        """Each test's clause IDs (merged with what is already planned)."""
        with self._lock:
            for nodeid, clauses in tests.items():
                if nodeid in self._planned:
                    continue
                ids = tuple(c for c in clauses if c in CLAUSES)
                self._planned[nodeid] = ids
                for cid in ids:
                    if cid not in self._done:
                        self._pending.setdefault(cid, set()).add(nodeid)
            self._draw()

    def started(self, nodeid: str, clauses: Iterable[str] = ()) -> None:
        with self._lock:
            self._running[nodeid] = tuple(clauses) or self._planned.get(nodeid, ())
            self._draw()

    def finished(self, nodeid: str) -> None:
        """The test ``nodeid`` is over (its last report was recorded)."""
        with self._lock:
            self._running.pop(nodeid, None)
            self._finished_tests += 1
            for cid in self._planned.get(nodeid, ()):
                waiting = self._pending.get(cid)
                if waiting is None:
                    continue
                waiting.discard(nodeid)
                if not waiting:
                    del self._pending[cid]
                    self._done.append(cid)
                    self._report_done(cid)
            self._draw()

    def close(self) -> None:
        """Stop the ticker and clear the live line (before the final summary)."""
        with self._lock:
            self._closed = True
            if self._live and self._shown:
                self._stream.write(_CLEAR)
                self._stream.flush()
                self._shown = False
        if self._ticker is not None and self._tick_s is not None:
            self._ticker.join(self._tick_s * 4)

    # -- what is shown ----------------------------------------------------------------

    @property
    def total(self) -> int:
        return len(self._done) + len(self._pending)

    def line(self) -> str:
        """The live line's text (without control characters)."""
        elapsed = self._clock() - self._started_at
        running = [cid for ids in self._running.values() for cid in ids]
        current = ""
        if running:
            cid = running[0]
            title = CLAUSES[cid].title if cid in CLAUSES else ""
            more = len(dict.fromkeys(running)) - 1
            current = f"  {cid} {_clip(title, _TITLE_WIDTH)}" + (f" (+{more})" if more > 0 else "")
        if self._planned:
            count = f"{len(self._done)}/{self.total} clauses"
        else:
            count = f"{self._finished_tests} tests"
        return f"zmq-conformance: {count}{current}  {elapsed:.0f} s"

    def _report_done(self, cid: str) -> None:
        if self._live:
            return
        verdict = self._judge(cid)
        tests = len(verdict.tests)
        elapsed = self._clock() - self._started_at
        self._stream.write(
            f"[{len(self._done)}/{self.total}] {verdict.verdict.upper():8} {cid:7} "
            f"{verdict.clause.title}  ({tests} test{'s' if tests != 1 else ''}, "
            f"{verdict.duration_s:.2f} s)  at {elapsed:.1f} s"
            + ("  <-- FAILING" if verdict.verdict in FAILING else "")
            + "\n"
        )
        self._stream.flush()

    def _draw(self) -> None:
        if not self._live or self._closed:
            return
        # Never wider than the terminal: a wrapped line cannot be rewritten in place.
        self._stream.write(_CLEAR + self.line()[: max(self._width() - 1, 20)])
        self._stream.flush()
        self._shown = True

    def _tick(self) -> None:
        assert self._tick_s is not None
        while True:
            time.sleep(self._tick_s)
            with self._lock:
                if self._closed:
                    return
                self._draw()


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
