"""Does the gate flake on the reference? ``python -m benchmarks stability``.

Two measurements, each written as JSON and Markdown to ``benchmarks/results/``:

* **Main jobs** (``--runs N``, default 30): ``N`` consecutive
  ``zmq-conformance run --chaos`` against the reference, each its own process
  with a fresh random Hypothesis seed, exactly as CI runs the main job. For
  every test and every clause: in how many runs it had a failing verdict
  (``failed``, ``flaky``, ``blocked``, ...), with the seed and first line of
  each failure so it can be replayed. Files ``stability-jobs.{json,md}``.
* **One test, many times** (``--test NODEID --runs N``): the test (all its
  parameters when NODEID names a function) runs ``N`` times in one pytest
  process (:mod:`benchmarks._repeat`), the suite's own reruns off, so each
  failure counts. Files ``stability-test.{json,md}``. E.g. the CONN-7
  flapping test: ``--test`` :data:`FLAPPING_TEST` ``--runs 500``.

A main job that exits with neither 0 nor 1, or writes no report, counts as
*broken* (the gate itself failed); its output tail is kept.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from benchmarks._stats import Spread

#: The CONN-7 flapping test (all three ways of dying).
FLAPPING_TEST: Final = (
    "conformance/contracts/p2p/suite/test_connections.py::test_flapping_peer_stays_reachable"
)
#: Verdicts and test outcomes that fail a run.
FAILING: Final = frozenset({"blocked", "crashed", "failed", "flaky", "xpassed"})
_ROOT = Path(__file__).resolve().parents[1]


def _main_job(index: int, chaos: bool, extra: Sequence[str], workdir: Path) -> dict[str, Any]:
    """One ``zmq-conformance run`` in its own process; what failed in it."""
    report = workdir / f"run-{index}.json"
    cmd = [sys.executable, "-m", "conformance.cli", "run", "-q", "--json", str(report)]
    if chaos:
        cmd.append("--chaos")
    cmd += list(extra)
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=_ROOT)
    wall = time.monotonic() - started
    job: dict[str, Any] = {"index": index, "exit": proc.returncode, "wall_s": round(wall, 1)}
    try:
        data = json.loads(report.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None
    if data is None or proc.returncode not in (0, 1):
        job["broken"] = True
        job["tail"] = _excerpt(proc.stdout + proc.stderr)
        return job
    job["seed"] = data.get("seed")
    job["failing_clauses"] = {
        cid: entry["verdict"] for cid, entry in data["clauses"].items()
        if entry["verdict"] in FAILING
    }
    failing_tests: dict[str, dict[str, Any]] = {}
    for entry in data["clauses"].values():
        for test in entry["tests"]:
            if test["outcome"] in FAILING:
                failing_tests[test["nodeid"]] = {
                    "outcome": test["outcome"],
                    "reason": test.get("reason"),
                    "error": _error_line(test.get("counterexample") or ""),
                    "runs": test.get("runs"),
                    "failed_runs": test.get("failed_runs"),
                }
    job["failing_tests"] = failing_tests
    job["tests"] = len({t["nodeid"] for e in data["clauses"].values() for t in e["tests"]})
    return job


def _excerpt(output: str) -> str:
    """What explains a broken job: a fatal error's header and stack (faulthandler
    prints the signal and the test in progress first), else the output's last
    lines; with this machine's paths shortened, so results can be committed."""
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if line.startswith(("Fatal Python error", "Thread 0x", "Current thread"))),
                 None)
    kept = lines[max(0, start - 5):start + 40] if start is not None else lines[-40:]
    text = "\n".join(kept)
    for prefix, short in ((str(_ROOT), "."), (sys.prefix, "<venv>"),
                          (tempfile.gettempdir(), "<tmp>")):
        text = text.replace(prefix, short)
    return text


def _error_line(counterexample: str) -> str:
    """The error of a counterexample: its first line that is not Hypothesis framing."""
    for line in counterexample.splitlines():
        if line.strip() and not line.startswith(("Falsifying", "Failing test case", "@", " ")):
            return line.strip()[:200]
    return counterexample.strip()[:200]


def run_jobs(
    runs: int, *, chaos: bool = True, extra: Sequence[str] = (),
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """``runs`` consecutive main jobs; failing verdicts per test and per clause."""
    jobs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="zmq-stability-") as tmp:
        for index in range(runs):
            job = _main_job(index, chaos, extra, Path(tmp))
            jobs.append(job)
            what = "BROKEN" if job.get("broken") else (
                ", ".join(f"{c}={v}" for c, v in job["failing_clauses"].items()) or "clean"
            )
            progress(f"main job {index + 1}/{runs}: exit {job['exit']}, "
                     f"{job['wall_s']:.0f} s, {what}")
    by_test: Counter[str] = Counter()
    by_clause: Counter[str] = Counter()
    for job in jobs:
        by_test.update(job.get("failing_tests", {}).keys())
        by_clause.update(job.get("failing_clauses", {}).keys())
    completed = [j for j in jobs if not j.get("broken")]
    return {
        "runs": runs,
        "chaos": chaos,
        "extra_args": list(extra),
        "completed": len(completed),
        "broken": runs - len(completed),
        "clean": sum(1 for j in completed if not j["failing_clauses"]),
        "failing_runs_by_test": dict(by_test.most_common()),
        "failing_runs_by_clause": dict(by_clause.most_common()),
        "wall_s": Spread.of([j["wall_s"] for j in jobs]).as_dict() if jobs else None,
        "jobs": jobs,
    }


