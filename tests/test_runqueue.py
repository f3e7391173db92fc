"""OwnDeadline: a wait counts the process's own time, not the host's run queue.

Each case runs in a child pinned to one CPU, so the host's queue is made on
purpose: a CPU hog pinned beside it, or not. The child's waiting loop spins
(always runnable), so the time it spends queued behind the hog is real
run-queue delay in ``/proc/self/task/*/schedstat``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from conformance.errors import HostStalled
from conformance.supervision import host_stall
from conformance.supervision.runqueue import MAX_STRETCH, OwnDeadline

pytestmark = pytest.mark.skipif(
    not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat")
    or not hasattr(os, "sched_setaffinity"),
    reason="needs Linux schedstat and CPU affinity")

_CHILD = textwrap.dedent("""
    import json, os, subprocess, sys, time
    from conformance.supervision.runqueue import OwnDeadline
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    hog = None
    if sys.argv[1] == "hog":
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        os.sched_setaffinity(hog.pid, {cpu})
    timeout = float(sys.argv[2])
    deadline = OwnDeadline(timeout)
    start = time.monotonic()
    while not deadline.expired():
        pass
    took = time.monotonic() - start
    if hog is not None:
        hog.kill()
        hog.wait()
    print(json.dumps({"took": took}))
""")


def _wait_in_child(mode: str, timeout: float) -> float:
    out = subprocess.run([sys.executable, "-c", _CHILD, mode, str(timeout)],
                         capture_output=True, text=True, timeout=60, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return float(json.loads(out.stdout)["took"])


def test_time_in_the_run_queue_is_given_back() -> None:
    # The waiting thread shares one CPU with a hog: about half the wall time is
    # queued, so the deadline moves out to about twice the plain timeout.
    took = _wait_in_child("hog", 0.5)
    assert 0.5 * 1.2 <= took <= 0.5 * MAX_STRETCH + 1.0, took


def test_an_unqueued_wait_ends_at_its_timeout_and_never_past_the_stretch_limit() -> None:
    took = _wait_in_child("alone", 0.5)
    assert 0.5 <= took <= 0.5 * MAX_STRETCH + 1.0, took


def test_a_deadline_that_is_never_checked_late_does_not_read_proc() -> None:
    deadline = OwnDeadline(60.0)
    assert not deadline.expired()
    assert deadline._delays is None  # a quick success costs one clock read


def test_a_bound_summed_over_round_trips_is_void_when_a_worker_process_waited_that_long(
) -> None:
    """``host_stall.excused(in_all=True, pids=...)``: the node process doing the work sat
    in the run queue (behind a hog on its one CPU) for more than the slack, so a failed
    bound is a run error, not a verdict; the meter, asleep between samples, saw nothing."""
    spin = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass\n"
    cpu = str(min(os.sched_getaffinity(0)))
    procs = [subprocess.Popen([sys.executable, "-c", spin, cpu]) for _ in range(2)]
    try:
        with pytest.raises(HostStalled, match="PROC-3"), host_stall.excused(
                "PROC-3", slack_ms=350, in_all=True, pids=[procs[0].pid], why="the slack"):
            time.sleep(1.5)  # both spinners share one CPU: each waits about half of it
            raise AssertionError("PROC-3: not reachable at once")
        with pytest.raises(AssertionError, match="at once"), host_stall.excused(
                "PROC-3", slack_ms=5_000, in_all=True, pids=[procs[0].pid], why="the slack"):
            raise AssertionError("PROC-3: not reachable at once")  # too little queue: stands
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


_GUARDED = textwrap.dedent("""
    import json, os, subprocess, sys, time
    from conformance.errors import CallBlocked
    from conformance.supervision import watchdog
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    os.sched_setaffinity(hog.pid, {cpu})
    time.sleep(0.2)
    out = {}
    def compute(cpu_s):
        start = time.thread_time()
        while time.thread_time() - start < cpu_s:
            pass
    for name, body in (("computes", lambda: compute(0.4)), ("sleeps", lambda: time.sleep(1.5))):
        try:
            with watchdog.guard(name, 0.6):
                body()
            out[name] = "returned"
        except CallBlocked:
            out[name] = "blocked"
    hog.kill()
    hog.wait()
    print(json.dumps(out))
""")


def test_a_call_that_waits_for_a_cpu_is_not_blocked_and_one_that_sleeps_is() -> None:
    """The watchdog credits the calling thread's run-queue wait: 0.4 s of work behind a hog
    on one CPU takes about 0.8 s of wall time, past the 0.6 s limit, and is no block; a
    call that sleeps 1.5 s is not runnable, gains no credit, and is blocked."""
    out = subprocess.run([sys.executable, "-c", _GUARDED], capture_output=True, text=True,
                         timeout=60, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert json.loads(out.stdout) == {"computes": "returned", "sleeps": "blocked"}, out.stderr
