"""``python -m benchmarks stability``: its tally and tables.

One real run of the test mode (a suite test three times against the reference
in one pytest process) and the rendering of a main-jobs result; the main jobs
themselves take minutes each and are the benchmark, not a test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks import stability

ROOT = Path(__file__).resolve().parents[1]


def test_test_mode_repeats_in_one_process(tmp_path: Path) -> None:
    nodeid = ("conformance/contracts/p2p/suite/test_connections.py::"
              "test_duplicate_connect_raises_and_keeps_existing")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "stability", "--test", nodeid, "--runs", "3",
         "--out", str(tmp_path)],
        capture_output=True, text=True, check=False, cwd=ROOT, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "stability-test.json").read_text())
    assert data["by_test"][nodeid]["runs"] == 3
    assert data["by_test"][nodeid]["failures"] == 0
    assert "| `test_duplicate_connect_raises_and_keeps_existing` | 0 | 3 |" in (
        tmp_path / "stability-test.md"
    ).read_text()


def test_main_jobs_table_counts_failing_runs_per_test_and_clause() -> None:
    jobs = [
        {"index": 0, "exit": 0, "wall_s": 40.0, "seed": 1, "failing_clauses": {},
         "failing_tests": {}},
        {"index": 1, "exit": 1, "wall_s": 41.0, "seed": 2,
         "failing_clauses": {"CONN-7": "flaky", "CONN-3": "flaky"},
         "failing_tests": {"s/test_connections.py::test_flapping[close]": {
             "outcome": "flaky", "reason": None, "error": "x", "runs": 5,
             "failed_runs": 1}}},
        {"index": 2, "exit": 3, "wall_s": 5.0, "broken": True, "tail": "boom"},
    ]
    result = {
        "runs": 3, "chaos": True, "completed": 2, "broken": 1, "clean": 1,
        "failing_runs_by_test": {"s/test_connections.py::test_flapping[close]": 1},
        "failing_runs_by_clause": {"CONN-7": 1, "CONN-3": 1},
        "wall_s": {"min": 5.0, "median": 40.0, "max": 41.0, "n": 3}, "jobs": jobs,
    }
    text = stability.markdown_jobs(result)
    assert "1 clean, 1 with a failing verdict, 1 broken" in text
    assert "| `test_connections.py::test_flapping[close]` | 1 / 2 |" in text
    assert "| CONN-7 | 1 / 2 |" in text
    assert "| 2 | 2 | `test_flapping[close]` | flaky | failed 1 of 5 runs: x |" in text
    assert "Run 3 broke (exit 3)" in text and "boom" in text
