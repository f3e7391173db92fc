"""The ``control`` contract against the reference and each of its mutants.

The reference passes every clause through the CLI, as a user runs it; each
mutant of :data:`conformance.contracts.control.mutants.CATALOG` fails a test
of the clause it targets, with a message naming that clause. The mutants run
in pytest children shared through :mod:`_selfcheck_batch`, limited to the
target clauses' tests and without shrinking (the kill matters here, not the
minimal example); the one whose stalled server leaves a thread blocked in a
send runs alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _cli_run import run_contract
from _selfcheck_batch import assert_killed, groups, outcome

from conformance.contracts import CONTRACTS
from conformance.contracts.control.clauses import CLAUSES
from conformance.contracts.control.mutants import CATALOG
from conformance.selfcheck.mutants import Mutant, validate

SUITE = Path(__file__).resolve().parents[1] / "conformance/contracts/control/suite"
_GROUPS = groups("control", SUITE, CATALOG, alone=("ctl_blocking_reply_send",))


def test_registry_entry_and_catalog() -> None:
    contract = CONTRACTS["control"]
    assert dict(contract.clauses) == CLAUSES
    validate(CATALOG, origin="control catalog")
    assert {c for m in CATALOG for c in m.clauses} == set(CLAUSES)


def test_reference_passes_the_contract_through_the_cli(tmp_path: Path) -> None:
    run = run_contract("control", tmp_path)
    assert run.status == 0, run.output
    assert set(CLAUSES) <= set(run.verdicts), run.verdicts


@pytest.mark.parametrize("mutant", CATALOG, ids=lambda m: m.name)
def test_mutant_is_killed_by_its_clause(mutant: Mutant,
                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    got = outcome(_GROUPS[mutant.name], tmp_path_factory)
    # A failure names its clause, or is a call the watchdog caught (a "blocked" verdict
    # of the test's clause: the stalled server of ctl_blocking_reply_send).
    assert_killed(mutant.name, mutant.clauses, got, blocked_counts=True)
