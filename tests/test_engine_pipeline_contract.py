"""The ``engine-pipeline`` contract against the reference and each of its mutants.

The reference passes every clause through the CLI, as a user runs it; each
mutant of :data:`conformance.contracts.engine_pipeline.mutants.CATALOG`
fails a test of the clause it targets, with a message naming that clause.
Mutants run limited to the one test that models their defect (the suite's
engines are processes, so a mutant's defect cannot outlive its child), in
children shared through :mod:`_selfcheck_batch`; the ones that leave a
blocked thread behind run alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _cli_run import run_contract
from _selfcheck_batch import assert_killed, groups, outcome

from conformance.contracts import CONTRACTS
from conformance.contracts.engine_pipeline.clauses import CLAUSES
from conformance.contracts.engine_pipeline.mutants import CATALOG
from conformance.selfcheck.mutants import Mutant, validate

SUITE = Path(__file__).resolve().parents[1] / "conformance/contracts/engine_pipeline/suite"
#: The test that models each mutant's defect.
TESTS: dict[str, tuple[str, ...]] = {
    "pipe_array_bytes_in_memory_order": (
        "test_payloads_of_every_dtype_and_size_round_trip_byte_exact",),
    "pipe_runs_after_abort": ("test_engine_sends_nothing_after_an_abort_finish",),
    "pipe_tracker_of_last_frame": ("test_in_flight_output_buffers_are_never_modified",),
    "pipe_blocking_output_send": ("test_a_stalled_client_costs_the_others_nothing",),
    "pipe_sentinel_without_process_watch": (
        "test_engine_death_is_seen_and_releases_every_waiter",),
    "pipe_calls_not_failed_on_death": ("test_engine_death_is_seen_and_releases_every_waiter",),
    "pipe_fatal_error_exits_zero": ("test_engine_failure_is_a_non_zero_exit",),
    "pipe_input_thread_dies_on_unknown_type": (
        "test_hostile_frames_never_run_code_nor_silence_the_engine",),
    "pipe_accepts_pickle": ("test_hostile_frames_never_run_code_nor_silence_the_engine",),
    "pipe_aborts_routed_to_client_zero": (
        "test_engine_routes_aborts_and_rejections_by_client_index",),
    "pipe_no_ready_deadline": ("test_ready_deadline_is_honoured",),
    "pipe_fixed_ipc_path": ("test_concurrent_pipelines_never_collide",),
    "pipe_old_incarnation_outputs_delivered": ("test_no_output_of_a_dead_incarnation",),
    "pipe_utility_results_by_arrival": ("test_utility_calls_matched_failed_and_timed_out",),
    "pipe_adopted_with_old_incarnation_outputs": ("test_no_output_of_a_dead_incarnation",),
    "pipe_ready_on_tcp_accept": (
        "test_engine_stopped_in_its_output_handshake_is_not_alive_past_the_bound",),
    "pipe_startup_death_waits_for_deadline": (
        "test_death_between_hello_and_ready_ends_wait_ready",),
    "pipe_probe_then_bind_ports": ("test_concurrent_pipelines_never_collide",),
    "pipe_curve_on_handshake_only": (
        "test_a_stranger_engine_gets_no_welcome_no_request_and_no_output_in",),
    "pipe_curve_set_after_bind": (
        "test_a_stranger_engine_gets_no_welcome_no_request_and_no_output_in",),
    "pipe_zap_allows_everyone": (
        "test_a_stranger_engine_gets_no_welcome_no_request_and_no_output_in",),
    "pipe_curve_keys_logged": ("test_keyed_peers_are_unaffected_and_no_key_leaks",),
    "pipe_plain_handshake_retry": ("test_an_engine_sends_no_hello_to_an_impostor_client",),
    "pipe_no_receive_limit": ("test_hostile_handshakes_oversize_frames_and_floods",),
}
_GROUPS = groups("engine-pipeline", SUITE, CATALOG, tests=TESTS,
                 alone=("pipe_calls_not_failed_on_death", "pipe_no_ready_deadline",
                        "pipe_blocking_output_send"))


def test_registry_entry_and_catalog() -> None:
    contract = CONTRACTS["engine-pipeline"]
    assert dict(contract.clauses) == CLAUSES
    validate(CATALOG, origin="engine-pipeline catalog")
    assert {c for m in CATALOG for c in m.clauses} == set(CLAUSES)
    assert set(TESTS) == {m.name for m in CATALOG}


def test_reference_passes_the_contract_through_the_cli(tmp_path: Path) -> None:
    run = run_contract("engine-pipeline", tmp_path)
    assert run.status == 0, run.output
    assert set(CLAUSES) <= set(run.verdicts), run.verdicts


@pytest.mark.parametrize("mutant", CATALOG, ids=lambda m: m.name)
def test_mutant_is_killed_by_its_clause(mutant: Mutant,
                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    got = outcome(_GROUPS[mutant.name], tmp_path_factory)
    assert_killed(mutant.name, mutant.clauses, got, blocked_counts=True)
