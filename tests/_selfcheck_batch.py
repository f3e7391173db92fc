"""Run a family's mutants in a few pytest children, once per test session.

A pytest child costs about a second before its first test; one per mutant
was most of what the family contract tests spent. Here the mutants of a
catalog are split into groups, each a batch run together
(:func:`conformance.selfcheck.batch.run_together`): the well-behaved ones
share one child, and each mutant that hangs a call, kills a thread or leaks a
context gets a child of its own, so it cannot take another mutant's verdict
with it. Each group runs once per session: under ``pytest -n auto`` the first
worker that needs a group claims it and the others wait for its report (the
batch mechanism's claims, in the session's shared directory).

The per-mutant tests stay in the test modules and assert on the group's
report: the mutant's target tests failed, with a message naming its clause.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conformance.selfcheck import batch

#: One test's outcome in a group's report: test id, phase, outcome, failure text.
Result = dict[str, str]
#: What every group runs with: the default profile, seed 1, no shrinking (a kill
#: needs a failing example, not a minimal one).
_SETTINGS = {"profile": "ci", "seed": 1, "shrink_seconds": 0}


@dataclass(frozen=True)
class Group:
    """Mutants that share one pytest child (one :class:`~conformance.selfcheck.batch.Job`
    each, tagged with the mutant's name)."""

    key: str
    contract: str
    suite: Path
    jobs: tuple[batch.Job, ...]
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
    jobs = [batch.Job(m.name, m.factory, tuple(m.clauses), tests.get(m.name, ()))
            for m in catalog]
    shared = tuple(j for j in jobs if j.tag not in alone)
    shared_extra = tuple(dict.fromkeys(a for j in shared for a in extra.get(j.tag, ())))
    out: dict[str, Group] = {}
    for job in jobs:
        if job.tag in alone:
            out[job.tag] = Group(f"{contract}-{job.tag}", contract, suite, (job,),
                                 extra.get(job.tag, ()))
        else:
            out[job.tag] = Group(f"{contract}-shared", contract, suite, shared, shared_extra)
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
    settings = batch.RunSettings(contract=group.contract, run_args=group.extra, **_SETTINGS)
    data = batch.run_together(group.key, group.jobs, settings,
                              session_dir(factory) / "selfcheck-groups", suite=group.suite)
    return Outcome(data["results"], data["output"])


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
