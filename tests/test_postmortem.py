"""Reading what a dead worker left (:func:`conformance.supervision.postmortem.examine`).

The faulthandler side is exercised end to end by ``test_trust.py``; here the
files are written by hand, in faulthandler's format, to pin down the parsing.
"""

from __future__ import annotations

import json
from pathlib import Path

from conformance.supervision.postmortem import examine

_NODE = "suite/test_x.py::test_y"
_RUNNER = '  File "/x/_pytest/runner.py", line 1 in pytest_runtest_call\n'


def _leave(directory: Path, trace: str, nodeid: str = _NODE) -> None:
    record = {"nodeid": nodeid, "clauses": ["CONN-5"], "properties": {"zmq_k": "test_y"},
              "stall_limit": 7.0}
    (directory / "gw3.test.json").write_text(json.dumps(record), encoding="utf-8")
    (directory / "gw3.trace").write_text(trace, encoding="utf-8")


def test_stall_deadline_is_blocked_with_the_test_thread_first(tmp_path: Path) -> None:
    _leave(tmp_path, "Timeout (0:00:07)!\nThread 0x1 (most recent call first):\n"
           '  File "/x/execnet.py", line 9 in serve\n\n'
           f"Thread 0x2 (most recent call first):\n{_RUNNER}")
    crash = examine(tmp_path, "gw3", _NODE)
    assert crash.verdict == "blocked"
    assert "no progress for 7 s" in crash.reason
    assert crash.clauses == ("CONN-5",) and crash.properties == {"zmq_k": "test_y"}
    assert crash.trace.index("Thread 0x2") < crash.trace.index("Thread 0x1")


def test_fatal_signal_is_crashed_naming_the_signal(tmp_path: Path) -> None:
    _leave(tmp_path, f"Fatal Python error: Aborted\n\nCurrent thread 0x2 (most recent call "
           f"first):\n{_RUNNER}")
    crash = examine(tmp_path, "gw3", _NODE)
    assert crash.verdict == "crashed"
    assert crash.reason == "worker gw3 died: Aborted (SIGABRT)"


def test_a_journal_of_another_test_gives_no_clauses(tmp_path: Path) -> None:
    _leave(tmp_path, "", nodeid="suite/test_x.py::test_other")
    crash = examine(tmp_path, "gw3", _NODE)
    assert crash.verdict == "crashed" and crash.clauses == ()
    assert "no fatal signal recorded" in crash.reason
