"""The ``control`` contract against the reference and each of its mutants.

The reference passes every clause through the CLI, as a user runs it; each
mutant of :data:`conformance.contracts.control.mutants.CATALOG` fails a test
of the clause it targets, with a message naming that clause. Each run is a
separate pytest process (parametrized, so ``pytest -n auto`` spreads them),
limited to the target clause's tests and with Hypothesis shrinking capped:
the kill matters here, not the minimal example.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.contracts import CONTRACTS
from conformance.contracts.control.clauses import CLAUSES
from conformance.contracts.control.fixtures import ENV_TARGET
from conformance.contracts.control.mutants import CATALOG
from conformance.selfcheck.mutants import Mutant, validate

SUITE = Path(__file__).resolve().parents[1] / "conformance/contracts/control/suite"


def test_registry_entry_and_catalog() -> None:
    contract = CONTRACTS["control"]
    assert dict(contract.clauses) == CLAUSES
    validate(CATALOG, origin="control catalog")
    assert {c for m in CATALOG for c in m.clauses} == set(CLAUSES)


def test_reference_passes_the_contract_through_the_cli(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "conformance.cli", "run", "-q", "--contract", "control",
               "--json", str(report)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout[-3000:]
    text = report.read_text()
    for clause in CLAUSES:
        assert f'"{clause}"' in text


@pytest.mark.parametrize("mutant", CATALOG, ids=lambda m: m.name)
def test_mutant_is_killed_by_its_clause(mutant: Mutant) -> None:
    env = dict(os.environ, **{ENV_TARGET: mutant.factory})
    clauses = [arg for c in mutant.clauses for arg in ("--selfcheck-clause", c)]
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "-p", "conformance.selfcheck.clause_filter", "--selfcheck-shrink-seconds", "2",
               "--zmq-reruns", "0",
               *clauses, "--rootdir", str(SUITE), str(SUITE)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600,
                            check=False)
    assert result.returncode == 1, (
        f"{mutant.name} survived {', '.join(mutant.clauses)}:\n{result.stdout[-3000:]}")
    # A failure names its clause, or is a call the watchdog caught (a "blocked" verdict
    # of the test's clause: the stalled server of ctl_blocking_reply_send).
    named = any(f"{c}:" in result.stdout for c in mutant.clauses)
    assert named or "CallBlocked" in result.stdout, (
        f"{mutant.name}: no failure names {', '.join(mutant.clauses)}:\n{result.stdout[-3000:]}")
