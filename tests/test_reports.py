"""Pure logic behind the reports: outcomes, verdict precedence, counterexamples,
the xfail file, capability parsing, and the three renderings."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.config.selection import parse_capabilities, parse_capability
from conformance.contracts import CLAUSES
from conformance.errors import CallBlocked, ConfigError
from conformance.reporting import xfail
from conformance.reporting.reports import render_json, render_junit, render_markdown
from conformance.reporting.verdicts import (
    CHAOS_REASON,
    NO_TEST_REASON,
    ReplayContext,
    RunReport,
    TestResult,
    aggregate,
    blamed_clauses,
    counterexample,
    exit_status,
    find_blocked,
    phase_outcome,
)

CTX = ReplayContext("pkg.mod:T", "ci", 7)


def _result(outcome: str, *clauses: str, ce: str | None = None, k: str = "t") -> TestResult:
    result = TestResult(f"test_x.py::{k}", clauses, k_expr=k)
    result.add_phase(outcome, 0.5, counterexample=ce)
    return result


@pytest.mark.parametrize(
    ("outcomes", "verdict"),
    [
        (["passed", "blocked", "crashed", "failed"], "crashed"),
        (["passed", "blocked", "failed"], "blocked"),
        (["passed", "failed", "xpassed"], "failed"),
        (["passed", "xpassed"], "xpassed"),
        (["xfailed", "passed", "skipped"], "passed"),
        (["skipped", "xfailed"], "xfailed"),
        (["skipped"], "skipped"),
    ],
)
def test_verdict_precedence(outcomes: list[str], verdict: str) -> None:
    results = [_result(o, "CONN-1", k=f"t{i}") for i, o in enumerate(outcomes)]
    assert aggregate(results, context=CTX)["CONN-1"].verdict == verdict


def test_clauses_without_tests_are_skipped_never_passed() -> None:
    verdicts = aggregate([_result("passed", "CONN-1")], context=CTX)
    assert set(verdicts) == set(CLAUSES)
    assert verdicts["CONN-2"].verdict == "skipped"
    assert verdicts["CONN-2"].reason == NO_TEST_REASON
    assert verdicts["HB-1"].reason == CHAOS_REASON
    assert aggregate([], context=CTX, chaos_enabled=True)["HB-1"].reason == NO_TEST_REASON
    narrowed = aggregate([], context=CTX, no_test_reason="no test selected (-k 'HB')")
    assert narrowed["CONN-2"].reason == "no test selected (-k 'HB')"


def test_shortest_counterexample_and_its_replay_win() -> None:
    results = [
        _result("failed", "MSG-1", ce="a much longer counterexample", k="long"),
        _result("failed", "MSG-1", ce="short", k="short"),
        _result("passed", "MSG-1", k="fine"),
    ]
    verdict = aggregate(results, context=CTX)["MSG-1"]
    assert verdict.counterexample == "short"
    assert verdict.replay == (
        "zmq-conformance run --transport pkg.mod:T --profile ci -k short --hypothesis-seed 7"
    )
    assert verdict.replay_pytest is not None and "--zmq-conformance-only" in verdict.replay_pytest
    assert verdict.duration_s == pytest.approx(1.5)


@pytest.mark.parametrize(
    ("message", "blamed"),
    [
        ("MSG-2: message #3 duplicated", ("MSG-2",)),
        ("MSG-2, CONN-3: lost and duplicated", ("MSG-2", "CONN-3")),
        ("RES-1: not marked on the test, still blamed", ("RES-1",)),
        ("XYZ-1: not a clause at all", ()),
        ("quoting CONN-3 mid-sentence blames nothing", ()),
        ("", ()),
    ],
)
def test_blame_comes_from_the_start_of_the_message(
    message: str, blamed: tuple[str, ...]
) -> None:
    assert blamed_clauses(AssertionError(message)) == blamed


def test_a_blamed_failure_fails_only_the_named_clause() -> None:
    machine = _result("failed", "CONN-3", "MSG-2", "POLL-1", k="machine")
    machine.blamed = ("MSG-2",)
    other = _result("passed", "CONN-3", k="example")
    verdicts = aggregate([machine, other], context=CTX)
    assert verdicts["MSG-2"].verdict == "failed"
    assert verdicts["CONN-3"].verdict == "passed"  # its own example test decides
    assert verdicts["POLL-1"].verdict == "skipped"
    assert "inconclusive" in (verdicts["POLL-1"].reason or "")


def test_a_failure_blamed_on_an_unmarked_clause_fails_that_clause() -> None:
    chaos_machine = _result("failed", "HB-5", k="chaos_machine")
    chaos_machine.blamed = ("CONN-3",)
    verdicts = aggregate([chaos_machine], context=CTX, chaos_enabled=True)
    assert verdicts["CONN-3"].verdict == "failed"
    assert verdicts["HB-5"].verdict == "skipped"


def test_phase_outcomes() -> None:
    def outcome(when: str, out: str, **flags: bool) -> str | None:
        values = {"wasxfail": False, "blocked": False, "xpassed": False, **flags}
        return phase_outcome(when=when, outcome=out, **values)

    assert outcome("setup", "passed") is None
    assert outcome("call", "passed") == "passed"
    assert outcome("call", "passed", wasxfail=True) == "xpassed"  # non-strict xfail
    assert outcome("call", "failed", xpassed=True) == "xpassed"  # strict XPASS
    assert outcome("call", "failed", blocked=True) == "blocked"
    assert outcome("???", "failed", crashed=True) == "crashed"  # xdist's crash report
    assert outcome("teardown", "failed") == "failed"
    assert outcome("call", "skipped", wasxfail=True) == "xfailed"
    assert outcome("setup", "skipped") == "skipped"


def test_counterexample_of_a_real_hypothesis_failure() -> None:
    @settings(database=None, print_blob=True, max_examples=200)
    @given(st.integers(min_value=0, max_value=1000))
    def off_by_one(n: int) -> None:
        assert n < 17, "too big"

    with pytest.raises(AssertionError) as info:
        off_by_one()
    text = counterexample(info.value)
    assert "17" in text.splitlines()[1]  # the shrunk example, right after its header
    assert "AssertionError: too big" in text
    assert "@reproduce_failure(" in text


def test_counterexample_of_a_plain_failure_is_its_message() -> None:
    assert counterexample(ValueError("bad frame")) == "ValueError: bad frame"


def test_blocked_is_found_in_groups_and_causes() -> None:
    blocked = CallBlocked("poll()", 2.0)
    group = ExceptionGroup("two", [ValueError("x"), ExceptionGroup("inner", [blocked])])
    assert find_blocked(group) is blocked
    wrapper = AssertionError("gave up")
    wrapper.__cause__ = blocked
    assert find_blocked(wrapper) is blocked
    assert find_blocked(ValueError("x")) is None


def _report() -> RunReport:
    results = [
        _result("failed", "MSG-1", ce="Falsifying example: f(\n  n=1,\n)\nboom \x00\x1b | pipe"),
        _result("passed", "CONN-1"),
        _result("blocked", "POLL-4", ce="CallBlocked: poll() blocked for 2.0 s (watchdog)"),
    ]
    return RunReport("pkg.mod:T", "ci", 7, aggregate(results, context=CTX))


def test_junit_is_valid_xml_with_one_testcase_per_clause() -> None:
    root = ET.fromstring(render_junit(_report()))
    cases = {c.attrib["name"].split()[0]: c for c in root.iter("testcase")}
    assert set(cases) == set(CLAUSES)
    assert root.attrib["failures"] == "2"
    failure = cases["MSG-1"].find("failure")
    assert failure is not None and failure.attrib["type"] == "failed"
    assert "n=1" in (failure.text or "")
    blocked = cases["POLL-4"].find("failure")
    assert blocked is not None and blocked.attrib["type"] == "blocked"
    assert cases["CONN-2"].find("skipped") is not None


def test_markdown_lists_failures_first_with_counterexample_and_replay() -> None:
    text = render_markdown(_report())
    rows = [line for line in text.splitlines() if line.startswith("| ") and "-" in line]
    assert rows[0].startswith("| POLL-4 | **BLOCKED**")
    assert rows[1].startswith("| MSG-1 | **FAILED**")
    assert "### MSG-1 message fidelity: failed" in text
    assert "zmq-conformance run --transport pkg.mod:T" in text
    assert "**FAIL**" in text


def test_measurements_reach_json_and_markdown() -> None:
    timed = _result("passed", "HB-1", k="test_hb1")
    timed.measurements["detection_ms"] = "587"
    report = RunReport("pkg.mod:T", "ci", 7, aggregate([timed], context=CTX, chaos_enabled=True))
    data = json.loads(render_json(report))
    assert data["clauses"]["HB-1"]["tests"][0]["measurements"] == {"detection_ms": "587"}
    assert "| HB-1 | `test_hb1` | detection_ms=587 |" in render_markdown(report)


def test_json_has_the_documented_shape() -> None:
    data = json.loads(render_json(_report()))
    assert (data["transport"], data["profile"], data["seed"]) == ("pkg.mod:T", "ci", 7)
    entry = data["clauses"]["MSG-1"]
    assert {"verdict", "title", "requirement", "tests", "counterexample", "reason", "replay",
            "duration_s"} <= set(entry)
    assert entry["tests"][0] == {
        "nodeid": "test_x.py::t", "outcome": "failed", "duration_s": 0.5, "reason": None,
        "counterexample": entry["counterexample"], "measurements": {},
    }


def test_xfail_file_format() -> None:
    entries = xfail.parse(
        "# comment\n\nCONN-3: dead window\ntest_a.py::test_b[x]: flaky here\ntest_c\nPOLL-9:\n"
    )
    assert [(e.pattern, e.reason, e.line) for e in entries] == [
        ("CONN-3", "dead window", 3),
        ("test_a.py::test_b[x]", "flaky here", 4),
        ("test_c", xfail.DEFAULT_REASON, 5),
        ("POLL-9", xfail.DEFAULT_REASON, 6),
    ]
    reasons, unmatched = xfail.match(
        entries, [("s/test_a.py::test_b[x]", ("MSG-1",)), ("s/t.py::test_d", ("CONN-3",))]
    )
    assert reasons == {"s/test_a.py::test_b[x]": "flaky here", "s/t.py::test_d": "dead window"}
    assert [e.pattern for e in unmatched] == ["test_c", "POLL-9"]
    assert [e.pattern for e in xfail.unknown_clauses(entries)] == ["POLL-9"]
    with pytest.raises(ConfigError, match=r"known\.txt:2"):
        xfail.parse("CONN-1: ok\n: no pattern\n", origin="known.txt")


def test_capabilities_are_typed_and_errors_name_the_option() -> None:
    assert parse_capability("heartbeat_ivl_ms=1000", origin="o") == ("heartbeat_ivl_ms", 1000)
    assert parse_capability("authentication = yes", origin="o") == ("authentication", True)
    assert parse_capability("max_message_bytes=none", origin="o") == ("max_message_bytes", None)
    assert parse_capabilities(["heartbeat_ivl_ms=5"], ["heartbeat_ivl_ms=7"]) == {
        "heartbeat_ivl_ms": 7
    }
    for bad, named in [("nonsense", "NAME=VALUE"), ("speed=1", "speed"),
                       ("authentication=maybe", "true or false"),
                       ("detects_peer_close_ms=none", "integer")]:
        with pytest.raises(ConfigError, match=named):
            parse_capability(bad, origin="--zmq-capability")
    with pytest.raises(ConfigError, match="positive"):
        parse_capabilities([], ["heartbeat_ivl_ms=-1"])


def test_exit_status_mapping() -> None:
    passing = RunReport("t", "ci", 1, aggregate([_result("passed", "CONN-1")], context=CTX))
    failing = _report()
    assert exit_status(passing, 0) == 0
    assert exit_status(failing, 1) == 1
    assert exit_status(passing, 1) == 1  # pytest saw a failure the verdicts missed
    assert exit_status(passing, 4) == exit_status(passing, 5) == 2
    assert exit_status(None, 2) == exit_status(passing, 3) == 3
    assert exit_status(passing, 2) == 3  # interrupted with nothing failed
    assert exit_status(failing, 2) == 1  # -x under xdist stops by interrupting


def test_crashed_clause_fails_the_run_in_every_format() -> None:
    crash = _result("crashed", "CONN-1", ce="worker gw0 died: Aborted (SIGABRT)\n\nstack")
    crash.reason = "worker gw0 died: Aborted (SIGABRT)"
    report = RunReport("pkg.mod:T", "ci", 7, aggregate([crash], context=CTX))
    verdict = report.clauses["CONN-1"]
    assert report.failed and verdict.verdict == "crashed"
    assert verdict.reason == "worker gw0 died: Aborted (SIGABRT)"
    assert report.to_json()["counts"]["crashed"] == 1
    case = next(c for c in ET.fromstring(render_junit(report)).iter("testcase")
                if c.attrib["name"].startswith("CONN-1 "))
    failure = case.find("failure")
    assert failure is not None and failure.attrib["type"] == "crashed"
    assert "| CONN-1 | **CRASHED** |" in render_markdown(report)
