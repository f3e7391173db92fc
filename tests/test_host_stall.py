"""The host-stall meter: a stall it measures turns a timing failure into a run error.

The stall is injected deterministically: the meter process is stopped with
SIGSTOP for a known time, as an overloaded host would keep it waiting.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from conformance.errors import CallBlocked, RunError
from conformance.supervision import host_stall, watchdog

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs SIGSTOP")


def _stall_meter(seconds: float) -> None:
    pid = host_stall.meter_pid()
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)
    time.sleep(0.05)  # the late wake-up is reported after SIGCONT


def test_a_stopped_meter_is_measured_as_a_stall_of_about_its_length() -> None:
    host_stall.start()
    since = time.monotonic()
    _stall_meter(0.4)
    stalled = host_stall.stall_ms(since)
    assert 350 <= stalled <= 2000, f"measured {stalled:.0f} ms for a 400 ms stop"
    assert host_stall.stolen_ms(since) >= stalled
    assert host_stall.stall_ms(time.monotonic()) == 0.0, "a later window saw the old stall"


def test_excused_turns_a_failure_across_a_stall_into_a_run_error() -> None:
    with pytest.raises(RunError, match=r"CONN-2: the host stalled processes for \d+ ms"), \
            host_stall.excused("CONN-2", slack_ms=300, why="the test's slack"):
        _stall_meter(0.4)
        raise AssertionError("CONN-2: the existing connection died")


def test_excused_keeps_the_verdict_when_the_host_ran_promptly() -> None:
    with pytest.raises(AssertionError, match="a real failure"), \
            host_stall.excused("CONN-2", slack_ms=300, why="the test's slack"):
        raise AssertionError("a real failure")
    with pytest.raises(CallBlocked), host_stall.excused("CONN-2", slack_ms=300, why="x"):
        _stall_meter(0.4)
        raise CallBlocked("send()", 5.0)  # a blocked call is never excused here


def test_the_watchdog_limit_counts_only_time_the_host_let_processes_run() -> None:
    """A call the host stalled past its limit is not blocked; one that blocks still is."""
    watchdog.new_test()
    started = time.monotonic()
    with watchdog.guard("slow but correct call", 0.3):
        _stall_meter(0.5)  # the host stalls 0.5 s inside a 0.3 s limit
    assert time.monotonic() - started >= 0.5
    started = time.monotonic()
    with pytest.raises(CallBlocked), watchdog.guard("stuck call", 0.3):
        _stall_meter(0.4)
        time.sleep(3)
    took = time.monotonic() - started
    assert 0.6 <= took < 2.5, f"blocked after {took:.2f} s: limit 0.3 s + 0.4 s stall"
    watchdog.new_test()
