"""The ``zmq-conformance`` CLI: exit statuses, reports, replay, validation, listing.

Runs go through a subprocess in a temporary project (``fakes.py`` resolves
from the current directory); two end-to-end runs use the real suite and the
reference transport, narrowed with ``-k``.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from plugin_project import junit_cases, load_json, make_project, run_cli, verdicts

from conformance.cli import main
from conformance.contracts import CLAUSES, CONTRACTS

TINY = ("run", "--suite", "tiny_suite")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path / "proj")


def _out(result: object) -> str:
    return f"{getattr(result, 'stdout', '')}\n{getattr(result, 'stderr', '')}"


def test_list_prints_every_clause_with_requirement(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    text = capsys.readouterr().out
    for clause in CLAUSES.values():
        assert f"{clause.id} " in text and clause.title in text
        assert clause.requirement.split()[0] in text
    assert text.count("[chaos]") == sum(c.chaos for c in CLAUSES.values())
    assert main(["list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == set(CLAUSES) and data["HB-1"]["chaos"] is True


def test_passing_run_exits_0_and_writes_every_report(project: Path) -> None:
    result = run_cli(
        project, *TINY, "--transport", "fakes:Sized", "--json", "r.json",
        "--junitxml", "r.xml", "--markdown", "r.md",
    )
    assert result.returncode == 0, _out(result)
    data = load_json(project / "r.json")
    assert isinstance(data["seed"], int)  # a fresh seed, recorded for replay
    assert verdicts(data)["MSG-5"] == "passed"
    assert len(junit_cases(project / "r.xml")) == len(CONTRACTS["p2p"].clauses)
    assert "**PASS**" in (project / "r.md").read_text()
    # The CLI's own flag, not the pytest option behind it.
    assert "chaos clauses not run: use --chaos)" in result.stdout, _out(result)


def test_failing_run_exits_1_and_its_replay_command_reproduces(project: Path) -> None:
    result = run_cli(project, *TINY, "--transport", "fakes:Broken", "--json", "r.json")
    assert result.returncode == 1, _out(result)
    data = load_json(project / "r.json")
    replay = data["clauses"]["MSG-1"]["replay"]
    assert f"--hypothesis-seed {data['seed']}" in replay
    argv = shlex.split(replay)
    assert argv[:2] == ["zmq-conformance", "run"]
    again = run_cli(project, *argv[1:], "--suite", "tiny_suite", "--json", "again.json")
    assert again.returncode == 1, _out(again)
    rerun = load_json(project / "again.json")
    assert rerun["seed"] == data["seed"]
    assert rerun["clauses"]["MSG-1"]["verdict"] == "failed"
    assert len(rerun["clauses"]["MSG-1"]["tests"]) == 1  # -k narrowed to the failing test
    assert "n=10" in rerun["clauses"]["MSG-1"]["counterexample"]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--transport", "no_such_module:Transport"), "no_such_module"),
        (("--transport", "fakes"), "MODULE:ATTR"),
        (("--profile", "nightly-ish"), "nightly-ish"),
        (("--capability", "heartbeat_ivl_ms=soon"), "heartbeat_ivl_ms"),
        (("--xfail-file", "nope.txt"), "nope.txt"),
        (("-k", "no_test_is_called_this"), "no test selected"),
    ],
)
def test_usage_errors_exit_2_with_one_line(
    project: Path, args: tuple[str, ...], named: str
) -> None:
    result = run_cli(project, *TINY, *args)
    assert result.returncode == 2, _out(result)
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and named in errors[0], result.stderr
    assert "Traceback" not in result.stderr


def test_xfail_file_exit_codes_and_unmatched_warning(project: Path) -> None:
    (project / "known.txt").write_text("MSG-1: off by one\nCONN-1: broken\nSEC-2: not here\n")
    result = run_cli(project, *TINY, "--transport", "fakes:Broken", "--xfail-file", "known.txt")
    assert result.returncode == 0, _out(result)
    assert "warning: known.txt:3: 'SEC-2' matches no test" in result.stderr
    fixed = run_cli(project, *TINY, "--transport", "fakes:Good", "--xfail-file", "known.txt",
                    "--json", "r.json")
    assert fixed.returncode == 1, _out(fixed)
    assert verdicts(load_json(project / "r.json"))["MSG-1"] == "xpassed"


def test_blocked_call_exits_1_under_xdist(project: Path) -> None:
    result = run_cli(project, *TINY, "--transport", "fakes:Stuck", "-n", "2", "--json", "r.json")
    assert result.returncode == 1, _out(result)
    assert verdicts(load_json(project / "r.json"))["POLL-4"] == "blocked"


def test_real_suite_end_to_end_reference_passes_and_broken_fails(project: Path) -> None:
    narrow = ("run", "-k", "test_duplicate_connect_raises_and_keeps_existing", "--json")
    good = run_cli(project, *narrow, "good.json")
    assert good.returncode == 0, _out(good)
    data = load_json(project / "good.json")
    assert data["transport"] == "reference_impl:ZmqTransport"
    assert verdicts(data)["CONN-2"] == "passed"
    bad = run_cli(project, *narrow, "bad.json", "--transport", "brokenref:ConnectRaises")
    assert bad.returncode == 1, _out(bad)
    clause = load_json(project / "bad.json")["clauses"]["CONN-2"]
    assert clause["verdict"] == "failed"
    assert "deliberately broken connect" in clause["counterexample"]


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "zmq-conformance"
    if not script.exists():
        pytest.skip("project not installed (pip install -e .)")
    assert script.read_text().count("conformance.cli") >= 1
