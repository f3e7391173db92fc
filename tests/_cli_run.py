"""A contract run through the CLI, as a user runs it: ``python -m conformance.cli run``.

The family contract tests (``test_<family>_contract.py``) run their reference
this way once, to show the whole suite passes it with the options a user
would give; each asserts on what the run left: its exit status and the
per-clause verdicts of its JSON report.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: A whole suite run under load takes minutes; this bounds a hung one.
_TIMEOUT_S = 600


@dataclass(frozen=True)
class CliRun:
    """What one ``zmq-conformance run`` left: its status, output and JSON report."""

    status: int
    #: The end of its stdout and stderr, for assertion messages.
    output: str
    #: The JSON report (``{}`` when the run wrote none).
    report: dict[str, Any]

    @property
    def verdicts(self) -> dict[str, str]:
        """Each clause's verdict in the report, by clause ID."""
        clauses: dict[str, dict[str, Any]] = self.report.get("clauses", {})
        return {cid: entry["verdict"] for cid, entry in clauses.items()}


def run_contract(contract: str, tmp_path: Path, *options: str) -> CliRun:
    """``zmq-conformance run --contract CONTRACT -q --json REPORT OPTIONS`` in a child.

    Without ``--transport`` among ``options`` the contract's reference runs.
    """
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "conformance.cli", "run", "-q", "--contract", contract,
               "--json", str(report), *options]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=_TIMEOUT_S,
                          check=False)
    data: dict[str, Any] = json.loads(report.read_text()) if report.exists() else {}
    return CliRun(proc.returncode, proc.stdout[-3000:] + proc.stderr[-2000:], data)
