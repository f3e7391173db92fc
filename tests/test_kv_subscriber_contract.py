"""The ``kv-events-subscriber`` contract against the reference and its mutants.

The reference subscriber passes every clause; each mutant in
:data:`~conformance.contracts.kv_events.subscriber.mutants.MUTANTS` fails a
test of the clause it targets, with a message naming that clause. The
mutants run in pytest children shared through :mod:`_selfcheck_batch`
(without shrinking: the kill matters here, not the minimal example). The
mutant that aborts its process runs in a child of its own (its kill is the
crash in the clause's test), and so does the chaos mutant, whose kill waits
out the heal bound, so that children can run side by side.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _selfcheck_batch import assert_killed, groups, outcome

from conformance.config.loading import load_factory
from conformance.contracts.kv_events.subscriber.clauses import CLAUSES, CONTRACT
from conformance.contracts.kv_events.subscriber.mutants import MUTANTS, SubscriberMutant
from conformance.contracts.kv_events.subscriber.suite.conftest import ENV_SUBSCRIBER

SUITE = Path(__file__).resolve().parents[1] / "conformance/contracts/kv_events/subscriber/suite"
#: The test of each clause (the one each mutant runs, unless named in _TESTS).
_TEST_OF = {
    "EVS-1": "test_every_batch_once_in_order",
    "EVS-2": "test_end_marker_is_signed_minus_one",
    "EVS-3": "test_unanswered_replay_times_out_and_retries",
    "EVS-4": "test_publisher_restart_is_recognised",
    "EVS-5": "test_garbled_frames_are_skipped",
    "EVS-6": "test_only_the_configured_topic",
    "EVS-7": "test_silent_partition_heals_gap_free",
    "EVS-10": "test_an_impostor_publisher_is_refused",
    "EVS-11": "test_garbage_from_an_impostor_on_both_endpoints",
    "EVS-8": "test_replays_are_read_in_every_declared_layout",
    "EVS-9": "test_batches_of_a_newer_producer_are_read",
}

#: Mutants killed by another test of their clause than the one above.
_TESTS = {"evs_bounded_queue": ("test_publisher_restart_is_recognised_while_lagging",)}


#: evs_bounded_queue aborts its process (libzmq); evs_no_resync waits out the heal bound.
_GROUPS = groups(CONTRACT, SUITE, MUTANTS, alone=("evs_bounded_queue", "evs_no_resync"),
                 extra={m.name: ("--zmq-chaos",) for m in MUTANTS if m.chaos},
                 tests={m.name: _TESTS.get(m.name, tuple(_TEST_OF[c] for c in m.clauses))
                        for m in MUTANTS})


def _run_suite(factory: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, **{ENV_SUBSCRIBER: factory})
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "-p", "conformance.selfcheck.clause_filter", "--selfcheck-shrink-seconds", "2",
               "--zmq-reruns", "0",
               "--rootdir", str(SUITE), str(SUITE), *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600,
                          check=False)


def test_every_clause_has_a_test_and_a_mutant() -> None:
    assert set(_TEST_OF) == set(CLAUSES)
    assert {c for m in MUTANTS for c in m.clauses} == set(CLAUSES)
    for mutant in MUTANTS:
        load_factory(mutant.factory, option="mutant")


def test_reference_passes_the_contract() -> None:
    result = _run_suite("reference_impl.kv_events.subscriber:KVEventSubscriber")
    assert result.returncode == 0, result.stdout[-3000:]


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_is_killed_by_its_clause(mutant: SubscriberMutant,
                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    if mutant.chaos:
        pytest.importorskip("toxiproxy")
    got = outcome(_GROUPS[mutant.name], tmp_path_factory)
    # A crash (the process died in the clause's test) is a kill: evs_bounded_queue.
    assert_killed(mutant.name, mutant.clauses, got, crashed_counts=True)
    # The kill came from a test written for the clause.
    assert any(_TEST_OF[c] in r["test"] for c in mutant.clauses
               for r in got.results[mutant.name] if r["outcome"] in ("failed", "crashed")
               ), got.results
