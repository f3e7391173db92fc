"""``zmq-conformance self-check``: run the suite against every mutant; print the kill matrix.

For each selected mutant the suite runs in a child process
(``python -m conformance.cli run --transport <mutant> ...``), first limited to
the tests of the clauses the mutant targets (the
:mod:`~conformance.selfcheck.clause_filter` plugin), and, only when that run
does not kill it, once more over the whole suite. A mutant is *killed* when a
clause's verdict is ``failed``, ``flaky`` or ``blocked`` (a call hung and the
watchdog caught it). Each distinct base transport (the reference, for the
built-in catalog) runs the whole suite as a *control* and must not fail
anything.

Re-runs: mutant runs pass ``--reruns 0``. A mutant's failure is a kill
whether it reproduces or not, so re-running it would only add time (each
re-run of a failing test can wait out a harness deadline). Control runs keep
the default re-runs: should a control fail, the report tells a race in the
base transport (``flaky``) from a deterministic defect (``failed``).

Runs are independent processes, ``-n`` at a time (default 2). The targeted
runs of mutants that do not need a process of their own (``isolate`` false;
not with ``--chaos``) share *batch drivers* (:mod:`conformance.selfcheck.batch`),
one pytest session per mutant in one process, which saves the start-up of a
run per mutant; a mutant whose run took its driver down runs again alone.
Each run gets its own Hypothesis database (``HYPOTHESIS_STORAGE_DIRECTORY``) so a failure found
for one mutant is never replayed against another (only Hypothesis's Unicode tables, built once,
are copied into each: :mod:`conformance.config.hypothesis_warmup`), and the same Hypothesis
seed (``--seed``) so a kill matrix is reproducible.

Exit status: 0 every mutant killed and every control clean; 1 a mutant
survived, a control failed, or a run hung or broke; 2 usage or configuration
error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from conformance import contracts
from conformance.config import hypothesis_warmup, profiles
from conformance.contracts import CLAUSES
from conformance.errors import ConfigError
from conformance.reporting import github
from conformance.selfcheck import batch, clause_filter
from conformance.selfcheck.mutants import Mutant, load_catalog
from conformance.supervision import lifeline

__all__ = [
    "ControlResult",
    "MutantResult",
    "SuiteRun",
    "build_parser",
    "counterexample_steps",
    "main",
    "run_selfcheck",
    "targeted_run",
]

PROG = "zmq-conformance self-check"

#: Verdicts that count as a kill (``xpassed`` only happens with an xfail file
#: and says nothing about the mutant's defect).
KILLING: Final = frozenset({"failed", "flaky", "blocked", "crashed"})
#: Verdicts a control run may show.
CLEAN: Final = frozenset({"passed", "skipped", "xfailed"})

DEFAULT_SEED: Final = 20261129
DEFAULT_RUN_TIMEOUT_S: Final = 900.0
DEFAULT_SHRINK_S: Final = 10
_STEP = re.compile(r"^\s*state\.(\w+)\(")
_PROJECT_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class SuiteRun:
    """One child run of the suite and what its verdicts say."""

    status: str  # "ok", "failed", "error", "timeout", "empty"
    seconds: float
    verdicts: dict[str, str] = field(default_factory=dict)
    counterexamples: dict[str, str | None] = field(default_factory=dict)
    exit_code: int | None = None
    log_tail: str = ""

    @property
    def killing(self) -> list[str]:
        return [c for c, v in self.verdicts.items() if v in KILLING]

    @property
    def unclean(self) -> list[str]:
        return [c for c, v in self.verdicts.items() if v not in CLEAN]


@dataclass
class MutantResult:
    mutant: Mutant
    status: str  # "killed", "survived", "error", "hung"
    clauses: list[str]
    seconds: float
    counterexample_steps: int | None
    stage: str | None  # "targeted" or "full"
    detail: str = ""

    @property
    def killed(self) -> bool:
        return self.status == "killed"

    def to_json(self) -> dict[str, Any]:
        return {
            "killed": self.killed,
            "clauses": self.clauses,
            "seconds": round(self.seconds, 2),
            "counterexample_steps": self.counterexample_steps,
            "status": self.status,
            "stage": self.stage,
            "targets": list(self.mutant.clauses),
            "models": self.mutant.models,
            "chaos": self.mutant.chaos,
            "factory": self.mutant.factory,
            "detail": self.detail,
        }


@dataclass
class ControlResult:
    factory: str
    passed: bool
    status: str
    failing: list[str]
    seconds: float
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "status": self.status,
            "failing_clauses": self.failing,
            "seconds": round(self.seconds, 2),
            "detail": self.detail,
        }


@dataclass(frozen=True)
class _Config:
    profile: str
    seed: int
    chaos: bool
    run_timeout: float
    shrink_seconds: int
    run_args: tuple[str, ...]
    workdir: Path
    contract: str = contracts.DEFAULT_CONTRACT
    #: Where the runs cache compiled bytecode (``PYTHONPYCACHEPREFIX``), shared by
    #: all of them; ``None``: as the environment says.
    pycache: Path | None = None
    #: A Hypothesis storage directory holding the Unicode tables, built once and
    #: copied into each run's own (:mod:`conformance.config.hypothesis_warmup`);
    #: ``None``: each run builds them.
    tables: Path | None = None


def counterexample_steps(text: str | None) -> int:
    """Steps of a shrunk Hypothesis counterexample: ``state.<rule>(...)`` lines of a
    stateful one (``teardown`` excluded); 1 for anything else (a single example, or
    a plain failure)."""
    if not text:
        return 1
    steps = [line for line in text.splitlines()
             if (m := _STEP.match(line)) is not None and m.group(1) != "teardown"]
    return len(steps) or 1


def _child_env(storage: Path, pycache: Path | None = None) -> dict[str, str]:
    """The environment of a run: its own Hypothesis database, the project importable,
    and (``pycache``) a bytecode cache shared by the runs.

    Every run is a pytest process (and an xdist worker) that imports and
    assertion-rewrites the same modules, Hypothesis's among them (pytest
    rewrites the modules of every plugin's distribution); where bytecode is
    not written (``PYTHONDONTWRITEBYTECODE``), each one redoes that, about
    half a second per process. A cache under ``pycache`` (the self-check's
    scratch directory) is written once and read by the runs after, and
    nothing lands next to the sources.
    """
    env = dict(os.environ)
    env["HYPOTHESIS_STORAGE_DIRECTORY"] = str(storage)
    if pycache is not None:
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(_PROJECT_ROOT) + (os.pathsep + path if path else "")
    env.pop("PYTEST_ADDOPTS", None)
    # A mutant's failures are the expected result: they must not become annotations
    # or step-summary reports of the user's CI job.
    for name in (github.ENV_ACTIONS, github.ENV_SUMMARY):
        env.pop(name, None)
    return env


def _storage(path: Path, config: _Config) -> Path:
    """A run's own Hypothesis storage directory ``path``, holding a copy of the shared
    Unicode tables (seconds of CPU per process to build) but no example database."""
    hypothesis_warmup.seed_tables(path, config.tables)
    return path


def run_suite(factory: str, clauses: Sequence[str] | None, config: _Config, *, tag: str,
              stop_at_first_failure: bool, reruns: int | None = None,
              rundir: Path | None = None) -> SuiteRun:
    """Run the suite against ``factory`` in a child process; ``clauses=None``: all of it.

    ``reruns`` is passed as ``--reruns`` (``None``: the suite's default).
    ``rundir``: where the run's verdicts and output go (default: a new
    directory in the work directory).
    """
    if rundir is None:
        rundir = Path(tempfile.mkdtemp(prefix=f"{tag}-", dir=config.workdir))
    json_path = rundir / "verdicts.json"
    command = [
        sys.executable, "-m", "conformance.cli", "run",
        "--transport", factory, "--json", str(json_path),
        "--profile", config.profile, "--hypothesis-seed", str(config.seed), "-q",
        "--contract", config.contract,
        "-n", "1",  # one worker: runs go side by side; a crash or hang still costs one test
    ]
    if config.chaos:
        command.append("--chaos")
    if reruns is not None:
        command += ["--reruns", str(reruns)]
    command += [*config.run_args, "--", "-p", "conformance.selfcheck.clause_filter",
                "-p", "no:cacheprovider"]
    command += [clause_filter.SHRINK_OPTION, str(config.shrink_seconds)]
    for clause in clauses or ():
        command += [clause_filter.OPTION, clause]
    if stop_at_first_failure:
        command.append("-x")
    log_path = rundir / "output.log"
    started = time.monotonic()
    with log_path.open("w", encoding="utf-8") as log:
        try:
            # The job's thread waits for the run, so the run (and, through the
            # CLI's own supervision, everything it starts) dies with self-check.
            proc = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False,
                                  env=_child_env(_storage(rundir / "hypothesis", config),
                                                 config.pycache),
                                  timeout=config.run_timeout,
                                  preexec_fn=lifeline.preexec(thread_outlives_child=True))
            code: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            code = None
    seconds = time.monotonic() - started
    tail = _tail(log_path)
    if code is None:
        return SuiteRun("timeout", seconds, log_tail=tail)
    return _suite_run(json_path, code, seconds, tail)


def _suite_run(json_path: Path, code: int, seconds: float, tail: str) -> SuiteRun:
    """What a finished run's verdicts (``json_path``) and exit status say."""
    try:
        data = json.loads(json_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None
    if data is None:
        return SuiteRun("error", seconds, exit_code=code, log_tail=tail)
    entries: dict[str, Any] = data.get("clauses", {})
    verdicts = {cid: str(e.get("verdict")) for cid, e in entries.items()}
    examples = {cid: e.get("counterexample") for cid, e in entries.items()}
    ran = any(e.get("tests") for e in entries.values())
    if code not in (0, 1):
        status = "empty" if not ran else "error"
    elif not ran:
        status = "empty"
    else:
        status = "failed" if any(v not in CLEAN for v in verdicts.values()) else "ok"
    return SuiteRun(status, seconds, verdicts, examples, code, tail)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _targets(mutant: Mutant, chaos: bool) -> list[str]:
    return [c for c in mutant.clauses if chaos or not CLAUSES[c].chaos]


def _batches(mutant: Mutant, config: _Config) -> bool:
    return not mutant.isolate and not config.chaos and not _is_control(mutant)


def _is_control(entry: Mutant) -> bool:
    """An entry whose factory is its own base is no mutant: a control, whose run must
    pass every target clause (so it runs them all, with the suite's re-runs)."""
    return entry.factory == entry.base


def _stage_run(entry: Mutant, config: _Config, rundir: Path | None = None) -> SuiteRun:
    """The targeted run of ``entry`` under the CLI: a mutant's stops at its first
    failure and never re-runs (a kill is a kill); a control's runs everything."""
    if _is_control(entry):
        return run_suite(entry.factory, _targets(entry, config.chaos), config,
                         tag=f"{entry.name}-targeted", stop_at_first_failure=False,
                         rundir=rundir)
    return run_suite(entry.factory, _targets(entry, config.chaos), config,
                     tag=f"{entry.name}-targeted", stop_at_first_failure=True, reruns=0,
                     rundir=rundir)


def _run_batch(mutants: Sequence[Mutant], config: _Config, shared: Path,
               budget_s: float | None) -> None:
    """One batch driver over ``mutants`` (claiming each just before it runs it)."""
    name = uuid.uuid4().hex[:12]
    spec = shared / f".batch-{name}.json"
    jobs = [batch.Job(m.name, m.factory, tuple(_targets(m, False))) for m in mutants]
    settings = batch.RunSettings(config.profile, config.seed, config.shrink_seconds,
                                 config.contract, config.run_args)
    batch.write_spec(spec, jobs, settings, shared, budget_s)
    command = [sys.executable, "-m", "conformance.selfcheck.batch", str(spec)]
    # Each run bounded as a lone run is; with a budget, only the last starts after it.
    limit = config.run_timeout + (config.run_timeout * (len(jobs) - 1) if budget_s is None
                                  else budget_s)
    log_path = shared / f".batch-{name}.log"
    with log_path.open("w", encoding="utf-8") as log, \
            contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False,
                       env=_child_env(_storage(shared / f".hypothesis-{name}", config),
                                      config.pycache),
                       timeout=limit,
                       preexec_fn=lifeline.preexec(thread_outlives_child=True))


