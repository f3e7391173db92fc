"""Many mutants in few processes: the one batching mechanism of self-check, for every family.

A batch is a list of :class:`Job` (a mutant: its factory, its target clauses,
optionally the only test functions to run) and one :class:`RunSettings` (the
options of a lone run: profile, seed, shrink budget, contract, extra
arguments), written to a spec file by :func:`write_spec`. Batches are shared
through a directory by *claims* (below), and run in one of two ways:

- **a driver, one session per job** (:func:`run_jobs`,
  ``python -m conformance.selfcheck.batch SPEC``): each job is exactly the
  targeted run ``zmq-conformance run`` would make, with its verdicts
  (``self-check``);
- **one session for all jobs** (:func:`run_together`, the in-session plugin
  :mod:`conformance.selfcheck.batch_session`): the suite's tests are
  parametrized over the jobs and each job stops at its first failure; cheaper
  still, for the project's per-mutant tests of a family's catalog.

Why a driver: a targeted run of a mutant (the tests of the clauses it
targets, stopping at the first failure) is short; started as ``zmq-conformance run`` it costs three
interpreters (the CLI, pytest, an xdist worker) that import pytest,
Hypothesis, pyzmq and the suite before the first test. A *batch driver*
(``python -m conformance.selfcheck.batch SPEC``) imports all that once and
runs one pytest session per mutant, one after another, with the options the
CLI would give it, without workers (``-n 0``).

Only mutants whose defect stays inside the calls of their own tests share a
driver (:attr:`Mutant.isolate` false): one that hangs, aborts, leaks a
context or spins would take the driver down with it, and with it the verdicts
of the mutants after it. Those run alone, under the CLI's supervision.

Drivers share a directory (``shared``) with one sub-directory per run. A
driver *claims* a run by creating its directory (atomic), immediately before
running it, so several drivers (self-check's ``-n``, or the project's tests
on several xdist workers) split a list of runs between them with no run done
twice, and a caller that wants one result waits at most for the run in
progress. A run is finished when its ``done.json`` exists; a claimed run
without it whose driver is gone was *lost* (the driver died in it: the
stall deadline or a crash), and the caller runs that mutant alone.

Each session gets a fresh Hypothesis database (the driver empties its
storage directory between runs, all but Hypothesis's Unicode tables), so a
failure found for one mutant is never replayed against another, and the
same seed as a run of its own: a batched run and a lone run draw the same
examples.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from conformance.supervision import lifeline

__all__ = [
    "CLAIM", "DONE", "RESULTS", "Job", "RunSettings", "claim", "finish", "main", "read_spec",
    "run_jobs", "run_together", "state", "write_spec",
]

#: In a run's directory: the claiming driver's process id.
CLAIM: Final = "claim"
#: In a run's directory: exit status and seconds, written when the run is over.
DONE: Final = "done.json"
VERDICTS: Final = "verdicts.json"
LOG: Final = "output.log"
#: In the run directory of a batch run together: each job's test outcomes.
RESULTS: Final = "results.json"
#: The options of :mod:`conformance.selfcheck.batch_session`: the spec, and its report.
SESSION_OPTION: Final = "--selfcheck-batch"
SESSION_REPORT_OPTION: Final = "--selfcheck-batch-report"
#: A batch run together is killed after this long (seconds); its jobs then have no report.
TOGETHER_LIMIT_S: Final = 300


@dataclass(frozen=True)
class Job:
    """One targeted run: ``tag`` names its directory in the shared directory."""

    tag: str
    factory: str
    clauses: tuple[str, ...]
    #: Only these test functions of the clauses' tests (empty: all of them); honoured
    #: by :func:`run_together`.
    tests: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunSettings:
    """What every run of a driver shares (the CLI options of a lone run)."""

    profile: str
    seed: int
    shrink_seconds: int
    contract: str
    run_args: tuple[str, ...] = ()


def claim(shared: Path, tag: str) -> bool:
    """Claim run ``tag`` for this process; False when someone has it already."""
    rundir = shared / tag
    try:
        rundir.mkdir(parents=False)
    except FileExistsError:
        return False
    (rundir / CLAIM).write_text(str(os.getpid()), encoding="utf-8")
    return True


def finish(rundir: Path, done: dict[str, Any]) -> None:
    """Mark the claimed run in ``rundir`` finished (atomically: a reader never sees half)."""
    tmp = rundir / (DONE + ".tmp")
    tmp.write_text(json.dumps(done), encoding="utf-8")
    tmp.replace(rundir / DONE)


def state(shared: Path, tag: str) -> str:
    """``"unclaimed"``, ``"running"``, ``"done"`` or ``"lost"`` (claimed by a process
    that is gone without finishing it)."""
    rundir = shared / tag
    if (rundir / DONE).exists():
        return "done"
    if not rundir.exists():
        return "unclaimed"
    try:
        pid = int((rundir / CLAIM).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "running"  # claimed a moment ago; the id follows
    if lifeline.process_alive(pid):
        return "running"
    return "done" if (rundir / DONE).exists() else "lost"


def pytest_args(job: Job, settings: RunSettings, rundir: Path) -> list[str]:
    """The pytest arguments ``zmq-conformance run`` gives a lone targeted run, without
    workers (the CLI's own translation, so both stay the same)."""
    from conformance.config import run_args
    from conformance.selfcheck import clause_filter

    argv = ["run", "--transport", job.factory, "--json", str(rundir / VERDICTS),
            "--profile", settings.profile, "--hypothesis-seed", str(settings.seed), "-q",
            "--contract", settings.contract, "-n", "0", "--reruns", "0", *settings.run_args]
    args, _json, cleanup = run_args.pytest_args(run_args.parse_run(argv[1:]))
    assert cleanup is None  # --json is given
    # The package (this module's) was imported before pytest could rewrite its asserts;
    # the modules the suite needs (the harness) are imported in the session, rewritten.
    args += ["-W", "ignore::pytest.PytestAssertRewriteWarning",
             "-p", "conformance.selfcheck.clause_filter", "-p", "no:cacheprovider",
             clause_filter.SHRINK_OPTION, str(settings.shrink_seconds), "-x"]
    for clause in job.clauses:
        args += [clause_filter.OPTION, clause]
    return args


def run_jobs(jobs: Sequence[Job], settings: RunSettings, shared: Path, *,
             budget_s: float | None = None) -> None:
    """Claim and run ``jobs`` in order, skipping those claimed by others; stop claiming
    once ``budget_s`` seconds have passed."""
    import pytest

    from conformance.config import hypothesis_warmup

    started = time.monotonic()
    storage = os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY")
    for job in jobs:
        if budget_s is not None and time.monotonic() - started > budget_s:
            return
        if not claim(shared, job.tag):
            continue
        rundir = shared / job.tag
        if storage:
            hypothesis_warmup.reset_storage(Path(storage))
        began = time.monotonic()
        with _output_to(rundir / LOG):
            try:
                code = _exit_status(int(pytest.main(pytest_args(job, settings, rundir))),
                                    rundir / VERDICTS)
            except Exception as exc:  # a broken option: this run is an error, not the next
                print(f"batch: {type(exc).__name__}: {exc}", flush=True)
                code = 3
        finish(rundir, {"exit_code": code, "seconds": round(time.monotonic() - began, 3)})


def _exit_status(pytest_status: int, verdicts: Path) -> int:
    """The exit status ``zmq-conformance run`` would give (from the verdicts)."""
    from conformance.reporting.reports import read_report
    from conformance.reporting.verdicts import exit_status

    return exit_status(read_report(verdicts), pytest_status)


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """Point this process's stdout and stderr (the descriptors, so faulthandler and
    libzmq's messages too) at ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with path.open("w", encoding="utf-8") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def write_spec(path: Path, jobs: Sequence[Job], settings: RunSettings, shared: Path,
               budget_s: float | None) -> None:
    """The spec of a batch, read by the driver and the in-session plugin (:func:`read_spec`)."""
    data: dict[str, Any] = {
        "shared": str(shared),
        "budget_s": budget_s,
        "settings": {"profile": settings.profile, "seed": settings.seed,
                     "shrink_seconds": settings.shrink_seconds,
                     "contract": settings.contract, "run_args": list(settings.run_args)},
        "jobs": [{"tag": j.tag, "factory": j.factory, "clauses": list(j.clauses),
                  "tests": list(j.tests)}
                 for j in jobs],
    }
    path.write_text(json.dumps(data), encoding="utf-8")


def read_spec(path: Path) -> tuple[list[Job], RunSettings, Path, float | None]:
    """The jobs, settings, shared directory and budget :func:`write_spec` wrote."""
    data = json.loads(path.read_text(encoding="utf-8"))
    raw = data["settings"]
    settings = RunSettings(str(raw["profile"]), int(raw["seed"]), int(raw["shrink_seconds"]),
                           str(raw["contract"]), tuple(raw["run_args"]))
    jobs = [Job(str(j["tag"]), str(j["factory"]), tuple(j["clauses"]),
                tuple(j.get("tests", ()))) for j in data["jobs"]]
    budget = data.get("budget_s")
    return jobs, settings, Path(data["shared"]), None if budget is None else float(budget)


def run_together(tag: str, jobs: Sequence[Job], settings: RunSettings, shared: Path, *,
                 suite: Path) -> dict[str, Any]:
    """The outcomes of ``jobs`` run in one pytest session of ``suite``, under ``tag``.

    The run is claimed like any other (:func:`claim`): the first caller runs it
    and the others wait for its ``done.json``; a run lost with its caller is
    run again by the next one, outside the shared directory. Returns
    ``{"results": {job: [outcome, ...]}, "output": text}``, where an outcome
    is ``{"test", "when", "outcome", "text"}`` (``crashed`` when the session's
    process died by a signal in that test).
    """
    shared.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + 2 * TOGETHER_LIMIT_S
    while time.monotonic() < deadline:
        where = state(shared, tag)
        if where == "done":
            data: dict[str, Any] = json.loads((shared / tag / RESULTS).read_text())
            return data
        if where == "lost":
            break
        if where == "unclaimed" and claim(shared, tag):
            rundir = shared / tag
            began = time.monotonic()
            _together(jobs, settings, suite, rundir)
            finish(rundir, {"exit_code": None, "seconds": round(time.monotonic() - began, 3)})
            continue
        time.sleep(0.05)
    with tempfile.TemporaryDirectory(prefix="zmq-selfcheck-") as private:
        _together(jobs, settings, suite, Path(private))
        lost: dict[str, Any] = json.loads((Path(private) / RESULTS).read_text())
        return lost


def _together(jobs: Sequence[Job], settings: RunSettings, suite: Path, rundir: Path) -> None:
    """One pytest child over ``suite`` with :mod:`conformance.selfcheck.batch_session`;
    its report goes to ``rundir``/:data:`RESULTS`."""
    from conformance.selfcheck import clause_filter

    spec = rundir / "spec.json"
    write_spec(spec, jobs, settings, rundir, None)
    partial = rundir / "session.json"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "--zmq-contract", settings.contract, "--zmq-profile", settings.profile,
               "--zmq-reruns", "0", "--hypothesis-seed", str(settings.seed),
               "-p", "conformance.selfcheck.clause_filter", clause_filter.SHRINK_OPTION,
               str(settings.shrink_seconds),
               "-p", "conformance.selfcheck.batch_session", SESSION_OPTION, str(spec),
               SESSION_REPORT_OPTION, str(partial), *settings.run_args,
               "--rootdir", str(suite), str(suite)]
    returncode: int | None = None
    try:
        proc = subprocess.run(command, capture_output=True, text=True,
                              timeout=TOGETHER_LIMIT_S, check=False)
        output = proc.stdout[-6000:] + proc.stderr[-2000:]
        returncode = proc.returncode
    except subprocess.TimeoutExpired as exc:  # killed: its jobs get no report
        output = f"the batch's pytest child did not finish in {TOGETHER_LIMIT_S} s: {exc}"
    data = json.loads(partial.read_text()) if partial.exists() else {}
    found: dict[str, list[dict[str, str]]] = data.get("results", {})
    running = data.get("running")
    if running and returncode is not None and returncode < 0:
        # The process died by a signal inside this test: a "crashed" verdict of its clauses.
        found.setdefault(running["mutant"], []).append({
            "test": running["test"], "when": "call", "outcome": "crashed",
            "text": f"{', '.join(running['clauses'])}: the test process died by signal "
                    f"{-returncode} during {running['test']} (crashed)"})
    tmp = rundir / (RESULTS + ".tmp")
    tmp.write_text(json.dumps({"results": found, "output": output}))
    tmp.replace(rundir / RESULTS)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m conformance.selfcheck.batch SPEC.json`` (written by :func:`write_spec`)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m conformance.selfcheck.batch SPEC.json", file=sys.stderr)
        return 2
    jobs, settings, shared, budget = read_spec(Path(args[0]))
    run_jobs(jobs, settings, shared, budget_s=budget)
    return 0


if __name__ == "__main__":
    sys.exit(main())
