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

from pathlib import Path

import pytest
from _cli_run import run_contract
from _selfcheck_batch import Group, assert_killed, groups, outcome

from conformance.contracts import CONTRACTS
from conformance.contracts.kv_events.publisher.mutants import CATALOG
from conformance.selfcheck import batch
from conformance.selfcheck.mutants import Mutant

CONTRACT = CONTRACTS["kv-events-publisher"]
SUITE = Path(__file__).resolve().parents[1] / "conformance/contracts/kv_events/publisher/suite"
#: Its dead thread leaves a context whose term() blocks: it runs in a child of its own.
_GROUPS = groups(CONTRACT.name, SUITE, CATALOG, alone=("evt_hostile_request_kills_thread",))


def test_every_clause_has_a_mutant() -> None:
    assert {c for m in CATALOG for c in m.clauses} == set(CONTRACT.clauses)


def test_reference_passes_the_contract(tmp_path: Path) -> None:
    run = run_contract(CONTRACT.name, tmp_path, "--transport", CONTRACT.default_factory,
                       "--hypothesis-seed", "1", "--reruns", "0", "-n", "0")
    assert run.report, run.output
    assert run.report["contract"] == CONTRACT.name
    assert set(run.verdicts.values()) == {"passed"}, run.verdicts


@pytest.mark.parametrize("mutant", CATALOG, ids=lambda m: m.name)
def test_mutant_is_killed_by_its_clause(mutant: Mutant,
                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    got = outcome(_GROUPS[mutant.name], tmp_path_factory)
    assert_killed(mutant.name, mutant.clauses, got)


#: Mutants run against the tests of clauses they do not break. Each of these once failed
#: them too, the defect of its own clause blamed on an independent one: a replay that
#: starts one late (EVT-4) failed EVT-5, EVT-6 and EVT-11; a backlog sent newest first
#: (EVT-2) read as batches lost by EVT-3, EVT-6 and EVT-7; seqs from 1 (EVT-1) broke
#: EVT-3's accounting; a plain replay port under CURVE (EVT-10) failed EVT-11's replay
#: after the hostile bytes. (No end marker, EVT-4, also failed EVT-6, EVT-10 and EVT-11; it
#: is left out here: each replay waits out the end marker's patience, which costs minutes.)
_BLAME = {
    "evt_replay_off_by_one": ("EVT-5", "EVT-6", "EVT-11"),
    "evt_publishes_newest_first": ("EVT-3", "EVT-6", "EVT-7"),
    "evt_seq_from_one": ("EVT-3",),
    "evt_curve_pub_only": ("EVT-11",),
}
_BLAME_GROUP = Group(
    f"{CONTRACT.name}-blame", CONTRACT.name, SUITE,
    tuple(batch.Job(f"blame-{m.name}", m.factory, _BLAME[m.name]) for m in CATALOG
          if m.name in _BLAME),
)


@pytest.mark.parametrize("name", sorted(_BLAME))
def test_mutant_fails_no_independent_clause(name: str,
                                            tmp_path_factory: pytest.TempPathFactory) -> None:
    """A test of an independent clause either passes, or its failure names the mutant's
    own clause (so the report blames that one and calls this test inconclusive)."""
    mutant = next(m for m in CATALOG if m.name == name)
    got = outcome(_BLAME_GROUP, tmp_path_factory)
    results = got.results.get(f"blame-{name}")
    assert results, f"{name}: no report from its run:\n{got.output}"
    wrongly = [r for r in results if r["outcome"] == "failed"
               and not any(r["text"].lstrip().startswith(f"{c}:") or f"Error: {c}:" in r["text"]
                           for c in mutant.clauses)]
    assert not wrongly, (
        f"{name} (a defect of {', '.join(mutant.clauses)}) failed "
        f"{', '.join(_BLAME[name])}'s tests under their own clause:\n"
        + "\n".join(f"{r['test']}: {r['text'][-600:]}" for r in wrongly)
    )