def _run_alone(mutant: Mutant, config: _Config, shared: Path) -> None:
    """The targeted run of ``mutant`` (claimed by the caller) under the CLI, its result
    left in ``shared`` as a batch driver leaves its runs."""
    rundir = shared / mutant.name
    run = _stage_run(mutant, config, rundir)
    batch.finish(rundir, {"exit_code": run.exit_code, "seconds": round(run.seconds, 3),
                          "timeout": run.status == "timeout"})


def _read_run(shared: Path, mutant: Mutant) -> SuiteRun:
    rundir = shared / mutant.name
    done = json.loads((rundir / batch.DONE).read_text(encoding="utf-8"))
    tail = _tail(rundir / batch.LOG)
    if done.get("timeout"):
        return SuiteRun("timeout", float(done["seconds"]), log_tail=tail)
    code = done.get("exit_code")
    return _suite_run(rundir / batch.VERDICTS, -1 if code is None else int(code),
                      float(done["seconds"]), tail)


def _lane(order: Sequence[Mutant], config: _Config, shared: Path,
          budget_s: float | None, skip: int = 0) -> None:
    """Work through ``order``'s unclaimed targeted runs until ``budget_s`` has passed: a
    mutant that needs a process of its own alone under the CLI; the others in a batch
    driver, which goes on with the batchable mutants after it. The first pick skips
    ``skip`` unclaimed runs (lanes started together start on different runs)."""
    started = time.monotonic()

    def left() -> float | None:
        return None if budget_s is None else budget_s - (time.monotonic() - started)

    while (remaining := left()) is None or remaining > 0:
        pending = [m for m in order if batch.state(shared, m.name) == "unclaimed"]
        if not pending:
            return
        first = pending[min(skip, len(pending) - 1)]
        skip = 0
        if _batches(first, config):
            _run_batch([m for m in pending if _batches(m, config)], config, shared, remaining)
            if batch.state(shared, first.name) != "unclaimed":
                continue
            # The driver never got to its first run (it could not start): alone.
        if batch.claim(shared, first.name):
            _run_alone(first, config, shared)


