"""The per-clause block at the end of pytest's terminal output."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from conformance.reporting.verdicts import CHAOS_REASON, FAILING, NO_TEST_REASON, RunReport

__all__ = ["write_summary"]


def write_summary(tr: Any, report: RunReport, written: Sequence[Path], *,
                  chaos_flag: str = "--zmq-chaos") -> None:
    """A short per-clause block at the end of the terminal output; ``chaos_flag`` is the
    option that adds the chaos clauses where the user runs the suite."""
    seed = "random" if report.seed is None else report.seed
    tr.section(f"zmq-conformance: contract {report.contract}, {report.transport} "
               f"(profile {report.profile}, seed {seed})")
    chaos_skipped = 0
    untested: dict[str, list[str]] = {}  # reason -> clause IDs
    for verdict in report.ordered():
        if verdict.verdict == "skipped" and not verdict.tests:
            if verdict.reason == CHAOS_REASON:
                chaos_skipped += 1
            else:
                untested.setdefault(verdict.reason or NO_TEST_REASON, []).append(verdict.clause.id)
            continue
        tests = len(verdict.tests)
        note = f"  [{verdict.reason}]" if verdict.reason and verdict.verdict != "passed" else ""
        tr.write_line(
            f"{verdict.verdict.upper():8} {verdict.clause.id:7} {verdict.clause.title}"
            f"  ({tests} test{'s' if tests != 1 else ''}, {verdict.duration_s:.2f} s)"
            f"{note[:160]}",
            red=verdict.verdict in FAILING, green=verdict.verdict == "passed",
            yellow=verdict.verdict in ("skipped", "xfailed"),
        )
    for reason, ids in untested.items():
        tr.write_line(f"SKIPPED  {reason}: {', '.join(ids)}", yellow=True)
    counts = ", ".join(f"{n} {v}" for v, n in report.counts().items() if n)
    extra = f" ({chaos_skipped} chaos clauses not run: use {chaos_flag})" if chaos_skipped else ""
    tr.write_line(f"clauses: {counts}{extra}", bold=True)
    for path in written:
        tr.write_line(f"report written: {os.fspath(path)}")
