"""The gate never hangs and never dies without a report; nothing outlives it.

Real processes throughout: ``zmq-conformance run`` against transports that
misbehave the way real ones do (the self-check mutants, plus one whose hang
the watchdog cannot interrupt), narrowed with ``-k`` to the tests that make
each point. Each run must end with exit 1, a verdict for every clause, the
right verdict on the right test, within a bound far below "hung".
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from plugin_project import load_json, run_cli

from conformance.contracts.p2p.clauses import CLAUSES

_MUTANTS = "conformance.contracts.p2p.transports"
#: Far above what each narrowed run needs (seconds), far below a hang.
_BOUND_S = 120.0


def _run(tmp_path: Path, transport: str, keyword: str, *extra: str) -> tuple[int, dict[str, Any]]:
    started = time.monotonic()
    result = run_cli(
        tmp_path, "run", "--transport", transport, "--json", "r.json", "-q", "-k", keyword, *extra
    )
    elapsed = time.monotonic() - started
    assert elapsed < _BOUND_S, f"took {elapsed:.0f} s"
    data = load_json(tmp_path / "r.json")
    assert set(data["clauses"]) == set(CLAUSES)  # a complete report
    assert all(entry["verdict"] for entry in data["clauses"].values())
    return result.returncode, data


def _outcomes(data: dict[str, Any]) -> dict[str, str]:
    return {
        test["nodeid"].rsplit("::", 1)[-1]: test["outcome"]
        for entry in data["clauses"].values()
        for test in entry["tests"]
    }


def test_abort_in_every_test_is_crashed_and_every_test_still_runs(tmp_path: Path) -> None:
    keyword = ("test_connect_returns_live or test_duplicate_connect_raises "
               "or test_mark_dead_flips_alive")
    code, data = _run(tmp_path, f"{_MUTANTS}:AbortsInSend", keyword)
    assert code == 1
    outcomes = _outcomes(data)
    assert len(outcomes) == 3 and set(outcomes.values()) == {"crashed"}, outcomes
    conn1 = data["clauses"]["CONN-1"]
    assert conn1["verdict"] == "crashed"
    assert "SIGABRT" in conn1["reason"]
    # The stack of the test's thread comes first and shows where it died.
    assert "transports.py" in conn1["counterexample"].split("Thread 0x")[0]


def test_close_that_never_returns_is_blocked(tmp_path: Path) -> None:
    code, data = _run(tmp_path, f"{_MUTANTS}:CloseNeverReturns",
                      "test_close_inbound_connection_is_idempotent")
    assert code == 1
    assert data["clauses"]["CONN-5"]["verdict"] == "blocked"
    assert "close() blocked" in data["clauses"]["CONN-5"]["reason"]


def test_poll_that_spins_is_blocked(tmp_path: Path) -> None:
    code, data = _run(tmp_path, f"{_MUTANTS}:PollSpins", "test_duplicate_connect_raises")
    assert code == 1
    assert data["clauses"]["CONN-2"]["verdict"] == "blocked"
    assert "poll() blocked" in data["clauses"]["CONN-2"]["reason"]


def test_abandoned_context_fails_res1_without_hanging(tmp_path: Path) -> None:
    # One re-run (not the default four, each waiting out RES-1's deadline): a second
    # transport abandoned in the same worker while the first is still reachable.
    code, data = _run(tmp_path, f"{_MUTANTS}:CloseAbandonsContext",
                      "test_transport_close_releases or test_close_is_idempotent",
                      "--reruns", "1")
    assert code == 1
    assert data["clauses"]["RES-1"]["verdict"] == "failed"


_DEAF = """
    import signal
    import threading

    from reference_impl import ZmqTransport


    class CloseHangsDeaf(ZmqTransport):
        '''close() hangs where no signal reaches it (as a call stuck in C would).'''

        def close(self) -> None:
            super().close()
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            threading.Event().wait()
"""


def test_hang_the_watchdog_cannot_interrupt_is_blocked_with_the_stack(tmp_path: Path) -> None:
    (tmp_path / "deaf.py").write_text(textwrap.dedent(_DEAF), encoding="utf-8")
    code, data = _run(tmp_path, "deaf:CloseHangsDeaf",
                      "test_close_inbound_connection_is_idempotent", "--stall-limit", "3")
    assert code == 1
    conn5 = data["clauses"]["CONN-5"]
    assert conn5["verdict"] == "blocked"
    assert "no progress for 3 s" in conn5["reason"]
    assert "Timeout" in conn5["counterexample"] and "deaf.py" in conn5["counterexample"]


def _start_long_run(tmp_path: Path) -> tuple[subprocess.Popen[bytes], list[psutil.Process]]:
    """A reference run with workers; returns once the CLI, pytest and 2 workers exist."""
    env = dict(os.environ)
    env.pop("PYTEST_ADDOPTS", None)
    cli = subprocess.Popen(
        [sys.executable, "-m", "conformance.cli", "run", "--json", "r.json", "-q",
         "-k", "test_cluster_machine or test_flapping"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    family: list[psutil.Process] = []
    while time.monotonic() < deadline:
        family = psutil.Process(cli.pid).children(recursive=True)
        if len(family) >= 3:  # pytest and its two workers
            return cli, family
        time.sleep(0.1)
    cli.kill()
    pytest.fail(f"the run never started its workers: {family}")


def _all_gone(processes: list[psutil.Process], within: float) -> list[psutil.Process]:
    _, alive = psutil.wait_procs(processes, timeout=within)
    return alive


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signalled_run_stops_everything_it_started(tmp_path: Path, sig: int) -> None:
    cli, family = _start_long_run(tmp_path)
    cli.send_signal(sig)
    try:
        code = cli.wait(timeout=15)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert code == 3
    assert _all_gone(family, within=5) == []


def test_children_of_a_killed_cli_exit_by_themselves(tmp_path: Path) -> None:
    cli, family = _start_long_run(tmp_path)
    cli.kill()
    cli.wait()
    assert _all_gone(family, within=10) == []