def targeted_run(mutant: Mutant, config: _Config, shared: Path, *,
                 others: Sequence[Mutant] = (), budget_s: float | None = None,
                 lanes: int = 1) -> SuiteRun:
    """The run of ``mutant``'s target clauses (stopping at the first failure, no re-runs).

    Runs are shared through ``shared`` (see :mod:`conformance.selfcheck.batch`):
    when no one has claimed ``mutant``'s run yet, this call starts ``lanes``
    lanes over ``mutant`` then ``others``, which go on claiming runs until
    ``budget_s`` has passed (each run started is finished); when someone
    has, it waits for that run. A mutant that needs no process of its own runs
    in a batch driver; the others, and a run lost with its driver, run alone
    under the CLI. An entry whose factory is its base is a control (see
    :func:`_is_control`).
    """
    shared.mkdir(parents=True, exist_ok=True)
    order = [mutant, *(m for m in others if m is not mutant)]
    deadline = time.monotonic() + config.run_timeout * 2 + (budget_s or 0.0)
    started_own = False
    while time.monotonic() < deadline:
        where = batch.state(shared, mutant.name)
        if where == "done":
            return _read_run(shared, mutant)
        if where == "lost" or (where == "unclaimed" and started_own):
            break
        if where == "unclaimed":
            started_own = True
            with ThreadPoolExecutor(max_workers=max(1, lanes)) as pool:
                for future in [pool.submit(_lane, order, config, shared, budget_s, lane)
                               for lane in range(max(1, lanes))]:
                    future.result()
        else:
            time.sleep(0.05)
    # Lost with its driver (or never started): alone, outside the shared directory.
    return _stage_run(mutant, config)


