"""CI-native output of ``zmq-conformance run``: progress, quiet reports, GitHub Actions.

* per-clause progress while the run goes: one line per finished clause when
  stdout is not a terminal, one live line (done/total, the clause running,
  elapsed) when it is (checked through a pty);
* no pytest session header unless ``-v``; no "report written:" line for
  the CLI's own temporary verdict file;
* with ``GITHUB_ACTIONS=true`` one ``::error`` annotation per failing clause
  (clause ID, requirement, replay command), with ``GITHUB_STEP_SUMMARY`` the
  Markdown report appended to that file;
* the JUnit XML: one testcase per clause, the counterexample in the failure.
"""

from __future__ import annotations

import io
import os
import pty
import re
import select
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from plugin_project import _env, junit_cases, make_project, run_cli

from conformance.contracts import CLAUSES, CONTRACTS
from conformance.reporting import github
from conformance.reporting.progress import Progress
from conformance.reporting.verdicts import ClauseVerdict, RunReport

TINY = ("run", "--suite", "tiny_suite")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path / "proj")


def _out(result: subprocess.CompletedProcess[str]) -> str:
    return f"{result.stdout}\n{result.stderr}"


# -- pure parts --------------------------------------------------------------------


def _failed(cid: str, counterexample: str) -> ClauseVerdict:
    return ClauseVerdict(
        CLAUSES[cid], "failed", counterexample=counterexample,
        reason="reproduced 5 of 5 runs",
        replay="zmq-conformance run -k 'test_x' --hypothesis-seed 7",
    )


def _report(*verdicts: ClauseVerdict) -> RunReport:
    clauses = {cid: ClauseVerdict(c, "passed") for cid, c in CLAUSES.items()
               if cid.startswith(("MSG", "POLL"))}
    clauses.update({v.clause.id: v for v in verdicts})
    return RunReport(transport="fakes:Broken", profile="ci", seed=7, clauses=clauses)


def test_annotation_names_clause_requirement_and_replay_escaped() -> None:
    verdict = _failed("MSG-1", "Failing test case: x\nAssertionError: 100% wrong, a: b\nmore")
    [line] = github.error_commands(_report(verdict))
    assert line.startswith("::error title=MSG-1 failed%3A message fidelity::"), line
    message = line.split("::", 2)[2]
    assert "\n" not in line and "%0A" in message
    decoded = message.replace("%0A", "\n").replace("%0D", "\r").replace("%25", "%")
    assert f"Requirement: {CLAUSES['MSG-1'].requirement}" in decoded
    assert "Evidence: AssertionError: 100% wrong, a: b" in decoded
    assert "Replay: zmq-conformance run -k 'test_x' --hypothesis-seed 7" in decoded


def test_emit_annotates_only_in_actions_and_appends_the_summary(tmp_path: Path) -> None:
    report = _report(_failed("MSG-1", "boom"), _failed("POLL-4", "slow"))
    out = io.StringIO()
    assert github.emit(report, out, environ={}) is None
    assert out.getvalue() == ""
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    env = {github.ENV_ACTIONS: "true", github.ENV_SUMMARY: str(summary)}
    assert github.emit(report, out, environ=env) == summary
    lines = out.getvalue().splitlines()
    assert [line.split("::")[1] for line in lines] == [  # in report order
        f"error title=POLL-4 failed%3A {CLAUSES['POLL-4'].title}",
        "error title=MSG-1 failed%3A message fidelity",
    ]
    text = summary.read_text()
    assert text.startswith("earlier step\n# zmq-conformance report")  # appended, not replaced
    assert "**FAIL**" in text and "### MSG-1" in text


def test_progress_lines_per_finished_clause() -> None:
    out = io.StringIO()
    now = [100.0]
    judged: list[str] = []

    def judge(cid: str) -> ClauseVerdict:
        judged.append(cid)
        return ClauseVerdict(CLAUSES[cid], "failed" if cid == "MSG-2" else "passed")

    progress = Progress(out, live=False, judge=judge, clock=lambda: now[0])
    progress.plan({"t1": ["MSG-1"], "t2": ["MSG-1", "MSG-2"], "t3": ["MSG-2"]})
    progress.plan({"t1": ["MSG-1"]})  # a second worker's identical plan changes nothing
    progress.started("t1")
    progress.finished("t1")
    assert out.getvalue() == ""  # MSG-1 still waits for t2
    now[0] = 101.5
    progress.finished("t2")
    assert out.getvalue().splitlines() == [
        f"[1/2] PASSED   MSG-1   {CLAUSES['MSG-1'].title}  (0 tests, 0.00 s)  at 1.5 s"
    ]
    progress.finished("t3")
    assert out.getvalue().splitlines()[1].startswith("[2/2] FAILED   MSG-2")
    assert judged == ["MSG-1", "MSG-2"]
    progress.close()


