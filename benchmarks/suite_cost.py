"""What the gate costs: wall time of the suite against the reference transport.

Runs ``zmq-conformance run`` (the ``ci`` profile, no chaos) serially and with
``-n 2``, and reads per-test durations from its JSON report: the time per
suite module (one module per clause family) and the examples per second of
the stateful machines (``max_examples`` of the profile over the machine
test's duration; every example of a passing machine runs).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._stats import Spread


def _run(extra: list[str]) -> tuple[float, dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "conformance.cli", "run", "-q", "--json", str(report), *extra]
        started = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wall = time.monotonic() - started
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}")
        return wall, json.loads(report.read_text())


def _test_durations(report: dict[str, Any]) -> dict[str, float]:
    durations: dict[str, float] = {}
    for clause in report["clauses"].values():
        for test in clause["tests"]:
            durations[test["nodeid"]] = test["duration_s"]
    return durations


def run(repeats: int = 3, progress: Callable[[str], None] = print) -> dict[str, Any]:
    from conformance import profiles

    runs: dict[str, Any] = {}
    modules: dict[str, float] = defaultdict(float)
    machines: dict[str, Any] = {}
    for label, extra in (("serial", []), ("-n 2", ["-n", "2"])):
        walls = []
        for _ in range(repeats):
            wall, report = _run(extra)
            walls.append(wall)
            progress(f"suite {label}: {wall:.1f} s")
            if label == "serial" and not modules:
                for nodeid, secs in _test_durations(report).items():
                    module = nodeid.split("::")[0].rsplit("/", 1)[-1]
                    modules[module] += secs
                    if "machine" in nodeid:
                        examples = profiles.PROFILES["ci"].max_examples
                        machines[nodeid.split("::")[-1]] = {
                            "examples": examples,
                            "seconds": secs,
                            "examples_per_s": examples / secs if secs else 0.0,
                        }
        runs[label] = {"wall_s": Spread.of(walls).as_dict()}
    return {"runs": runs, "families_serial_s": dict(modules), "machines": machines}
