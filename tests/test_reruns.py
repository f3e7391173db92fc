"""Re-runs and the ``flaky`` verdict, against real transports over real TCP.

A small clause-marked suite (``rerun_suite/``, next to the throwaway project
of :mod:`plugin_project`) runs with ``--zmq-suite`` against the reference
and against mutants of :mod:`conformance.contracts.p2p.transports`:

* ``racy:Racy`` loses a message with probability 5 %, from a fixed-seed
  generator per process: the test's 21 sends (hello included) fail some runs
  and not others, the same runs every time (fresh process, fixed order);
* ``ReordersMessages`` swaps pairs of messages: it fails every run;
* ``LargeIntsWrap`` breaks one kind of value: Hypothesis finds it, and every
  re-run (the database replaying the example first) finds it again, so a
  bug found by search is ``failed``, never ``flaky``;
* ``SendBlocksAtHwm`` blocks a send: ``blocked``, and never re-run.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from plugin_project import junit_cases, load_json, make_project, run_cli, run_pytest

from conformance.supervision.reruns import Tally, fresh_seed

RACY = '''
import random

from conformance.contracts.p2p.transports import DropsSendsAtRandom


class Racy(DropsSendsAtRandom):
    drop_probability = 0.05
    rng = random.Random(3)
'''

RERUN_SUITE = '''
import time

import pytest
from hypothesis import given, strategies as st

from pathlib import Path

from conformance.errors import CallBlocked, HostStalled
from conformance.contracts.p2p.harness import Cluster, handshake, receive
from conformance.testing.net import unreachable_address
from conformance.config.profiles import suite_settings


@pytest.mark.clause("MSG-2")
def test_burst(zmq_transport_spec):
    with Cluster(zmq_transport_spec) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        out, inbound = handshake(a, b)
        for n in range(20):
            out.send({"n": n})
        got = receive(inbound, 20, nodes=[a], timeout=0.5)
        assert [m["n"] for m in got] == list(range(20)), "MSG-2: messages lost"


@pytest.mark.clause("MSG-1")
@suite_settings(max_examples=50)
@given(value=st.integers(min_value=0, max_value=2**64 - 1))
def test_integer(zmq_transport_spec, value):
    with Cluster(zmq_transport_spec) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        out, inbound = handshake(a, b)
        out.send({"v": value})
        assert receive(inbound, 1, nodes=[a]) == [{"v": value}], "MSG-1: value changed"


def _attempt(name):
    counter = Path(__file__).with_name(name)
    n = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(n + 1))
    return n


@pytest.mark.clause("MSG-3")
def test_void_twice_then_judged(zmq_transport_spec):
    if _attempt("void_twice") < 2:
        raise HostStalled("MSG-3: a stall the test pretends to have measured")
    assert _attempt("judged") < 0, "MSG-3: the verdict of the first run that counted"


@pytest.mark.clause("CONN-7")
def test_void_after_a_block_then_slow(zmq_transport_spec):
    from conformance.supervision import watchdog

    if _attempt("void_after_block") < 1:
        watchdog.note_block()
        raise HostStalled("CONN-7: a stall the test pretends to have measured")
    with watchdog.guard("a start-up of 0.5 s", 5.0):
        time.sleep(0.5)


@pytest.mark.clause("MSG-5")
def test_always_void(zmq_transport_spec):
    _attempt("always_void")
    raise HostStalled("MSG-5: a stall the test pretends to have measured")


@pytest.mark.clause("MSG-4")
def test_send_blocks(zmq_transport_spec):
    with Cluster(zmq_transport_spec) as cluster:
        a = cluster.add_node("a")
        with unreachable_address() as address:
            conn = a.connect(address)
            for n in range(3000):
                try:
                    conn.send({"n": n}, limit=0.5)
                except CallBlocked:
                    raise
                except Exception:
                    pass
'''

_MUTANTS = "conformance.contracts.p2p.transports"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = make_project(tmp_path / "proj")
    (root / "racy.py").write_text(textwrap.dedent(RACY))
    (root / "rerun_suite").mkdir()
    (root / "rerun_suite" / "test_rerun.py").write_text(textwrap.dedent(RERUN_SUITE))
    return root


def _run(project: Path, transport: str, keyword: str, *extra: str) -> tuple[Any, dict[str, Any]]:
    result = run_pytest(
        project, "--zmq-conformance-only", "--zmq-suite", "rerun_suite", "--zmq-transport",
        transport, "-k", keyword, "--hypothesis-seed=7", "--zmq-report-json", "out/r.json",
        "--zmq-report-junit", "out/r.xml", "--zmq-report-markdown", "out/r.md", *extra,
    )
    return result, load_json(project / "out" / "r.json")


def _out(result: Any) -> str:
    return f"{result.stdout}\n{result.stderr}"


# -- the tally (pure logic) -----------------------------------------------------


def test_tally_says_flaky_only_for_mixed_outcomes() -> None:
    assert Tally(2, 5).flaky and Tally(2, 5).describe() == "flaky: failed 2 of 5 runs"
    assert not Tally(5, 5).flaky and Tally(5, 5).describe() == "reproduced 5 of 5 runs"
    assert Tally.decode(Tally(2, 5).encode()) == Tally(2, 5)
    for bad in ("", "2", "a b", "6 5", "1 0", "-1 5"):
        assert Tally.decode(bad) is None, bad
    with pytest.raises(ValueError):
        Tally(3, 2)


def test_fresh_seeds_differ_per_attempt_and_repeat_per_run() -> None:
    seeds = {fresh_seed(7, "t::x", attempt) for attempt in range(2, 6)}
    assert len(seeds) == 4
    assert fresh_seed(7, "t::x", 2) == fresh_seed(7, "t::x", 2)
    assert fresh_seed(8, "t::x", 2) != fresh_seed(7, "t::x", 2)


# -- through pytest and the CLI ---------------------------------------------------


def test_sometimes_failing_test_is_flaky_in_every_report(project: Path) -> None:
    result, data = _run(project, "racy:Racy", "test_burst")
    assert result.returncode == 1, _out(result)  # flaky still fails the gate
    clause = data["clauses"]["MSG-2"]
    assert clause["verdict"] == "flaky", _out(result)
    test = clause["tests"][0]
    assert test["runs"] == 5 and 0 < test["failed_runs"] < 5, test
    assert clause["reason"] == f"flaky: failed {test['failed_runs']} of 5 runs"
    assert data["counts"]["flaky"] == 1
    # The counterexample and replay are the first run's, with the run's seed.
    assert "waiting for: 20 message(s)" in clause["counterexample"]
    assert "--hypothesis-seed 7" in clause["replay"]
    failure = junit_cases(project / "out" / "r.xml")["MSG-2"].find("failure")
    assert failure is not None and failure.attrib["type"] == "flaky"
    assert "Reason: flaky: failed" in (failure.text or "")
    markdown = (project / "out" / "r.md").read_text()
    assert "| MSG-2 | **FLAKY** |" in markdown
    assert f"Reason: flaky: failed {test['failed_runs']} of 5 runs" in markdown
    assert "FLAKY    MSG-2" in result.stdout
    assert "1 flaky" in result.stdout


def test_tally_crosses_from_xdist_workers(project: Path) -> None:
    result, data = _run(project, "racy:Racy", "test_burst", "-n", "2")
    assert result.returncode == 1, _out(result)
    clause = data["clauses"]["MSG-2"]
    assert clause["verdict"] == "flaky", _out(result)
    assert clause["tests"][0]["runs"] == 5


def test_failure_every_time_stays_failed(project: Path) -> None:
    result, data = _run(project, f"{_MUTANTS}:ReordersMessages", "test_burst",
                        "--zmq-reruns", "2")
    assert result.returncode == 1, _out(result)
    clause = data["clauses"]["MSG-2"]
    assert clause["verdict"] == "failed"
    assert clause["reason"] == "reproduced 3 of 3 runs"
    assert clause["tests"][0]["runs"] == 3


def test_bug_found_by_search_is_reproduced_not_flaky(project: Path) -> None:
    """Re-runs replay the failing example first, so a value-bound bug fails every run."""
    result, data = _run(project, f"{_MUTANTS}:LargeIntsWrap", "test_integer")
    assert result.returncode == 1, _out(result)
    clause = data["clauses"]["MSG-1"]
    assert clause["verdict"] == "failed", clause
    assert clause["reason"] == "reproduced 5 of 5 runs"
    assert "--hypothesis-seed 7" in clause["replay"]


def test_blocked_test_is_not_rerun(project: Path) -> None:
    result, data = _run(project, f"{_MUTANTS}:SendBlocksAtHwm", "test_send_blocks")
    assert result.returncode == 1, _out(result)
    clause = data["clauses"]["MSG-4"]
    assert clause["verdict"] == "blocked", clause
    assert "runs" not in clause["tests"][0]


def test_void_runs_are_repeated_until_one_gives_a_verdict(project: Path) -> None:
    """A run voided by a host stall is no evidence: it runs again (same seed) until an
    attempt judges, and that attempt is the first run the tally counts from."""
    result, data = _run(project, f"{_MUTANTS}:ReordersMessages", "test_void_twice",
                        "--zmq-reruns", "2")
    assert result.returncode == 1, _out(result)
    clause = data["clauses"]["MSG-3"]
    assert clause["verdict"] == "failed", clause
    assert clause["reason"] == "reproduced 3 of 3 runs"
    test = clause["tests"][0]
    assert test["measurements"]["void_runs"] == "2", test
    assert "the verdict of the first run that counted" in clause["counterexample"]
    assert (project / "rerun_suite" / "void_twice").read_text() == "5"  # 2 void + 3 judged
    assert data["run_errors"] == []


def test_an_attempt_after_a_blocked_void_one_has_whole_limits(project: Path) -> None:
    """A block in a void attempt cuts that attempt's later limits to 0.2 s (cheap
    shrinking), never the next attempt's: a 0.5 s call within its 5 s limit passes."""
    result, data = _run(project, "reference_impl:ZmqTransport", "test_void_after_a_block",
                        "--zmq-reruns", "2")
    clause = data["clauses"]["CONN-7"]
    assert clause["verdict"] == "passed", (clause, _out(result))
    assert clause["tests"][0]["measurements"]["void_runs"] == "1", clause
    assert (project / "rerun_suite" / "void_after_block").read_text() == "2"