def test_progress_live_line_counts_and_names_the_running_clause() -> None:
    out = io.StringIO()
    progress = Progress(out, live=True, judge=lambda cid: ClauseVerdict(CLAUSES[cid], "passed"),
                        clock=lambda: 112.0, tick_s=60)
    progress.plan({"t1": ["MSG-1"], "t2": ["POLL-4"]})
    progress.started("t1")
    assert progress.line().startswith("zmq-conformance: 0/2 clauses  MSG-1 ")
    progress.finished("t1")
    progress.started("t2")
    assert progress.line().startswith("zmq-conformance: 1/2 clauses  POLL-4 ")
    progress.close()
    assert out.getvalue().endswith("\r\x1b[K")  # the line is gone before the summary


# -- through the CLI ------------------------------------------------------------------


def test_ci_log_gets_clause_lines_no_header_and_no_temp_report(project: Path) -> None:
    result = run_cli(project, *TINY, "--transport", "fakes:Sized")
    out = _out(result)
    assert result.returncode == 0, out
    assert "rootdir:" not in out and "platform linux" not in out, out
    assert "report written" not in out, out
    lines = [line for line in result.stdout.splitlines() if re.match(r"\[\d+/\d+\] ", line)]
    assert lines, out
    total = int(lines[0].split("/")[1].split("]")[0])
    assert len(lines) == total and lines[-1].startswith(f"[{total}/{total}] ")
    assert any("MSG-5" in line and "PASSED" in line for line in lines), lines


def test_verbose_keeps_the_header_and_asked_reports_are_named(project: Path) -> None:
    result = run_cli(project, *TINY, "--transport", "fakes:Sized", "-v", "--json", "r.json")
    out = _out(result)
    assert result.returncode == 0, out
    assert "rootdir:" in out
    assert f"report written: {project / 'r.json'}" in out


def test_github_actions_run_annotates_failures_and_writes_the_summary(
    project: Path, tmp_path: Path
) -> None:
    summary = tmp_path / "step-summary.md"
    result = run_cli(
        project, *TINY, "--transport", "fakes:Broken", "--junitxml", "r.xml",
        env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)},
    )
    out = _out(result)
    assert result.returncode == 1, out
    errors = [line for line in result.stdout.splitlines() if line.startswith("::error ")]
    assert errors and any(line.startswith("::error title=MSG-1 failed") for line in errors), out
    msg1 = next(line for line in errors if "MSG-1" in line)
    assert "Requirement%3A" not in msg1 and "Requirement: " in msg1
    assert "Replay: zmq-conformance run" in msg1 and "--hypothesis-seed" in msg1
    text = summary.read_text()
    assert "# zmq-conformance report" in text and "### MSG-1" in text
    cases = junit_cases(project / "r.xml")  # one testcase per clause, as CI viewers list them
    assert set(cases) == set(CONTRACTS["p2p"].clauses)
    suite = ET.parse(project / "r.xml").getroot()
    failures = [c for c in cases.values() if c.find("failure") is not None]
    assert int(suite.attrib["tests"]) == len(cases)
    assert int(suite.attrib["failures"]) == len(failures) >= 1
    failure = cases["MSG-1"].find("failure")
    assert failure is not None and failure.attrib["type"] == "failed"
    body = failure.text or ""
    assert CLAUSES["MSG-1"].requirement in body and "n=10" in body and "Replay:" in body, body


def test_terminal_shows_a_live_progress_line(project: Path) -> None:
    """Through a pty: the line is rewritten in place and names done/total."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "conformance.cli", *TINY, "--transport", "fakes:Sized"],
        cwd=project, env=_env(None), stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the child closed the pty
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    text = b"".join(chunks).decode(errors="replace")
    assert re.search(r"\r\x1b\[Kzmq-conformance: \d+/\d+ clauses", text), text
    assert not re.search(r"^\[\d+/\d+\] ", text, re.M), text  # no CI lines on a terminal
    assert "clauses:" in text  # the final summary follows


def test_the_example_workflow_runs_options_the_cli_takes() -> None:
    """docs/usage.md's workflow: its ``zmq-conformance run`` line parses as given."""
    from conformance.config import run_args

    text = (Path(__file__).resolve().parent.parent / "docs" / "usage.md").read_text()
    workflow = text.split("```yaml", 1)[1].split("```", 1)[0]
    folded = workflow.split("run: >", 1)[1].split("- name:", 1)[0]
    command = " ".join(folded.split())
    assert command.startswith("zmq-conformance run "), command
    args = run_args.parse_run(command.split()[2:])
    assert args.chaos and args.junitxml == "reports/conformance.xml"
    assert args.transport == "mypkg.transport:MyTransport"