def check_mutant(mutant: Mutant, config: _Config,
                 targeted: SuiteRun | None = None) -> MutantResult:
    """Targeted run first; the whole suite only if the targeted run does not kill.

    ``targeted``: the targeted run, already done (by a batch driver).
    """
    total = 0.0
    notes: list[str] = []
    for stage, clauses in (("targeted", _targets(mutant, config.chaos)), ("full", None)):
        if stage == "targeted" and targeted is not None:
            run = targeted
        else:
            run = run_suite(mutant.factory, clauses, config, tag=f"{mutant.name}-{stage}",
                            stop_at_first_failure=True, reruns=0)
        total += run.seconds
        if run.status == "timeout":
            return MutantResult(mutant, "hung", [], total, None, stage,
                                f"{stage} run exceeded {config.run_timeout:.0f} s (no watchdog "
                                f"verdict): {run.log_tail[-600:]}")
        killing = run.killing
        if killing:
            steps = min(counterexample_steps(run.counterexamples.get(c)) for c in killing)
            return MutantResult(mutant, "killed", sorted(killing), total, steps, stage,
                                "; ".join(notes))
        if run.status == "error":
            return MutantResult(mutant, "error", [], total, None, stage,
                                f"{stage} run broke (exit {run.exit_code}): "
                                f"{run.log_tail[-600:]}")
        if run.status == "empty":
            notes.append(f"no test selected for {', '.join(clauses or ['the suite'])}")
        elif run.unclean:
            notes.append(f"{stage}: non-killing verdicts " + ", ".join(
                f"{c}={run.verdicts[c]}" for c in run.unclean))
    return MutantResult(mutant, "survived", [], total, None, None, "; ".join(notes))


