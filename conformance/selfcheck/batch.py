"""Several targeted self-check runs in one process: what a child costs to start, paid once.

A targeted run of a mutant (the tests of the clauses it targets, stopping at
the first failure) is short; started as ``zmq-conformance run`` it costs three
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
storage directory between runs), so a failure found for one mutant is never
replayed against another, and the same seed as a run of its own: a batched
run and a lone run draw the same examples.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from conformance.supervision import lifeline

__all__ = ["CLAIM", "DONE", "Job", "RunSettings", "claim", "main", "state"]

#: In a run's directory: the claiming driver's process id.
CLAIM: Final = "claim"
#: In a run's directory: exit status and seconds, written when the run is over.
DONE: Final = "done.json"
VERDICTS: Final = "verdicts.json"
LOG: Final = "output.log"


@dataclass(frozen=True)
class Job:
    """One targeted run: ``tag`` names its directory in the shared directory."""

    tag: str
    factory: str
    clauses: tuple[str, ...]


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

    started = time.monotonic()
    storage = os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY")
    for job in jobs:
        if budget_s is not None and time.monotonic() - started > budget_s:
            return
        if not claim(shared, job.tag):
            continue
        rundir = shared / job.tag
        if storage:
            shutil.rmtree(storage, ignore_errors=True)
        began = time.monotonic()
        with _output_to(rundir / LOG):
            try:
                code = _exit_status(int(pytest.main(pytest_args(job, settings, rundir))),
                                    rundir / VERDICTS)
            except Exception as exc:  # a broken option: this run is an error, not the next
                print(f"batch: {type(exc).__name__}: {exc}", flush=True)
                code = 3
        done = {"exit_code": code, "seconds": round(time.monotonic() - began, 3)}
        tmp = rundir / (DONE + ".tmp")
        tmp.write_text(json.dumps(done), encoding="utf-8")
        tmp.replace(rundir / DONE)


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
    data: dict[str, Any] = {
        "shared": str(shared),
        "budget_s": budget_s,
        "settings": {"profile": settings.profile, "seed": settings.seed,
                     "shrink_seconds": settings.shrink_seconds,
                     "contract": settings.contract, "run_args": list(settings.run_args)},
        "jobs": [{"tag": j.tag, "factory": j.factory, "clauses": list(j.clauses)}
                 for j in jobs],
    }
    path.write_text(json.dumps(data), encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m conformance.selfcheck.batch SPEC.json`` (written by :func:`write_spec`)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m conformance.selfcheck.batch SPEC.json", file=sys.stderr)
        return 2
    data = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    raw = data["settings"]
    settings = RunSettings(str(raw["profile"]), int(raw["seed"]), int(raw["shrink_seconds"]),
                           str(raw["contract"]), tuple(raw["run_args"]))
    jobs = [Job(str(j["tag"]), str(j["factory"]), tuple(j["clauses"])) for j in data["jobs"]]
    budget = data.get("budget_s")
    run_jobs(jobs, settings, Path(data["shared"]),
             budget_s=None if budget is None else float(budget))
    return 0


if __name__ == "__main__":
    sys.exit(main())
