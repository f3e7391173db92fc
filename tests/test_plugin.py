"""The pytest plugin, driven as users drive it: pytest in a subprocess in a temp project.

Most runs use the project's dedicated clause-marked module (``--zmq-suite
tiny_suite``) and tiny fake transports so each run takes well under a second;
one test collects the real suite to prove the opt-in adds it exactly once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from plugin_project import junit_cases, load_json, make_project, run_pytest, verdicts

from conformance.config.loading import DEFAULT_TRANSPORT, ENV_TRANSPORT
from conformance.config.selection import choose_transport, suite_paths
from conformance.contracts.p2p.clauses import CLAUSES
from conformance.reporting.build import INTERRUPTED_REASON
from conformance.reporting.verdicts import CHAOS_REASON, NO_TEST_REASON

TINY = ("--zmq-conformance-only", "--zmq-suite", "tiny_suite")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path / "proj")


def _out(result: object) -> str:
    return f"{getattr(result, 'stdout', '')}\n{getattr(result, 'stderr', '')}"


def test_session_without_opt_in_runs_only_its_own_tests(project: Path) -> None:
    result = run_pytest(project, "-v")
    assert result.returncode == 0, _out(result)
    assert "2 passed" in result.stdout
    assert "test_connections.py" not in result.stdout
    assert "tiny_suite" not in result.stdout
    assert "zmq-conformance:" not in result.stdout  # no per-clause summary


def test_opt_in_adds_the_real_suite_exactly_once(project: Path) -> None:
    suite_dir = suite_paths(chaos=False)[0]
    opted = run_pytest(project, "--zmq-conformance", "--collect-only", "-q")
    assert opted.returncode == 0, _out(opted)
    ids = [line for line in opted.stdout.splitlines() if "::" in line]
    suite_ids = [i for i in ids if "test_own.py" not in i]
    assert any("test_own.py::test_own" in i for i in ids)
    assert any("test_connections.py::" in i for i in suite_ids)
    assert len(ids) == len(set(ids))
    # Naming the suite directory as well must not collect it twice.
    both = run_pytest(project, "--zmq-conformance", str(suite_dir), "--collect-only", "-q")
    both_ids = [line for line in both.stdout.splitlines() if "::" in line]
    assert len(both_ids) == len(set(both_ids)) == len(suite_ids), _out(both)


def test_reports_are_per_clause_and_correct_under_xdist(project: Path) -> None:
    result = run_pytest(
        project, *TINY, "--zmq-transport", "fakes:Broken", "-n", "2",
        "--zmq-report-json", "out/r.json", "--zmq-report-junit", "out/r.xml",
        "--zmq-report-markdown", "out/r.md",
    )
    assert result.returncode == 1, _out(result)
    data = load_json(project / "out" / "r.json")
    assert data["transport"] == "fakes:Broken"
    assert data["profile"] == "ci"
    got = verdicts(data)
    assert set(got) == {  # one entry per clause of the registry
        *(f"CONN-{i}" for i in range(1, 8)), *(f"POLL-{i}" for i in range(1, 6)),
        *(f"MSG-{i}" for i in range(1, 6)), *(f"HB-{i}" for i in range(1, 8)),
        *(f"PROC-{i}" for i in range(1, 4)), "RES-1", "RES-2", "SEC-1", "SEC-2", "SEC-3",
    }
    assert got["CONN-1"] == got["MSG-1"] == got["MSG-2"] == "failed"
    assert got["POLL-4"] == got["RES-1"] == "passed"
    msg1 = data["clauses"]["MSG-1"]
    assert "n=10" in msg1["counterexample"]  # Hypothesis shrank to the boundary
    assert "@reproduce_failure" in msg1["counterexample"]
    assert "connect always fails" in data["clauses"]["CONN-1"]["counterexample"]
    assert "--transport fakes:Broken" in msg1["replay"]
    assert "-k 'test_tiny and test_echo'" in msg1["replay"]
    assert msg1["tests"][0]["nodeid"].endswith("test_tiny.py::test_echo")
    assert data["clauses"]["MSG-5"]["verdict"] == "skipped"
    assert data["clauses"]["MSG-5"]["reason"] == "capability max_message_bytes not declared"
    assert data["clauses"]["CONN-2"]["reason"] == NO_TEST_REASON
    assert data["clauses"]["HB-1"]["reason"] == CHAOS_REASON
    cases = junit_cases(project / "out" / "r.xml")
    assert len(cases) == len(CLAUSES)
    assert cases["MSG-1"].find("failure") is not None
    assert cases["POLL-4"].find("failure") is None and cases["POLL-4"].find("skipped") is None
    assert cases["CONN-2"].find("skipped") is not None
    markdown = (project / "out" / "r.md").read_text()
    rows = [line for line in markdown.splitlines() if line.startswith("| ") and "-" in line]
    assert [r.split(" | ")[1] for r in rows[:3]] == ["**FAILED**"] * 3  # failures first
    assert len(rows) == len(CLAUSES)
    assert "n=10" in markdown and "zmq-conformance run --transport fakes:Broken" in markdown
    assert "FAILED   MSG-1" in result.stdout  # terminal per-clause summary


def test_a_run_stopped_early_says_so_for_the_clauses_it_did_not_reach(project: Path) -> None:
    """``-x`` (like Ctrl-C) ends the session before every test ran: a clause left
    without a test is "not run", never "no test collected" (that would claim the
    suite has no test for it)."""
    result = run_pytest(project, *TINY, "--zmq-transport", "fakes:Broken", "-x",
                        "--zmq-report-json", "out/r.json")
    assert result.returncode == 1, _out(result)
    data = load_json(project / "out" / "r.json")
    reasons = {cid: c.get("reason") for cid, c in data["clauses"].items()
               if c["verdict"] == "skipped"}
    assert INTERRUPTED_REASON in reasons.values(), reasons
    assert NO_TEST_REASON not in reasons.values(), reasons
    assert "failed" in verdicts(data).values()


def test_fixture_override_beats_the_command_line(project: Path) -> None:
    (project / "conftest.py").write_text(
        "import pytest\nimport fakes\n\n\n@pytest.fixture\n"
        "def zmq_transport_factory():\n    return fakes.Broken\n"
    )
    result = run_pytest(
        project, *TINY, "--zmq-transport", "fakes:Good", "--zmq-report-json", "r.json"
    )
    assert result.returncode == 1, _out(result)
    data = load_json(project / "r.json")
    assert data["transport"].startswith("fixture ") and "Broken" in data["transport"]
    assert verdicts(data)["CONN-1"] == "failed"
    assert "--transport" not in data["clauses"]["CONN-1"]["replay"]


def test_transport_precedence_is_option_ini_env_default() -> None:
    assert choose_transport("a:A", "b:B", "c:C") == ("a:A", "--zmq-transport")
    assert choose_transport(None, "b:B", "c:C") == ("b:B", "ini zmq_transport")
    assert choose_transport(None, "", "c:C") == ("c:C", ENV_TRANSPORT)
    assert choose_transport(None, None, None)[0] == DEFAULT_TRANSPORT


def test_ini_beats_env_and_env_is_used_alone(project: Path) -> None:
    ini = project / "pytest.ini"
    ini.write_text("[pytest]\ntestpaths = tests\nzmq_transport = fakes:Sized\n")
    env = {ENV_TRANSPORT: "fakes:Broken"}
    result = run_pytest(project, *TINY, "--zmq-report-json", "r.json", env=env)
    assert result.returncode == 0, _out(result)
    got = verdicts(load_json(project / "r.json"))
    assert got["CONN-1"] == got["MSG-5"] == "passed"  # Sized declares its size limit
    (project / "pytest.ini").write_text("[pytest]\ntestpaths = tests\n")
    result = run_pytest(project, *TINY, "--zmq-report-json", "r.json", env=env)
    assert result.returncode == 1, _out(result)
    assert verdicts(load_json(project / "r.json"))["CONN-1"] == "failed"


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--zmq-transport", "no_such_module:X"), "no_such_module"),
        (("--zmq-transport", "fakes:Missing"), "fakes:Missing"),
        (("--zmq-transport", "fakes:NOT_CALLABLE"), "NOT_CALLABLE"),
        (("--zmq-profile", "bogus"), "bogus"),
        (("--zmq-capability", "warp_speed=1"), "warp_speed"),
        (("--zmq-capability", "max_message_bytes=big"), "max_message_bytes"),
        (("--zmq-xfail-file", "missing.txt"), "missing.txt"),
    ],
)
def test_bad_configuration_is_a_one_line_usage_error(
    project: Path, args: tuple[str, ...], named: str
) -> None:
    result = run_pytest(project, *TINY, *args)
    assert result.returncode == 4, _out(result)
    errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1 and named in errors[0], result.stderr
    assert "Traceback" not in _out(result)


def test_xfail_file_marks_warns_and_strict_xpass_fails(project: Path) -> None:
    xfail_file = project / "known.txt"
    xfail_file.write_text(
        "# known defects\n"
        "MSG-1: echo is off by one\n"
        "test_tiny.py::test_connect: connect is broken\n"
        "CONN-7: nothing checks this here\n"
    )
    common = (*TINY, "--zmq-xfail-file", str(xfail_file), "--zmq-report-json", "r.json")
    result = run_pytest(project, *common, "--zmq-transport", "fakes:Broken")
    assert result.returncode == 0, _out(result)
    data = load_json(project / "r.json")
    got = verdicts(data)
    assert got["MSG-1"] == got["MSG-2"] == got["CONN-1"] == "xfailed"
    assert data["clauses"]["MSG-1"]["reason"] == "echo is off by one"
    assert "ZmqConformanceWarning" in result.stdout and "'CONN-7' matches no test" in result.stdout
    assert any("CONN-7" in w for w in data["warnings"])
    fixed = run_pytest(project, *common, "--zmq-transport", "fakes:Good")
    assert fixed.returncode == 1, _out(fixed)
    got = verdicts(load_json(project / "r.json"))
    assert got["MSG-1"] == got["CONN-1"] == "xpassed"


def test_blocked_call_is_reported_and_the_run_ends(project: Path) -> None:
    result = run_pytest(
        project, *TINY, "--zmq-transport", "fakes:Stuck", "--zmq-report-json", "r.json"
    )
    assert result.returncode == 1, _out(result)
    data = load_json(project / "r.json")
    assert data["clauses"]["POLL-4"]["verdict"] == "blocked"
    assert "poll() blocked" in data["clauses"]["POLL-4"]["counterexample"]
    assert verdicts(data)["CONN-1"] == "passed"


def test_profile_capabilities_and_chaos_apply_to_the_suite_only(project: Path) -> None:
    result = run_pytest(
        project, "--zmq-conformance", "--zmq-suite", "tiny_suite", "--zmq-transport",
        "fakes:Good", "--zmq-profile", "dev", "--zmq-capability", "max_message_bytes=1024",
        "--zmq-chaos", "--zmq-report-json", "r.json", "-v",
        env={"TINY_PROFILE": "dev"},
    )
    assert result.returncode == 0, _out(result)
    # The user's own Hypothesis test kept Hypothesis' default settings.
    assert "test_own_hypothesis_keeps_default_settings PASSED" in result.stdout
    data = load_json(project / "r.json")
    assert data["profile"] == "dev"
    got = verdicts(data)
    assert got["RES-1"] == got["MSG-5"] == got["HB-1"] == "passed"


FREEZE_PROBE = '''
import gc
import os

import pytest


@pytest.mark.clause("MSG-1")
def test_heap_frozen_only_in_a_suite_only_session(zmq_transport_spec):
    frozen = gc.get_freeze_count()
    assert (frozen > 0) == (os.environ["EXPECT_FROZEN"] == "1"), frozen
'''


def test_the_heap_is_frozen_after_collection_only_where_the_session_is_the_suites(
    project: Path,
) -> None:
    (project / "probe_suite").mkdir()
    (project / "probe_suite" / "test_probe.py").write_text(FREEZE_PROBE)
    suite = ("--zmq-suite", "probe_suite", "--zmq-transport", "fakes:Good")
    alone = run_pytest(project, "--zmq-conformance-only", *suite, env={"EXPECT_FROZEN": "1"})
    assert alone.returncode == 0, _out(alone)
    shared = run_pytest(project, "--zmq-conformance", *suite, env={"EXPECT_FROZEN": "0"})
    assert shared.returncode == 0, _out(shared)
    assert "3 passed" in shared.stdout, _out(shared)