def check_control(factory: str, config: _Config) -> ControlResult:
    run = run_suite(factory, None, config, tag="control", stop_at_first_failure=False)
    if run.status == "timeout":
        return ControlResult(factory, False, "hung", [], run.seconds, run.log_tail[-600:])
    if run.status in ("error", "empty"):
        return ControlResult(factory, False, run.status, [], run.seconds,
                             f"exit {run.exit_code}: {run.log_tail[-600:]}")
    failing = sorted(run.unclean)
    detail = "; ".join(f"{c}={run.verdicts[c]}" for c in failing)
    return ControlResult(factory, not failing, "passed" if not failing else "failed",
                         failing, run.seconds, detail)


def run_selfcheck(
    mutants: Sequence[Mutant], config: _Config, *, workers: int, controls: bool = True,
    progress: Any = None,
) -> tuple[list[MutantResult], list[ControlResult]]:
    """Check every mutant (and each distinct base as a control), ``workers`` at a time."""
    bases = list(dict.fromkeys(m.base for m in mutants)) if controls else []
    lock = threading.Lock()

    def report(line: str) -> None:
        if progress is not None:
            with lock:
                print(line, file=progress, flush=True)

    def control_job(factory: str) -> ControlResult:
        result = check_control(factory, config)
        report(f"  control {factory}: {result.status} ({result.seconds:.1f} s)"
               + (f" {result.detail}" if result.detail else ""))
        return result

    shared = config.workdir / "targeted"
    shared.mkdir(parents=True, exist_ok=True)

    def mutant_job(mutant: Mutant) -> MutantResult:
        targeted = targeted_run(mutant, config, shared, others=mutants)
        result = check_mutant(mutant, config, targeted)
        by = ",".join(result.clauses) or "-"
        report(f"  {mutant.name}: {result.status} by {by} ({result.seconds:.1f} s)")
        return result

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        control_futures = [pool.submit(control_job, b) for b in bases]
        # Lanes first: they share the targeted runs out; each mutant's job then
        # finds its run done (or waits for it) and goes on to the full suite if needed.
        lanes = [pool.submit(_lane, mutants, config, shared, None, lane)
                 for lane in range(max(1, workers - len(bases)))]
        mutant_futures = [pool.submit(mutant_job, m) for m in mutants]
        for lane in lanes:
            lane.result()
        control_results = [f.result() for f in control_futures]
        mutant_results = [f.result() for f in mutant_futures]
    return mutant_results, control_results


# -- output ------------------------------------------------------------------


def render_text(results: Sequence[MutantResult], controls: Sequence[ControlResult],
                wall: float) -> str:
    width = max([len(r.mutant.name) for r in results] + [6])
    lines = [f"{'mutant':<{width}}  {'result':<8}  {'killed by':<22}  {'seconds':>7}  steps",
             "-" * (width + 52)]
    for r in results:
        by = ",".join(r.clauses) or "-"
        steps = "-" if r.counterexample_steps is None else str(r.counterexample_steps)
        lines.append(f"{r.mutant.name:<{width}}  {r.status:<8}  {by:<22}  "
                     f"{r.seconds:>7.1f}  {steps}")
    for c in controls:
        lines.append(f"control {c.factory}: {c.status} ({c.seconds:.1f} s)"
                     + (f": {c.detail}" if c.detail else ""))
    killed = sum(r.killed for r in results)
    lines.append(f"{killed}/{len(results)} mutants killed; wall time {wall:.1f} s")
    for r in results:
        if not r.killed:
            lines.append(f"  {r.mutant.name} {r.status}: targets {', '.join(r.mutant.clauses)}"
                         + (f"; {r.detail}" if r.detail else ""))
    return "\n".join(lines) + "\n"