def test_a_run_void_every_time_stays_a_run_error(project: Path) -> None:
    result, data = _run(project, f"{_MUTANTS}:ReordersMessages", "test_always_void",
                        "--zmq-reruns", "2")
    clause = data["clauses"]["MSG-5"]
    assert clause["verdict"] == "skipped", clause
    assert (project / "rerun_suite" / "always_void").read_text() == "3"  # 1 + 2 re-runs
    assert len(data["run_errors"]) == 1 and "[host stall]" in data["run_errors"][0]
    assert result.returncode == 0, _out(result)  # pytest's own status; the CLI exits 3


def test_reruns_zero_reports_the_plain_failure(project: Path) -> None:
    result, data = _run(project, f"{_MUTANTS}:ReordersMessages", "test_burst",
                        "--zmq-reruns", "0")
    assert result.returncode == 1, _out(result)
    clause = data["clauses"]["MSG-2"]
    assert clause["verdict"] == "failed" and clause["reason"] is None
    assert "runs" not in clause["tests"][0]


def test_reference_passes_without_reruns(project: Path) -> None:
    result, data = _run(project, "reference_impl:ZmqTransport", "test_burst")
    assert result.returncode == 0, _out(result)
    assert data["clauses"]["MSG-2"]["verdict"] == "passed"
    assert "runs" not in data["clauses"]["MSG-2"]["tests"][0]


def test_cli_reruns_option(project: Path) -> None:
    result = run_cli(
        project, "run", "--suite", "rerun_suite", "--transport", "racy:Racy", "-k",
        "test_burst", "--reruns", "4", "--hypothesis-seed", "7", "--json", "out/c.json", "-q",
    )
    assert result.returncode == 1, _out(result)
    assert load_json(project / "out" / "c.json")["clauses"]["MSG-2"]["verdict"] == "flaky"
    bad = run_cli(project, "run", "--reruns", "-1")
    assert bad.returncode == 2 and "--reruns" in bad.stderr


def test_plugin_rejects_a_bad_rerun_count(project: Path) -> None:
    result = run_pytest(project, "--zmq-conformance-only", "--zmq-reruns", "many")
    assert result.returncode == 4
    assert "--zmq-reruns='many'" in result.stderr


def test_python_m_conformance_cli_lists_reruns_in_help() -> None:
    proc = subprocess.run([sys.executable, "-m", "conformance.cli", "run", "--help"],
                          capture_output=True, text=True, check=False)
    assert "--reruns" in proc.stdout
