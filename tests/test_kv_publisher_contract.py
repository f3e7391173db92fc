"""The ``kv-events-publisher`` contract against the reference and its mutants.

The reference publisher passes every clause through the CLI, as a user runs
it; each mutant of
:data:`~conformance.contracts.kv_events.publisher.mutants.CATALOG` fails a
test of the clause it targets, with a message naming that clause. The
mutants run in pytest children shared through :mod:`_selfcheck_batch`
(without shrinking: the kill matters here, not the minimal example); the
one that kills its thread and leaks its context runs alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _selfcheck_batch import assert_killed, groups, outcome

from conformance.contracts import CONTRACTS
from conformance.contracts.kv_events.publisher.mutants import CATALOG
from conformance.selfcheck.mutants import Mutant

CONTRACT = CONTRACTS["kv-events-publisher"]
SUITE = Path(__file__).resolve().parents[1] / "conformance/contracts/kv_events/publisher/suite"
#: Its dead thread leaves a context whose term() blocks: it runs in a child of its own.
_GROUPS = groups(CONTRACT.name, SUITE, CATALOG, alone=("evt_hostile_request_kills_thread",))


def _run(factory: str, tmp_path: Path) -> dict[str, str]:
    report = tmp_path / "verdicts.json"
    command = [sys.executable, "-m", "conformance.cli", "run", "--contract", CONTRACT.name,
               "--transport", factory, "--json", str(report), "-q", "--hypothesis-seed", "1",
               "--reruns", "0", "-n", "0"]
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
def test_mutant_is_killed_by_its_clause(mutant: Mutant,
                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    got = outcome(_GROUPS[mutant.name], tmp_path_factory)
    assert_killed(mutant.name, mutant.clauses, got)