def render_markdown(results: Sequence[MutantResult], controls: Sequence[ControlResult],
                    wall: float) -> str:
    killed = sum(r.killed for r in results)
    lines = [
        "# zmq-conformance self-check",
        "",
        f"{killed}/{len(results)} mutants killed; wall time {wall:.1f} s.",
        "",
        "| Mutant | Result | Killed by | Targets | Seconds | Counterexample steps |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        result = r.status if r.killed else f"**{r.status.upper()}**"
        steps = "-" if r.counterexample_steps is None else str(r.counterexample_steps)
        lines.append(f"| `{r.mutant.name}` | {result} | {', '.join(r.clauses) or '-'} | "
                     f"{', '.join(r.mutant.clauses)} | {r.seconds:.1f} | {steps} |")
    if controls:
        lines += ["", "| Control | Result | Seconds | Detail |", "|---|---|---|---|"]
        for c in controls:
            lines.append(f"| `{c.factory}` | {c.status} | {c.seconds:.1f} | "
                         f"{c.detail.replace('|', '/') or '-'} |")
    return "\n".join(lines) + "\n"


def to_json(results: Sequence[MutantResult], controls: Sequence[ControlResult], wall: float,
            config: _Config) -> dict[str, Any]:
    return {
        "mutants": {r.mutant.name: r.to_json() for r in results},
        "controls": {c.factory: c.to_json() for c in controls},
        "contract": config.contract,
        "profile": config.profile,
        "seed": config.seed,
        "chaos": config.chaos,
        "wall_seconds": round(wall, 2),
    }


# -- command line ------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run the conformance suite against every mutant of the catalog and "
                    "report which were killed, by which clause, how fast.",
        epilog="Exit status: 0 all mutants killed and controls clean, 1 a mutant survived, "
               "a control failed or a run broke, 2 usage or configuration error.",
    )
    parser.add_argument("--profile", default=profiles.DEFAULT_PROFILE, metavar="NAME",
                        help=f"suite depth profile ({', '.join(profiles.PROFILES)}; "
                             f"default {profiles.DEFAULT_PROFILE})")
    parser.add_argument("--contract", metavar="NAME", default=contracts.DEFAULT_CONTRACT,
                        help=f"the contract whose catalog to check: "
                             f"{', '.join(contracts.CONTRACTS)} (default "
                             f"{contracts.DEFAULT_CONTRACT})")
    parser.add_argument("--json", metavar="PATH", help="write the kill matrix as JSON")
    parser.add_argument("--markdown", metavar="PATH", help="write the kill matrix as Markdown")
    parser.add_argument("--chaos", action="store_true",
                        help="also run chaos mutants and the tests under injected faults (needs "
                             "the chaos extra)")
    parser.add_argument("-n", dest="workers", type=int, default=2, metavar="N",
                        help="suite runs in parallel (default 2)")
    parser.add_argument("--mutant", action="append", default=[], metavar="NAME",
                        help="only this mutant (repeatable)")
    parser.add_argument("--extra", action="append", default=[], metavar="MODULE:ATTR",
                        help="add a user catalog: an iterable of "
                             "conformance.selfcheck.Mutant (repeatable)")
    parser.add_argument("--no-builtin", action="store_true",
                        help="leave out the built-in catalog (check only --extra mutants)")
    parser.add_argument("--no-control", action="store_true",
                        help="do not run the unmutated base implementations")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED,
                        help=f"Hypothesis seed for every run (default {DEFAULT_SEED})")
    parser.add_argument("--run-timeout", type=float, default=DEFAULT_RUN_TIMEOUT_S,
                        metavar="SECONDS", help="a suite run longer than this counts as hung "
                        f"(default {DEFAULT_RUN_TIMEOUT_S:.0f})")
    parser.add_argument("--shrink-seconds", type=int, default=DEFAULT_SHRINK_S, metavar="SECONDS",
                        help="cap Hypothesis shrinking per failing test (default "
                             f"{DEFAULT_SHRINK_S}; Hypothesis alone allows 300; 0: no "
                             "shrinking, the same kills with unshrunk counterexamples)")
    parser.add_argument("--xfail-file", metavar="PATH",
                        help="pass this expected-failure list to every run (to check that "
                             "it hides no real bug)")
    parser.add_argument("--keep-logs", metavar="DIR",
                        help="keep every run's output, verdicts and Hypothesis database in DIR")
    parser.add_argument("--list", action="store_true", help="print the catalog and exit")
    return parser


