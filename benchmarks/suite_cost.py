"""What the gate costs: wall time of the suite against the reference transport.

Runs ``zmq-conformance run`` (the ``ci`` profile) serially, with ``-n 2``, and
the chaos clauses alone, and reads per-test durations from its JSON reports:
the time per suite module (one module per clause family) and the examples per
second of the stateful machines (the examples a machine test records over its
duration).
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


def _tests(report: dict[str, Any]) -> dict[str, tuple[float, dict[str, str]]]:
    """nodeid -> (duration, measurements) of every test in a JSON report."""
    tests: dict[str, tuple[float, dict[str, str]]] = {}
    for clause in report["clauses"].values():
        for test in clause["tests"]:
            tests[test["nodeid"]] = (test["duration_s"], test.get("measurements", {}))
    return tests


def run(repeats: int = 3, progress: Callable[[str], None] = print) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    modules: dict[str, float] = defaultdict(float)
    machines: dict[str, Any] = {}
    variants: tuple[tuple[str, list[str]], ...] = (
        ("serial", []),
        ("-n 2", ["-n", "2"]),
        ("chaos clauses only (--chaos -k HB), serial", ["--chaos", "-k", "HB"]),
    )
    for label, extra in variants:
        walls = []
        for _ in range(repeats):
            wall, report = _run(extra)
            walls.append(wall)
            progress(f"suite {label}: {wall:.1f} s")
            if label == "serial" and not modules:
                for nodeid, (secs, measured) in _tests(report).items():
                    module = nodeid.split("::")[0].rsplit("/", 1)[-1]
                    modules[module] += secs
                    if "examples" in measured:
                        examples = int(measured["examples"])
                        machines[nodeid.split("::")[-1]] = {
                            "examples": examples,
                            "seconds": secs,
                            "examples_per_s": examples / secs if secs else 0.0,
                        }
        runs[label] = {"wall_s": Spread.of(walls).as_dict()}
    return {"runs": runs, "families_serial_s": dict(modules), "machines": machines}
