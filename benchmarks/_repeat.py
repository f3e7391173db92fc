"""pytest plugin for ``python -m benchmarks stability --test``: run each test N times.

Loaded with ``-p benchmarks._repeat --stability-repeat N --stability-out PATH``.
Each selected test runs ``N`` times in this one process (setup, call and
teardown every time, like a fresh test), which costs a fraction of N pytest
processes. Nothing is logged per repetition; at the end of the session the
tally (runs and failures per test, with the first line of each distinct
failure) is written as JSON to ``PATH``.

The suite's own reruns must be off (``--zmq-reruns 0``): a failing repetition
is counted as one failure, not re-run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from _pytest.runner import runtestprotocol


@dataclass
class _Tally:
    runs: int = 0
    failures: int = 0
    seconds: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)


_TALLY = pytest.StashKey[dict[str, _Tally]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("stability", "benchmarks: repeat each test")
    group.addoption("--stability-repeat", type=int, default=1, metavar="N",
                    help="run every selected test N times in this process")
    group.addoption("--stability-out", default=None, metavar="PATH",
                    help="write the tally as JSON to PATH")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_TALLY] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool:
    repeat = max(1, int(item.config.getoption("stability_repeat")))
    tally = item.config.stash[_TALLY].setdefault(item.nodeid, _Tally())
    for i in range(repeat):
        # The last repetition tears down as pytest would; the others tear down
        # everything, so every repetition sets up from scratch.
        reports = runtestprotocol(item, log=False, nextitem=nextitem if i == repeat - 1 else None)
        tally.runs += 1
        tally.seconds += sum(r.duration for r in reports)
        failed = [r for r in reports if r.failed]
        if failed:
            tally.failures += 1
            line = _first_line(failed[0])
            tally.errors[line] = tally.errors.get(line, 0) + 1
    return True


def _first_line(report: pytest.TestReport) -> str:
    text = str(report.longrepr or "").strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("E ")]
    return (lines[0][1:].strip() if lines else text.splitlines()[-1] if text else "?")[:200]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = session.config.getoption("stability_out")
    if not path:
        return
    data: dict[str, Any] = {
        nodeid: {"runs": t.runs, "failures": t.failures, "seconds": round(t.seconds, 2),
                 "errors": t.errors}
        for nodeid, t in session.config.stash[_TALLY].items()
    }
    Path(path).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
