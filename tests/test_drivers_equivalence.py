"""The reference through the Python driver gets the verdicts it gets in-process.

Each case runs ``zmq-conformance run`` twice with one Hypothesis seed, once
with ``--transport`` and once with ``--driver "python -m
conformance.drivers.python ..."``, and compares the two JSON reports clause
by clause. The control contract runs whole. The others run a slice of their
suite here, to keep the project's tests fast: the whole suites, with their
wall times, are in ``benchmarks/drivers.py`` (``python -m benchmarks.drivers``).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
from plugin_project import load_json, make_project, run_cli, verdicts

from conformance import contracts

CASES = {
    "control": ("reference_impl.control:REFERENCE", None),
    "p2p": ("reference_impl:ZmqTransport", "test_connections or test_polling"),
    "kv-events-publisher": ("reference_impl.kv_events.publisher:KVEventPublisher",
                            "framing or replay_from_start or shutdown_is_bounded or data_parallel"),
    "kv-events-subscriber": ("reference_impl.kv_events.subscriber:KVEventSubscriber",
                             "every_batch_once or end_marker or garbled or configured_topic"),
    # One test of each PIPE clause: every clause is compared, engines and clients both driven.
    "engine-pipeline": ("reference_impl.engine_pipeline:REFERENCE",
                        "frames_follow or burst_streams or in_flight_output or stalled_client "
                        "or death_during_startup or non_zero_exit or hostile_outputs or "
                        "reach_the_client or ready_deadline or (never_collide and tcp) or "
                        "dead_incarnation or rejected_during_shutdown or keyed_peers or "
                        "client_close_is_bounded or "
                        "(hostile_handshakes and plain)"),
}


def _verdicts(project: Path, contract: str, which: list[str], keyword: str | None,
              report: str) -> dict[str, str]:
    selected = ["-k", keyword] if keyword else []
    result = run_cli(project, "run", "--contract", contract, *which, "--hypothesis-seed", "7",
                     "--reruns", "0", "--json", report, *selected)
    assert result.returncode in (0, 1), result.stderr
    return verdicts(load_json(project / report))


@pytest.mark.parametrize("contract", list(CASES))
def test_python_driver_gives_the_in_process_verdicts(tmp_path: Path, contract: str) -> None:
    target, keyword = CASES[contract]
    project = make_project(tmp_path / "proj")
    in_process = _verdicts(project, contract, ["--transport", target], keyword, "in.json")
    driver = f"{shlex.quote(sys.executable)} -m conformance.drivers.python {target}"
    through = _verdicts(project, contract, ["--driver", driver], keyword, "driver.json")
    assert through == in_process
    assert "passed" in in_process.values()
    if contract == "engine-pipeline":
        assert set(in_process) == set(contracts.get(contract).clauses), (
            "the engine-pipeline slice must judge every PIPE clause")
        assert set(in_process.values()) == {"passed"}
