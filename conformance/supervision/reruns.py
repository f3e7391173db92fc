"""Re-running a failing clause test to tell a race from a deterministic bug.

Before a clause is reported failed, the test that failed runs again, in the
process that ran it (an xdist worker, or the only process), up to ``reruns``
more times:

1. the first re-run keeps the run's Hypothesis seed, so Hypothesis' database
   replays the failing example first (and, without a database, the same
   seed draws the same examples again);
2. the others use fresh seeds, derived from the run's seed, the test's node
   ID and the attempt number, so a whole run stays reproducible. The database
   still replays the failing example first while it fails; once it passes,
   Hypothesis drops it and the generation starts from the fresh seed.

Without ``--hypothesis-seed`` (plain pytest) Hypothesis draws a random seed
per test, so the first re-run is "same seed" only through the database; the
CLI always passes a seed. A fresh-seed re-run that fails saves its own
(unshrunk) example in the database too; the reported ``@reproduce_failure``
line replays the first run's example exactly.

Shrinking is off during re-runs (only the outcome counts, and against a
misbehaving transport every shrink step can wait out a harness deadline).

The :class:`Tally` of all runs (the first included) decides: a failure every
time stays ``failed`` ("reproduced 5 of 5 runs"); a failure only sometimes is
``flaky`` ("failed 2 of 5 runs"). Either fails the gate. What is reported is
the *first* run: its counterexample and replay command (the run's seed) are
the ones that failed; the re-runs only count.

A *void* run is repeated before anything else: a test that ended in
:class:`~conformance.errors.HostStalled` (a bound missed while the host kept
processes from running past its slack) said nothing about the
implementation, so it runs again with the same seed, up to ``reruns`` more
times, until an attempt gives a verdict; that attempt is then the test's
first run. Only when every attempt is void does the run error stand. The
number of void attempts travels in :data:`VOID_PROPERTY`.

Not re-run: tests that blocked (a hang would cost the watchdog limit again),
unexpected passes of an expected failure, and tests that passed.

The tally crosses from the process running the test to the one writing the
reports in ``report.user_properties`` (:data:`PROPERTY`), like the plugin's
other data.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:  # annotations only: the CLI reads tallies without importing pytest
    import pytest

__all__ = [
    "DEFAULT_RERUNS",
    "PROPERTY",
    "SECONDS_PROPERTY",
    "VOID_PROPERTY",
    "Tally",
    "fresh_seed",
    "run_with_reruns",
    "wants_rerun",
]

#: Re-runs after a failure (so "failed k of 5").
DEFAULT_RERUNS: Final = 4
#: The user property carrying the tally ("FAILED RUNS": ``"2 5"``).
PROPERTY: Final = "zmq_reruns"
#: The user property carrying the seconds the re-runs took (on the last phase only).
SECONDS_PROPERTY: Final = "zmq_rerun_s"
#: The user property counting the void attempts before the reported one (``"2"``); not
#: ``zmq_``-prefixed, so the reports show it among the test's measurements.
VOID_PROPERTY: Final = "void_runs"
#: Properties that rule a re-run out (set by the plugin's makereport hook).
_NO_RERUN: Final = ("zmq_blocked", "zmq_xpassed")


@dataclass(frozen=True)
class Tally:
    """How many of ``runs`` runs of a test failed (the first run included)."""

    failed: int
    runs: int

    def __post_init__(self) -> None:
        if not 0 <= self.failed <= self.runs or self.runs < 1:
            raise ValueError(f"a tally of {self.failed} failed out of {self.runs} runs")

    @property
    def flaky(self) -> bool:
        """Failed at least once and passed at least once."""
        return 0 < self.failed < self.runs

    def describe(self) -> str:
        if self.flaky:
            return f"flaky: failed {self.failed} of {self.runs} runs"
        return f"reproduced {self.failed} of {self.runs} runs"

    def encode(self) -> str:
        return f"{self.failed} {self.runs}"

    @classmethod
    def decode(cls, text: str) -> Tally | None:
        """The tally of :meth:`encode`, or ``None`` for anything else."""
        parts = text.split()
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            return None
        try:
            return cls(int(parts[0]), int(parts[1]))
        except ValueError:
            return None


def wants_rerun(reports: Sequence[pytest.TestReport]) -> bool:
    """True when a phase failed and no report rules a re-run out (blocked, xpassed)."""
    if not any(r.failed for r in reports):
        return False
    names = {str(name) for r in reports for name, _ in r.user_properties}
    return not any(name in names for name in _NO_RERUN)


def is_void(reports: Sequence[pytest.TestReport]) -> bool:
    """True when a phase ended in :class:`~conformance.errors.HostStalled` (a void run)."""
    from conformance.errors import is_host_stall, skip_message

    return any(
        report.skipped and isinstance(report.longrepr, tuple) and len(report.longrepr) == 3
        and is_host_stall(skip_message(str(report.longrepr[2])))
        for report in reports
    )


def fresh_seed(base: object, nodeid: str, attempt: int) -> int:
    """A seed for re-run ``attempt`` of ``nodeid``: new, but reproducible from ``base``."""
    return random.Random(f"{base}|{nodeid}|{attempt}").getrandbits(64)


@contextmanager
def _hypothesis_for_rerun(seed: int | None) -> Iterator[None]:
    """Within: Hypothesis draws from ``seed`` (``None``: the run's own) and does not shrink.

    Both are Hypothesis module globals (the ones ``--hypothesis-seed`` and its
    shrink cap set), restored on exit; a test decorated with ``@seed`` keeps
    its own seed.
    """
    from hypothesis import core
    from hypothesis.internal.conjecture import engine

    saved_seed = core.global_force_seed
    saved_shrink = getattr(engine, "MAX_SHRINKING_SECONDS", None)
    if seed is not None:
        core.global_force_seed = seed  # type: ignore[assignment]
    if saved_shrink is not None:
        engine.MAX_SHRINKING_SECONDS = 0
    try:
        yield
    finally:
        core.global_force_seed = saved_seed
        if saved_shrink is not None:
            engine.MAX_SHRINKING_SECONDS = saved_shrink


RunOnce = Callable[["pytest.Item", "pytest.Item | None"], "list[pytest.TestReport]"]


def _run_once(item: pytest.Item, nextitem: pytest.Item | None) -> list[pytest.TestReport]:
    """One attempt, with whole watchdog limits: an attempt is a test of its own, so a
    block in an earlier attempt never cuts this one's limits to the 0.2 s left for
    shrinking (which would call a correct node's start-up ``blocked``)."""
    from _pytest.runner import runtestprotocol

    from conformance.supervision import watchdog

    watchdog.new_test()
    return runtestprotocol(item, log=False, nextitem=nextitem)


def run_with_reruns(
    item: pytest.Item,
    nextitem: pytest.Item | None,
    reruns: int,
    *,
    run_once: RunOnce = _run_once,
) -> list[pytest.TestReport]:
    """Run ``item`` (again while its run is void); if it failed, re-run it up to ``reruns``
    times; return the first run's reports (unlogged), each carrying the :class:`Tally`
    when re-runs happened.

    ``item.user_properties`` is restored after the re-runs, so what a test
    records (``record_property``) is the first run's.
    """
    before = list(item.user_properties)
    reports = run_once(item, nextitem)
    void = 0
    while void < reruns and is_void(reports):
        void += 1
        item.user_properties[:] = before
        reports = run_once(item, nextitem)
    if void:
        for report in reports:
            report.user_properties.append((VOID_PROPERTY, str(void)))
    if reruns <= 0 or not wants_rerun(reports):
        return reports
    from hypothesis import core

    base = core.global_force_seed
    recorded = list(item.user_properties)
    failed = 1
    started = time.monotonic()
    for attempt in range(1, reruns + 1):
        seed = None if attempt == 1 else fresh_seed(base, item.nodeid, attempt)
        with _hypothesis_for_rerun(seed):
            rerun = run_once(item, nextitem)
        item.user_properties[:] = recorded
        if any(r.failed for r in rerun):
            failed += 1
    tally = Tally(failed, reruns + 1)
    for report in reports:
        report.user_properties.append((PROPERTY, tally.encode()))
    # Once per test (on its last phase), so the time is counted once.
    reports[-1].user_properties.append((SECONDS_PROPERTY, f"{time.monotonic() - started:.3f}"))
    return reports
