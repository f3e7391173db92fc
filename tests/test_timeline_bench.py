"""``python -m benchmarks.timeline``: one real run of a suite test, and the report's sums.

The real run is one in-process suite test (``-n 0``), so the plugin side
(loaded through ``PYTEST_PLUGINS``) and the runner side are both exercised;
the main job itself is the benchmark, not a test.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks import timeline

ROOT = Path(__file__).resolve().parents[1]


def _test(worker: str, start: float, end: float, sleep: float) -> dict[str, Any]:
    return {"w": worker, "pid": 1, "t": end, "ev": "test", "cpu": 0.0, "id": f"t.py::{worker}",
            "start": start, "end": end, "own_cpu": 0.5, "desc_cpu": 0.25, "sleep": sleep,
            "waits": [["harness.py:189 wait_until <- x.py:1 f", sleep]]}


def test_report_sums_each_worker_and_marks_the_critical_path() -> None:
    events = [_test("gw0", 101.0, 103.0, 1.5), _test("gw0", 103.5, 104.0, 0.25),
              _test("gw1", 101.0, 106.0, 4.0),
              {"w": "gw1", "pid": 2, "t": 106.5, "ev": "sessionfinished", "cpu": 1.0,
               "sleeps": [["harness.py:189 wait_until <- x.py:1 f", 4.0]]}]
    text = timeline.report(events, [], 100.0, 108.0, shown_s=1.0)
    gw0 = next(line for line in text.splitlines() if line.startswith("gw0"))
    gw1 = next(line for line in text.splitlines() if line.startswith("gw1"))
    assert "busy 2.5 s, between tests 0.5 s" in gw0 and "critical path" not in gw0
    assert "(critical path)" in gw1 and "main thread asleep 4.0 s" in gw1
    listed = [line for line in text.splitlines() if "s  cpu" in line]
    assert len(listed) == 2  # the 0.5 s test is under shown_s
    assert "  4.00  harness.py:189 wait_until <- x.py:1 f" in text


def test_one_real_test_is_timed(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.timeline", "--keep", str(tmp_path), "--shown", "0",
         "--", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "--zmq-conformance-only", "-n", "0", "-k", "test_idle_poll"],
        capture_output=True, text=True, check=False, cwd=ROOT, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "test_idle_poll" in proc.stderr
    assert "run   collected" in proc.stderr and "exit of the command" in proc.stderr
    assert list(tmp_path.glob("run-*.jsonl")) and (tmp_path / "processes.json").exists()
