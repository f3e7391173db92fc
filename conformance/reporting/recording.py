"""Recording a session's test reports as per-clause results, and writing the reports.

:func:`annotate` adds to a clause test's report what only the process that
ran it knows (blocked, counterexample, blamed clauses). :class:`Recorder`, a
plugin object registered per session, folds every phase report into a
:class:`~conformance.reporting.verdicts.TestResult`, turns xdist's "worker
crashed" into a blocked or crashed verdict with the postmortem's stacks, and
at the end builds and writes the reports and the terminal summary.
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance.config.collection import CLAUSES_KEY
from conformance.config.session import State
from conformance.errors import skip_message
from conformance.reporting import build, summary
from conformance.reporting.reports import write_reports
from conformance.reporting.verdicts import (
    TestResult,
    blamed_clauses,
    counterexample,
    find_blocked,
    phase_outcome,
    strip_hypothesis_notes,
)
from conformance.reporting.xfail import XFAIL_KEY
from conformance.supervision import postmortem, reruns

__all__ = ["Recorder", "annotate"]


def find_crashed(exc: BaseException | None) -> BaseException | None:
    """The driver crash (:class:`conformance.drivers.DriverCrashed`) in ``exc``, if any."""
    from conformance.drivers import find_crashed as find

    return find(exc)


def annotate(item: pytest.Item, call: pytest.CallInfo[None], report: pytest.TestReport) -> None:
    """Record on a clause test's report, where the exception still exists, whether it
    blocked, its counterexample and the clauses its message blames (or that a strict
    xfail passed)."""
    if item.stash.get(CLAUSES_KEY, None) is None:
        return
    exc = call.excinfo.value if call.excinfo is not None else None
    if report.failed and exc is not None:
        crashed = find_crashed(exc)
        blocked = find_blocked(exc)
        if crashed is not None:  # a driver process died: the verdict is crashed
            report.user_properties.append(("zmq_crashed", str(crashed)))
        elif blocked is not None:
            report.user_properties.append(("zmq_blocked", str(blocked)))
        report.user_properties.append(("zmq_counterexample", counterexample(exc)))
        blamed = blamed_clauses(exc)
        if blamed:
            report.user_properties.append(("zmq_blamed", " ".join(blamed)))
    elif report.failed and call.when == "call" and item.stash.get(XFAIL_KEY, None) is not None:
        report.user_properties.append(("zmq_xpassed", "1"))


class Recorder:
    """Collects the reports of one session and writes the per-clause verdicts.

    Registered by the plugin's ``pytest_configure`` for each session (so its hooks see
    the session's state); in an xdist run only the controller writes reports.
    """

    def __init__(self, config: pytest.Config, state: State) -> None:
        self.config = config
        self.state = state

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Fold each phase report of a clause test into its :class:`TestResult`."""
        props = {str(k): str(v) for k, v in report.user_properties}
        clauses = props.get("zmq_clauses")
        if clauses is None:
            return
        state = self.state
        if "zmq_transport" in props:
            state.fixture_transport = props["zmq_transport"]
        result = state.results.get(report.nodeid)
        if result is None:
            result = TestResult(
                report.nodeid, tuple(clauses.split()), k_expr=props.get("zmq_k"),
                chaos=props.get("zmq_chaos") == "1",
            )
            state.results[report.nodeid] = result
        wasxfail = getattr(report, "wasxfail", None)
        tally = reruns.Tally.decode(props.get(reruns.PROPERTY, ""))
        outcome = phase_outcome(
            when=report.when or "", outcome=report.outcome, wasxfail=wasxfail is not None,
            blocked="zmq_blocked" in props, xpassed="zmq_xpassed" in props,
            crashed="zmq_crashed" in props,
            flaky=tally is not None and tally.flaky,
        )
        if tally is not None:
            result.reruns = tally
        reason: str | None = None
        if outcome == "skipped":
            reason = _skip_reason(report)
        elif outcome in ("xfailed", "xpassed"):
            reason = wasxfail or props.get("zmq_xfail")
        elif outcome == "blocked":
            reason = props.get("zmq_blocked")
        elif outcome == "crashed":
            reason = props.get("zmq_crashed")
        rerun_s = props.get(reruns.SECONDS_PROPERTY)
        result.add_phase(
            outcome, report.duration + (float(rerun_s) if rerun_s else 0.0), reason=reason,
            counterexample=props.get("zmq_counterexample"),
        )
        if "zmq_blamed" in props:
            result.blamed = tuple(props["zmq_blamed"].split())
        result.measurements.update(
            (key, value) for key, value in props.items() if not key.startswith("zmq_")
        )

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport,
                               sched: Any) -> None:
        """xdist controller: turn "worker crashed" into blocked/crashed with the stack."""
        directory = self.state.postmortem_dir
        node = getattr(report, "node", None)
        worker = getattr(getattr(node, "gateway", None), "id", None)
        if directory is None or worker is None:
            return
        crash = postmortem.examine(directory, str(worker), crashitem)
        known = self.state.results.get(crashitem)
        clauses = crash.clauses or (known.clauses if known is not None else ())
        if not clauses:
            return
        props = dict(crash.properties)
        props["zmq_clauses"] = " ".join(clauses)
        key = "zmq_blocked" if crash.verdict == "blocked" else "zmq_crashed"
        props[key] = crash.reason
        props["zmq_counterexample"] = f"{crash.reason}\n\n{crash.trace}".strip()
        report.user_properties[:] = list(props.items())
        report.longrepr = f"{report.longrepr}\n{crash.reason}\n\n{crash.trace}"

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """xdist controller: take the xfail warnings the workers computed at collection."""
        output = getattr(node, "workeroutput", None) or {}
        self.state.warnings.extend(output.get("zmq_conformance_warnings", ()))

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        config, state = self.config, self.state
        if hasattr(config, "workerinput") or config.option.collectonly:
            return
        paths = {
            "json_path": config.getoption("zmq_report_json"),
            "junit_path": config.getoption("zmq_report_junit"),
            "markdown_path": config.getoption("zmq_report_markdown"),
        }
        if not (state.results or state.opted_in or any(paths.values())):
            return
        interrupted = (exitstatus == pytest.ExitCode.INTERRUPTED
                       or bool(session.shouldstop) or bool(session.shouldfail))
        state.report = build.build_report(config, state, interrupted=interrupted)
        base = config.invocation_params.dir
        state.written = write_reports(
            state.report, **{k: (base / v if v else None) for k, v in paths.items()}
        )
        verdicts_path = config.getoption("zmq_verdicts")
        if verdicts_path:  # the CLI's own channel: written, not listed as a report
            write_reports(state.report, json_path=base / verdicts_path)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        state = self.state
        if state.report is None or not (state.results or state.opted_in):
            return
        # The CLI's own output (run_args.output_args) sets the progress mode: its user
        # types --chaos, not the plugin's --zmq-chaos.
        cli = self.config.getoption("zmq_progress", "off") != "off"
        chaos_flag = "--chaos" if cli else "--zmq-chaos"
        summary.write_summary(terminalreporter, state.report, state.written,
                              chaos_flag=chaos_flag)


def _skip_reason(report: pytest.TestReport) -> str | None:
    """The reason a test gave for skipping, without the notes Hypothesis appends to it
    ("Failing explicit example: ..." when an ``@example`` skipped)."""
    longrepr: Any = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return strip_hypothesis_notes(skip_message(str(longrepr[2])))
    return None