def _select(args: argparse.Namespace) -> list[Mutant]:
    contracts.get(args.contract)
    catalog = load_catalog(args.extra, builtin=not args.no_builtin, contract=args.contract)
    if args.profile not in profiles.PROFILES:
        raise ConfigError(f"--profile={args.profile!r}: unknown profile; choose one of "
                          f"{', '.join(profiles.PROFILES)}")
    if args.workers < 1:
        raise ConfigError("-n: must be at least 1")
    if args.xfail_file and not Path(args.xfail_file).is_file():
        raise ConfigError(f"--xfail-file={args.xfail_file!r}: no such file")
    if args.mutant:
        known = {m.name: m for m in catalog}
        unknown = [n for n in args.mutant if n not in known]
        if unknown:
            raise ConfigError(f"--mutant={unknown[0]!r}: not in the catalog; known: "
                              f"{', '.join(known)}")
        return [known[n] for n in dict.fromkeys(args.mutant)]
    return [m for m in catalog if args.chaos or not m.chaos]


def main(argv: Sequence[str] | None = None) -> int:
    """``zmq-conformance self-check [options]``; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        selected = _select(args)
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if args.list:
        for m in selected:
            flag = " [chaos]" if m.chaos else ""
            print(f"{m.name:36} {', '.join(m.clauses):28} {m.description}{flag}")
        return 0
    skipped_chaos = [m.name for m in selected if m.chaos and not args.chaos]
    if skipped_chaos:
        print(f"{PROG}: note: chaos mutants run only with --chaos: {', '.join(skipped_chaos)}",
              file=sys.stderr)
        selected = [m for m in selected if args.chaos or not m.chaos]
    run_args = ("--xfail-file", str(Path(args.xfail_file).resolve())) if args.xfail_file else ()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="zmq-selfcheck-") as scratch:
        workdir = Path(args.keep_logs).resolve() if args.keep_logs else Path(scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        config = _Config(args.profile, args.seed, args.chaos, args.run_timeout,
                         args.shrink_seconds, run_args, workdir, args.contract,
                         pycache=Path(scratch) / "pycache",
                         tables=_shared_tables(Path(scratch) / "hypothesis-tables"))
        print(f"{PROG}: contract {args.contract}, {len(selected)} mutant(s), "
              f"profile {args.profile}, seed {args.seed}, "
              f"{args.workers} at a time", flush=True)
        results, controls = run_selfcheck(selected, config, workers=args.workers,
                                          controls=not args.no_control, progress=sys.stdout)
    wall = time.monotonic() - started
    sys.stdout.write(render_text(results, controls, wall))
    if args.json:
        _write(args.json, json.dumps(to_json(results, controls, wall, config), indent=2) + "\n")
    if args.markdown:
        _write(args.markdown, render_markdown(results, controls, wall))
    ok = all(r.killed for r in results) and all(c.passed for c in controls)
    return 0 if ok else 1


def _shared_tables(storage: Path) -> Path | None:
    """Build Hypothesis's Unicode tables once into ``storage`` for every run to copy;
    ``None`` if that fails (each run then builds its own, as before)."""
    try:
        hypothesis_warmup.build_into(storage)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"{PROG}: note: Hypothesis's Unicode tables not pre-built ({exc}); "
              "each run builds its own", file=sys.stderr)
        return None
    return storage


def _write(path: str, text: str) -> None:
    """Write a report, creating its directory (as ``zmq-conformance run`` does)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