def run_test(
    nodeids: Sequence[str], runs: int, *, extra: Sequence[str] = (),
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Each test in ``nodeids`` ``runs`` times in one pytest process."""
    with tempfile.TemporaryDirectory(prefix="zmq-stability-") as tmp:
        out = Path(tmp) / "tally.json"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "-p", "benchmarks._repeat", "--stability-repeat", str(runs),
               "--stability-out", str(out), "--zmq-conformance-only", "--zmq-reruns", "0",
               *extra, *nodeids]
        started = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=_ROOT)
        wall = time.monotonic() - started
        try:
            tally: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode} without a tally:\n"
                               f"{(proc.stdout + proc.stderr)[-3000:]}") from None
    for nodeid, entry in tally.items():
        progress(f"{nodeid}: {entry['failures']} failures in {entry['runs']} runs")
    return {"tests": list(nodeids), "runs_each": runs, "wall_s": round(wall, 1),
            "exit": proc.returncode, "by_test": tally}


# -- rendering ---------------------------------------------------------------


def markdown_jobs(result: dict[str, Any]) -> str:
    chaos = " --chaos" if result["chaos"] else ""
    wall = result["wall_s"]
    lines = [
        "# Stability: consecutive main jobs on the reference",
        "",
        f"{result['runs']} runs of `zmq-conformance run{chaos}` (fresh seed each): "
        f"{result['clean']} clean, {result['completed'] - result['clean']} with a failing "
        f"verdict, {result['broken']} broken."
        + (f" Wall time per job {wall['median']:.0f} s ({wall['min']:.0f}-{wall['max']:.0f})."
           if wall else ""),
        "",
        "| Test | Runs with a failing verdict |",
        "|---|---|",
    ]
    if not result["failing_runs_by_test"]:
        lines.append(f"| (none) | 0 / {result['completed']} |")
    for nodeid, count in result["failing_runs_by_test"].items():
        lines.append(f"| `{nodeid.rsplit('/', 1)[-1]}` | {count} / {result['completed']} |")
    lines += ["", "| Clause | Runs with a failing verdict |", "|---|---|"]
    if not result["failing_runs_by_clause"]:
        lines.append(f"| (none) | 0 / {result['completed']} |")
    for cid, count in result["failing_runs_by_clause"].items():
        lines.append(f"| {cid} | {count} / {result['completed']} |")
    failures = [(j, n, t) for j in result["jobs"] for n, t in j.get("failing_tests", {}).items()]
    if failures:
        lines += ["", "| Run | Seed | Test | Outcome | Detail |", "|---|---|---|---|---|"]
        for job, nodeid, test in failures:
            tally = (f"failed {test['failed_runs']} of {test['runs']} runs: "
                     if test.get("runs") else "")
            detail = (tally + (test["error"] or test["reason"] or "")).replace("|", "/")
            lines.append(f"| {job['index'] + 1} | {job.get('seed')} | "
                         f"`{nodeid.rsplit('::', 1)[-1]}` | {test['outcome']} | {detail} |")
    broken = [j for j in result["jobs"] if j.get("broken")]
    for job in broken:
        lines += ["", f"Run {job['index'] + 1} broke (exit {job['exit']}):", "", "```",
                  job.get("tail", "").replace("```", "'''"), "```"]
    return "\n".join(lines) + "\n"


def markdown_test(result: dict[str, Any]) -> str:
    lines = [
        "# Stability: one test, many times",
        "",
        f"Each test {result['runs_each']} times in one pytest process (suite reruns off); "
        f"wall time {result['wall_s']:.0f} s.",
        "",
        "| Test | Failures | Runs | Seconds | Errors |",
        "|---|---|---|---|---|",
    ]
    for nodeid, entry in result["by_test"].items():
        errors = "; ".join(f"{n}x {e}" for e, n in entry["errors"].items()).replace("|", "/")
        lines.append(f"| `{nodeid.rsplit('::', 1)[-1]}` | {entry['failures']} | "
                     f"{entry['runs']} | {entry['seconds']:.1f} | {errors or '-'} |")
    return "\n".join(lines) + "\n"


# -- command line --------------------------------------------------------------


def _progress(line: str) -> None:
    print(f"  .. {line}", file=sys.stderr, flush=True)



def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks stability", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=None, metavar="N",
                        help="main jobs (default 30), or repetitions of --test (default 500)")
    parser.add_argument("--test", action="append", default=[], metavar="NODEID",
                        help=f"repeat this test instead of main jobs (repeatable), e.g. "
                             f"{FLAPPING_TEST}")
    parser.add_argument("--no-chaos", action="store_true",
                        help="main jobs without --chaos")
    parser.add_argument("--out", type=Path, default=_ROOT / "benchmarks" / "results",
                        help="directory for the JSON and Markdown results")
    parser.add_argument("extra", nargs=argparse.REMAINDER,
                        help="after '--': extra arguments for each zmq-conformance run "
                             "(main jobs) or pytest (--test)")
    args = parser.parse_args(argv)
    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    runs = args.runs if args.runs is not None else (500 if args.test else 30)
    if runs < 1:
        parser.error("--runs must be at least 1")
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if args.test:
        result = run_test(args.test, runs, extra=extra, progress=_progress)
        stem, markdown = "stability-test", markdown_test
    else:
        result = run_jobs(runs, chaos=not args.no_chaos, extra=extra, progress=_progress)
        stem, markdown = "stability-jobs", markdown_jobs
    result["started"] = stamp
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(result)
    (args.out / f"{stem}.md").write_text(text)
    print(text)
    print(f"json: {args.out / (stem + '.json')}")
    return 0
