"""Run a family's mutants in a few pytest children, once per test session.

A pytest child costs about a second before its first test; one per mutant
was most of what the family contract tests spent. Here the mutants of a
catalog are split into groups: the well-behaved ones share one child
(:mod:`conformance.selfcheck.mutant_groups`), and each mutant that hangs a call,
kills a thread or leaks a context gets a child of its own, so it cannot take
another mutant's verdict with it. Each group runs once per session: under
``pytest -n auto`` the first worker that needs a group runs it under a file
lock and the others read its report.

The per-mutant tests stay in the test modules and assert on the group's
report: the mutant's target tests failed, with a message naming its clause.
"""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conformance.selfcheck import clause_filter, mutant_groups

#: A group's child is killed after this long (seconds); its mutants then fail.
_LIMIT_S = 300

#: One test's outcome in a group's report: test id, phase, outcome, failure text.
Result = dict[str, str]


@dataclass(frozen=True)
class Group:
    """Mutants that share one pytest child (``(name, factory, clauses)`` each)."""

    key: str
    contract: str
    suite: Path
    mutants: tuple[tuple[str, str, tuple[str, ...], tuple[str, ...]], ...]
    extra: tuple[str, ...] = ()


@dataclass(frozen=True)
class Outcome:
    results: dict[str, list[Result]]
    output: str


def groups(contract: str, suite: Path, catalog: Iterable[Any], *, alone: Sequence[str] = (),
           extra: dict[str, tuple[str, ...]] | None = None,
           tests: dict[str, tuple[str, ...]] | None = None) -> dict[str, Group]:
    """Each mutant's group: the ones named in ``alone`` by themselves, the rest together.

    ``extra`` adds pytest arguments to the group of a mutant (``--zmq-chaos``);
    ``tests`` limits a mutant to the named test functions of its clauses.
    """
    extra = extra or {}
    tests = tests or {}
    entries = [(m.name, m.factory, tuple(m.clauses), tests.get(m.name, ())) for m in catalog]
    shared = tuple(e for e in entries if e[0] not in alone)
    shared_extra = tuple(dict.fromkeys(a for e in shared for a in extra.get(e[0], ())))
    out: dict[str, Group] = {}
    for entry in entries:
        if entry[0] in alone:
            out[entry[0]] = Group(f"{contract}-{entry[0]}", contract, suite, (entry,),
                                  extra.get(entry[0], ()))
        else:
            out[entry[0]] = Group(f"{contract}-shared", contract, suite, shared, shared_extra)
    return out


def session_dir(factory: pytest.TempPathFactory) -> Path:
    """This test session's temporary directory, the same for all its xdist workers.

    A worker's basetemp (``popen-gwN``) sits in the session's; without xdist
    the basetemp is the session's.
    """
    base = factory.getbasetemp()
    return base.parent if base.name.startswith("popen-gw") else base


def outcome(group: Group, factory: pytest.TempPathFactory) -> Outcome:
    """The group's report, running its child unless this session already did."""
    shared = session_dir(factory)
    report = shared / f"selfcheck-{group.key}.json"
    with open(shared / f"selfcheck-{group.key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not report.exists():
            _run(group, report, shared)
    data = json.loads(report.read_text())
    return Outcome(data["results"], data["output"])


def _run(group: Group, report: Path, where: Path) -> None:
    spec = where / f"selfcheck-{group.key}-mutants.json"
    spec.write_text(json.dumps([{"name": n, "factory": f, "clauses": list(c), "tests": list(t)}
                                for n, f, c, t in group.mutants]))
    results = where / f"selfcheck-{group.key}-results.json"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "--zmq-contract", group.contract, "--zmq-reruns", "0", "--hypothesis-seed", "1",
               "-p", "conformance.selfcheck.clause_filter", clause_filter.SHRINK_OPTION, "0",
               "-p", "conformance.selfcheck.mutant_groups", mutant_groups.BATCH_OPTION, str(spec),
               mutant_groups.REPORT_OPTION, str(results), *group.extra,
               "--rootdir", str(group.suite), str(group.suite)]
    returncode: int | None = None
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=_LIMIT_S,
                              check=False)
        output = proc.stdout[-6000:] + proc.stderr[-2000:]
        returncode = proc.returncode
    except subprocess.TimeoutExpired as exc:  # killed: its mutants get no report
        output = f"the group's pytest child did not finish in {_LIMIT_S} s: {exc}"
    data = json.loads(results.read_text()) if results.exists() else {}
    found: dict[str, list[Result]] = data.get("results", {})
    running = data.get("running")
    if running and returncode is not None and returncode < 0:
        # The process died by a signal inside this test: a "crashed" verdict of its clauses.
        found.setdefault(running["mutant"], []).append({
            "test": running["test"], "when": "call", "outcome": "crashed",
            "text": f"{', '.join(running['clauses'])}: the test process died by signal "
                    f"{-returncode} during {running['test']} (crashed)"})
    report.write_text(json.dumps({"results": found, "output": output}))


def assert_killed(name: str, clauses: Sequence[str], got: Outcome, *,
                  blocked_counts: bool = False, crashed_counts: bool = False) -> None:
    """``name`` failed a test of one of ``clauses`` with a message naming the clause
    (or, with ``blocked_counts``, a call the watchdog caught: a ``blocked`` verdict;
    with ``crashed_counts``, the process died in such a test: ``crashed``)."""
    results = got.results.get(name)
    assert results is not None, f"{name}: no report from its run:\n{got.output}"
    killing = ("failed", "crashed") if crashed_counts else ("failed",)
    failures = [r for r in results if r["outcome"] in killing]
    assert failures, f"{name} survived {', '.join(clauses)}: {results}\n{got.output}"
    named = [r for r in failures
             if any(f"{c}:" in r["text"] for c in clauses)
             or (blocked_counts and "CallBlocked" in r["text"])]
    assert named, (
        f"{name}: no failure names {', '.join(clauses)}:\n"
        + "\n".join(r["text"][-2000:] for r in failures)
    )
