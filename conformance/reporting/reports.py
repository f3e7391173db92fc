"""Writing a :class:`~conformance.reporting.verdicts.RunReport` as JSON, JUnit XML and Markdown.

* JSON: ``{"contract", "transport", "profile", "seed", "counts", "clauses":
  {ID: {...}}}``, one entry per clause of the contract (see ``docs/usage.md`` for the fields).
* JUnit XML: one ``<testsuite name="zmq-conformance">``, one ``<testcase>`` per
  clause; ``failed``, ``flaky``, ``blocked``, ``crashed`` and ``xpassed`` clauses
  carry a ``<failure>`` (its ``type`` is the verdict; the re-run tally, "flaky:
  failed 2 of 5 runs", leads its text), ``skipped`` and ``xfailed`` ones a
  ``<skipped>``.
* Markdown: a summary line and a table (failures first), then one section per
  failing clause with its requirement, shortest counterexample and replay
  command.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from conformance import contracts
from conformance.contracts import CLAUSES
from conformance.reporting.verdicts import FAILING, ClauseVerdict, RunReport

#: Characters XML 1.0 cannot carry at all; replaced so the file always parses.
_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")

_VERDICT_LABEL = {
    "crashed": "**CRASHED**",
    "blocked": "**BLOCKED**",
    "failed": "**FAILED**",
    "flaky": "**FLAKY**",
    "xpassed": "**XPASSED**",
    "passed": "passed",
    "xfailed": "xfailed",
    "skipped": "skipped",
}


def render_json(report: RunReport) -> str:
    return json.dumps(report.to_json(), indent=2, sort_keys=False) + "\n"


def render_junit(report: RunReport) -> str:
    """JUnit XML with one testcase per clause (valid for ``xml.etree`` and CI parsers)."""
    counts = report.counts()
    suite = ET.Element(
        "testsuite",
        {
            "name": "zmq-conformance",
            "tests": str(len(report.clauses)),
            "failures": str(sum(counts[v] for v in FAILING)),
            "errors": "0",
            "skipped": str(counts["skipped"] + counts["xfailed"]),
            "time": f"{sum(v.duration_s for v in report.clauses.values()):.3f}",
        },
    )
    props = ET.SubElement(suite, "properties")
    for name, value in (
        ("contract", report.contract),
        ("transport", report.transport),
        ("profile", report.profile),
        ("seed", "" if report.seed is None else str(report.seed)),
    ):
        ET.SubElement(props, "property", {"name": name, "value": value})
    for verdict in report.clauses.values():
        case = ET.SubElement(
            suite,
            "testcase",
            {
                "classname": f"zmq-conformance.{verdict.clause.family}",
                "name": f"{verdict.clause.id} {verdict.clause.title}",
                "time": f"{verdict.duration_s:.3f}",
            },
        )
        if verdict.verdict in FAILING:
            failure = ET.SubElement(
                case, "failure", {"type": verdict.verdict, "message": _first_line(verdict)}
            )
            failure.text = _failure_text(verdict)
        elif verdict.verdict in ("skipped", "xfailed"):
            message = verdict.reason or verdict.verdict
            if verdict.verdict == "xfailed":
                message = f"xfailed: {message}"
            ET.SubElement(case, "skipped", {"message": message})
        out = ET.SubElement(case, "system-out")
        out.text = _tests_text(verdict)
    _sanitize(suite)
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def render_markdown(report: RunReport) -> str:
    """A table a human reads at a glance, failures first, then their details."""
    counts = report.counts()
    summary = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    seed = "random" if report.seed is None else str(report.seed)
    lines = [
        "# zmq-conformance report",
        "",
        f"Contract `{report.contract}`, implementation `{report.transport}`, "
        f"profile `{report.profile}`, seed `{seed}`: "
        f"**{'FAIL' if report.failed else 'PASS'}** ({summary}).",
        "",
        "| Clause | Verdict | Title | Tests | Time |",
        "|---|---|---|---|---|",
    ]
    for verdict in report.ordered():
        tests = f"{len(verdict.tests)}" if verdict.tests else "-"
        title = verdict.clause.title + (" (chaos)" if verdict.clause.chaos else "")
        note = f" ({verdict.reason})" if verdict.reason and verdict.verdict == "skipped" else ""
        lines.append(
            f"| {verdict.clause.id} | {_VERDICT_LABEL[verdict.verdict]} | "
            f"{_cell(title + note)} | {tests} | {verdict.duration_s:.2f} s |"
        )
    failing = [v for v in report.ordered() if v.verdict in FAILING]
    if failing:
        lines += ["", "## Failures"]
    for verdict in failing:
        lines += [
            "",
            f"### {verdict.clause.id} {verdict.clause.title}: {verdict.verdict}",
            "",
            f"> {verdict.clause.requirement}",
            "",
        ]
        if verdict.reason:
            lines += [f"Reason: {verdict.reason}", ""]
        lines += [
            "Counterexample:",
            "",
            "```",
            (verdict.counterexample or "(none recorded)").replace("```", "'''"),
            "```",
            "",
        ]
        if verdict.replay:
            lines += ["Replay:", "", "```sh", verdict.replay]
            if verdict.replay_pytest:
                lines.append(verdict.replay_pytest)
            lines += ["```"]
    lines += _measurements(report)
    return "\n".join(lines) + "\n"


def _measurements(report: RunReport) -> list[str]:
    """What the tests measured (heartbeat detection times and the like), by clause."""
    rows = [
        f"| {verdict.clause.id} | `{test.nodeid.rsplit('::', 1)[-1]}` | "
        + _cell(", ".join(f"{k}={v}" for k, v in test.measurements.items()))
        + " |"
        for verdict in report.ordered()
        for test in verdict.tests
        if test.measurements
    ]
    if not rows:
        return []
    return ["", "## Measurements", "", "| Clause | Test | Measured |", "|---|---|---|", *rows]


def write_reports(
    report: RunReport,
    *,
    json_path: str | Path | None = None,
    junit_path: str | Path | None = None,
    markdown_path: str | Path | None = None,
) -> list[Path]:
    """Write the requested formats (parent directories are created); return the paths."""
    written: list[Path] = []
    for path, render in (
        (json_path, render_json),
        (junit_path, render_junit),
        (markdown_path, render_markdown),
    ):
        if path is None:
            continue
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(render(report), encoding="utf-8")
        written.append(target)
    return written


def _sanitize(element: ET.Element) -> None:
    for node in element.iter():
        if node.text:
            node.text = _XML_INVALID.sub("\ufffd", node.text)
        for key, value in node.attrib.items():
            node.attrib[key] = _XML_INVALID.sub("\ufffd", value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _first_line(verdict: ClauseVerdict) -> str:
    text = verdict.counterexample or verdict.reason or verdict.verdict
    for line in text.splitlines():
        if line.strip() and not line.startswith(("Falsifying", "Failing test case")):
            return line.strip()[:200]
    return verdict.verdict


def _failure_text(verdict: ClauseVerdict) -> str:
    parts = [verdict.clause.requirement]
    if verdict.reason:
        parts += ["", f"Reason: {verdict.reason}"]
    if verdict.counterexample:
        parts += ["", "Counterexample:", verdict.counterexample]
    if verdict.replay:
        parts += ["", "Replay:", verdict.replay]
    return "\n".join(parts)


def _tests_text(verdict: ClauseVerdict) -> str:
    if not verdict.tests:
        return verdict.reason or ""
    return "\n".join(f"{t.outcome:8} {t.duration_s:7.2f} s  {t.nodeid}" for t in verdict.tests)


def read_report(path: Path) -> RunReport | None:
    """The verdicts the plugin wrote to ``path``, reduced to what the exit status needs
    (``None`` when there is no readable report)."""
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    verdicts = {
        cid: ClauseVerdict(CLAUSES[cid], str(entry.get("verdict", "skipped")))
        for cid, entry in data.get("clauses", {}).items()
        if cid in CLAUSES
    }
    return RunReport(
        transport=str(data.get("transport")), profile=str(data.get("profile")),
        seed=data.get("seed"), clauses=verdicts,
        warnings=[str(w) for w in data.get("warnings", [])],
        contract=str(data.get("contract", contracts.DEFAULT_CONTRACT)),
        run_errors=[str(e) for e in data.get("run_errors", [])],
    )

