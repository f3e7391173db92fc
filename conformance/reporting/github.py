"""GitHub Actions output: the step summary and one annotation per failing clause.

Inside a GitHub Actions job (``GITHUB_ACTIONS=true``) every failing clause
becomes an ``::error`` workflow command on stdout, which GitHub shows on the
run's page and in the pull request: its title is the clause ID, verdict and
title; its message the requirement, the first line of the counterexample (or
the reason) and the command that replays it. When ``GITHUB_STEP_SUMMARY``
names a file, the Markdown report is appended to it (the job's summary page).
Both follow GitHub's documented formats ("Workflow commands for GitHub
Actions": data escapes ``%``, CR and LF; properties also ``:`` and ``,``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final, TextIO

from conformance.reporting.reports import render_markdown
from conformance.reporting.verdicts import FAILING, ClauseVerdict, RunReport

__all__ = ["ENV_ACTIONS", "ENV_SUMMARY", "annotation", "emit", "error_commands"]

ENV_ACTIONS: Final = "GITHUB_ACTIONS"
ENV_SUMMARY: Final = "GITHUB_STEP_SUMMARY"
_MAX_LINE: Final = 300


def _data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _property(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")


def _evidence(verdict: ClauseVerdict) -> str:
    text = verdict.counterexample or verdict.reason or ""
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("Falsifying", "Failing test case")):
            return line[:_MAX_LINE]
    return verdict.verdict


def annotation(verdict: ClauseVerdict) -> str:
    """The ``::error`` command of one failing clause."""
    clause = verdict.clause
    lines = [f"Requirement: {clause.requirement}", f"Evidence: {_evidence(verdict)}"]
    if verdict.reason and verdict.counterexample:
        lines.append(f"Reason: {verdict.reason[:_MAX_LINE]}")
    if verdict.replay:
        lines.append(f"Replay: {verdict.replay}")
    title = f"{clause.id} {verdict.verdict}: {clause.title}"
    return f"::error title={_property(title)}::{_data(chr(10).join(lines))}"


def error_commands(report: RunReport) -> list[str]:
    """One ``::error`` command per failing clause, failures in report order."""
    return [annotation(v) for v in report.ordered() if v.verdict in FAILING]


def emit(
    report: RunReport, stream: TextIO, environ: Mapping[str, str] = os.environ
) -> Path | None:
    """Write the annotations (in Actions) and append the step summary (when asked).

    Returns the summary file written to, if any. An unwritable summary file is
    reported on ``stream`` rather than failing the run: the verdicts stand.
    """
    if environ.get(ENV_ACTIONS) == "true":
        for line in error_commands(report):
            stream.write(line + "\n")
        stream.flush()
    target = environ.get(ENV_SUMMARY, "").strip()
    if not target:
        return None
    path = Path(target)
    try:
        with path.open("a", encoding="utf-8") as summary:
            summary.write(render_markdown(report) + "\n")
    except OSError as exc:
        stream.write(f"zmq-conformance: warning: {ENV_SUMMARY}={target!r}: {exc}\n")
        return None
    return path
