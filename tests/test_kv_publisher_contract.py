"""The ``kv-events-publisher`` contract against the reference and its mutants.

The reference publisher passes every clause; each mutant of
:data:`~conformance.contracts.kv_events.publisher.mutants.CATALOG` fails the
clause it targets. Each run is a separate ``zmq-conformance run`` process
(parametrized, so ``pytest -n auto`` spreads them), with Hypothesis
shrinking capped: the kill matters here, not the minimal example.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.contracts import CONTRACTS
from conformance.contracts.kv_events.publisher.mutants import CATALOG
from conformance.selfcheck import clause_filter
from conformance.selfcheck.mutants import Mutant

CONTRACT = CONTRACTS["kv-events-publisher"]


def _run(factory: str, tmp_path: Path, *clauses: str) -> dict[str, str]:
    report = tmp_path / "verdicts.json"
    command = [sys.executable, "-m", "conformance.cli", "run", "--contract", CONTRACT.name,
               "--transport", factory, "--json", str(report), "-q", "--hypothesis-seed", "1",
               "--reruns", "0", "-n", "1",  # a kill needs one failure; one worker suffices
               "--", "-p", "no:cacheprovider", "-p", "conformance.selfcheck.clause_filter",
               clause_filter.SHRINK_OPTION, "2"]
    for clause in clauses:
        command += [clause_filter.OPTION, clause]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    data = json.loads(report.read_text()) if report.exists() else {}
    assert data, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert data["contract"] == CONTRACT.name
    return {cid: entry["verdict"] for cid, entry in data["clauses"].items()}


def test_every_clause_has_a_mutant() -> None:
    assert {c for m in CATALOG for c in m.clauses} == set(CONTRACT.clauses)


def test_reference_passes_the_contract(tmp_path: Path) -> None:
    verdicts = _run(CONTRACT.default_factory, tmp_path)
    assert set(verdicts.values()) == {"passed"}, verdicts


@pytest.mark.parametrize("mutant", CATALOG, ids=lambda m: m.name)
def test_mutant_is_killed_by_its_clause(mutant: Mutant, tmp_path: Path) -> None:
    verdicts = _run(mutant.factory, tmp_path, *mutant.clauses)
    killed = {c for c, v in verdicts.items() if v in ("failed", "blocked")}
    assert killed & set(mutant.clauses), (
        f"{mutant.name} survived {', '.join(mutant.clauses)}: {verdicts}"
    )
