"""Per-test outcomes and per-clause verdicts: the pure logic behind every report.

A test checks one or more clauses. Each test gets one *outcome* from the
pytest reports of its phases (setup, call, teardown); each clause gets one
*verdict* from the outcomes of its tests, by this precedence (strongest
first)::

    crashed > blocked > failed > flaky > xpassed > passed > xfailed > skipped

So one failing test fails its clause whatever the others did, an unexpected
pass (``xpassed``, the expected-failure list is stale) outranks passes, and a
clause is ``passed`` only if a test of it passed and none failed. A clause
that no test checked is ``skipped`` with the reason ``"no test collected"``:
a clause is never passed without evidence. Chaos clauses that did not run
are ``skipped`` with ``"chaos clauses run with --chaos"``, and clauses a run
stopped before (Ctrl-C, ``-x``) with ``"not run: the run was interrupted"``.

``crashed``: the process running the test died (a fatal signal such as
``SIGABRT`` or ``SIGSEGV``); ``blocked``: a call did not return within the
watchdog limit, or the test made no progress at all within the stall limit
(see :mod:`conformance.supervision.postmortem`).

A test that failed and was re-run (:mod:`conformance.supervision.reruns`) is ``failed``
when it failed every time and ``flaky`` when it also passed; its
:class:`~conformance.supervision.reruns.Tally` gives the clause's reason ("flaky: failed
2 of 5 runs", "reproduced 5 of 5 runs"). A deterministic failure outranks a
flaky one, so a clause shows the strongest evidence against it.

Verdicts that fail a run: ``crashed``, ``blocked``, ``failed``, ``flaky`` and
``xpassed``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from conformance.clauses import Clause
from conformance.contracts import CLAUSES, DEFAULT_CONTRACT
from conformance.errors import CallBlocked
from conformance.supervision.reruns import Tally

#: Verdicts from strongest to weakest.
PRECEDENCE: Final = (
    "crashed", "blocked", "failed", "flaky", "xpassed", "passed", "xfailed", "skipped",
)
FAILING: Final = frozenset({"crashed", "blocked", "failed", "flaky", "xpassed"})
NO_TEST_REASON: Final = "no test collected"
CHAOS_REASON: Final = "chaos clauses run with --chaos"

_MAX_TEXT = 4000
#: How Hypothesis introduces the shrunk example in its exception notes
#: ("Falsifying example:" before 6.1xx, "Failing test case:" since).
_EXAMPLE_PREFIXES = ("Falsifying", "Failing test case")


#: Lines Hypothesis appends to an exception's text (a skip reason included).
_HYPOTHESIS_NOTES = ("Failing explicit example", "Falsifying", "Failing test case",
                     "You can reproduce", "Explanation:")


def strip_hypothesis_notes(text: str) -> str:
    """``text`` up to the first note Hypothesis appended (its example, its replay hint)."""
    kept: list[str] = []
    for line in text.splitlines():
        if line.lstrip().startswith(_HYPOTHESIS_NOTES):
            break
        kept.append(line)
    return "\n".join(kept).strip()


def one_reason(reasons: Sequence[str], clause_id: str = "") -> str | None:
    """One readable sentence for a skipped clause (several glued together read as one
    garbled sentence): the first reason that names the clause, else the first direct one,
    else the first "inconclusive" one."""
    named = [r for r in reasons if clause_id and r.startswith(clause_id)]
    direct = [r for r in reasons if not r.startswith("inconclusive")]
    chosen = named or direct or list(reasons)
    return chosen[0] if chosen else None


def strongest(outcomes: Iterable[str]) -> str:
    """The strongest outcome by :data:`PRECEDENCE` (``skipped`` for none)."""
    ranked = [PRECEDENCE.index(o) for o in outcomes if o in PRECEDENCE]
    return PRECEDENCE[min(ranked)] if ranked else "skipped"


def phase_outcome(
    *, when: str, outcome: str, wasxfail: bool, blocked: bool, xpassed: bool,
    crashed: bool = False,
    flaky: bool = False,
) -> str | None:
    """The outcome one pytest phase report contributes, or ``None`` for a plain pass.

    ``outcome`` is pytest's (``passed``/``failed``/``skipped``); ``wasxfail``
    is set when an expected failure failed (or, non-strict, passed);
    ``xpassed`` flags pytest's strict XPASS (a failed call without exception);
    ``blocked`` flags a :class:`CallBlocked` failure (or a stalled test);
    ``crashed`` a test whose process died; ``flaky`` a failure that re-runs
    did not reproduce every time.
    """
    if outcome == "skipped":
        return "xfailed" if wasxfail else "skipped"
    if outcome == "failed":
        if crashed:
            return "crashed"
        if xpassed:
            return "xpassed"
        if blocked:
            return "blocked"
        return "flaky" if flaky else "failed"
    if when == "call":
        return "xpassed" if wasxfail else "passed"
    return None


def find_blocked(exc: BaseException | None) -> CallBlocked | None:
    """The :class:`CallBlocked` in ``exc``, its exception groups or ``__cause__`` chain."""
    seen: set[int] = set()
    stack: list[BaseException] = [exc] if exc is not None else []
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, CallBlocked):
            return current
        if isinstance(current, BaseExceptionGroup):
            stack.extend(current.exceptions)
        if current.__cause__ is not None:
            stack.append(current.__cause__)
    return None


def _first_leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 15] + "\n... (clipped)"


#: A clause ID of any contract (filtered against the registry by the caller).
_CLAUSE_ID = re.compile(r"\b[A-Z]{2,5}-\d+\b")


def blamed_clauses(exc: BaseException, known: Iterable[str] = CLAUSES) -> tuple[str, ...]:
    """The clauses (among ``known``) that the failure's own message names.

    A test that checks many clauses (a stateful machine) says which one broke,
    e.g. ``AssertionError("MSG-2: message #3 duplicated")``; the named clause
    fails even when the test is not marked with it (a chaos machine can find
    a CONN-3 bug). Only IDs at the start of the message count, so a message
    quoting a requirement does not spread the blame. Empty when the message
    names none: then the failure counts against every clause of the test.
    """
    message = str(_first_leaf(exc)).lstrip()
    named: list[str] = []
    for match in _CLAUSE_ID.finditer(message[:200]):
        if message[: match.start()].strip(" ,;/") and not named:
            break
        named.append(match.group(0))
        rest = message[match.end():].lstrip(" ,;/")
        if not _CLAUSE_ID.match(rest):
            break
    valid = set(known)
    return tuple(c for c in dict.fromkeys(named) if c in valid)


def counterexample(exc: BaseException) -> str:
    """The shortest useful account of a failure.

    For Hypothesis failures: the ``Falsifying example`` / ``Failing test
    case`` text (steps of a
    stateful machine included), the error, and the ``@reproduce_failure`` or
    ``@seed`` line when Hypothesis printed one (all taken from the
    exception's notes). Otherwise the error and its assertion message.
    """
    notes: list[str] = []
    for candidate in (exc, _first_leaf(exc)):
        notes.extend(n for n in getattr(candidate, "__notes__", ()) if isinstance(n, str))
    header: list[str] = []
    if isinstance(exc, BaseExceptionGroup):
        header.append(f"{type(exc).__name__}: {exc.message}")
    falsifying = [n.strip() for n in notes if n.lstrip().startswith(_EXAMPLE_PREFIXES)]
    replay = [n.strip() for n in notes if "@reproduce_failure(" in n or "@seed(" in n]
    leaf = _first_leaf(exc)
    message = str(leaf).strip()
    error = f"{type(leaf).__name__}: {message}" if message else type(leaf).__name__
    parts = [*header, *dict.fromkeys(falsifying), error, *dict.fromkeys(replay)]
    return _clip("\n".join(parts))


@dataclass
class TestResult:
    """The outcome of one test (one pytest item) and what it checked."""

    __test__ = False  # not a pytest test class, despite the name

    nodeid: str
    clauses: tuple[str, ...]
    outcome: str = "skipped"
    duration_s: float = 0.0
    reason: str | None = None
    counterexample: str | None = None
    k_expr: str | None = None
    chaos: bool = False
    #: When a failure names some of the test's clauses, only those fail; for
    #: the others the test is inconclusive (see :func:`blamed_clauses`).
    blamed: tuple[str, ...] = ()
    #: What the test measured (``record_property``), e.g. heartbeat detection times.
    measurements: dict[str, str] = field(default_factory=dict)
    #: How many of its runs failed, when it failed and was re-run.
    reruns: Tally | None = None
    _ran: bool = field(default=False, init=False, repr=False)

    def add_phase(
        self,
        outcome: str | None,
        duration_s: float,
        *,
        reason: str | None = None,
        counterexample: str | None = None,
    ) -> None:
        """Fold one phase in: durations add up, the strongest outcome stays."""
        self.duration_s += duration_s
        if outcome is not None and (
            self._ran is False or PRECEDENCE.index(outcome) < PRECEDENCE.index(self.outcome)
        ):
            self.outcome = outcome
            self._ran = True
            if reason:
                self.reason = reason
        if counterexample and (
            self.counterexample is None or len(counterexample) < len(self.counterexample)
        ):
            self.counterexample = counterexample



@dataclass
class ClauseVerdict:
    """The verdict of one clause with the evidence behind it."""

    clause: Clause
    verdict: str
    tests: list[TestResult] = field(default_factory=list)
    counterexample: str | None = None
    reason: str | None = None
    replay: str | None = None
    replay_pytest: str | None = None
    duration_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "title": self.clause.title,
            "requirement": self.clause.requirement,
            "chaos": self.clause.chaos,
            "tests": [
                {
                    "nodeid": t.nodeid,
                    "outcome": t.outcome,
                    "duration_s": round(t.duration_s, 4),
                    "reason": t.reason,
                    "counterexample": t.counterexample,
                    "measurements": dict(t.measurements),
                    **({"runs": t.reruns.runs, "failed_runs": t.reruns.failed}
                       if t.reruns is not None else {}),
                }
                for t in self.tests
            ],
            "counterexample": self.counterexample,
            "reason": self.reason,
            "replay": self.replay,
            "replay_pytest": self.replay_pytest,
            "duration_s": round(self.duration_s, 4),
        }


@dataclass
class RunReport:
    """Everything the reports show: the run's identity and one verdict per clause."""

    transport: str
    profile: str
    seed: int | str | None
    clauses: dict[str, ClauseVerdict]
    #: Configuration warnings of the run (e.g. xfail entries that matched nothing).
    warnings: list[str] = field(default_factory=list)
    #: The contract checked (:mod:`conformance.contracts`).
    contract: str = DEFAULT_CONTRACT
    #: "nodeid: reason" of each test ended by a :class:`conformance.errors.RunError`
    #: (the suite's own infrastructure failed; its clauses are skipped, the run exits 3).
    run_errors: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        """True when a clause crashed, blocked, failed, was flaky or xpassed (the run fails)."""
        return any(v.verdict in FAILING for v in self.clauses.values())

    def counts(self) -> dict[str, int]:
        totals = dict.fromkeys(PRECEDENCE, 0)
        for verdict in self.clauses.values():
            totals[verdict.verdict] += 1
        return totals

    def ordered(self) -> list[ClauseVerdict]:
        """Failures first (crashed, blocked, failed, flaky, xpassed), then the rest, registry
        order within."""
        order = list(CLAUSES)
        return sorted(
            self.clauses.values(),
            key=lambda v: (PRECEDENCE.index(v.verdict), order.index(v.clause.id)),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "contract": self.contract,
            "transport": self.transport,
            "profile": self.profile,
            "seed": self.seed,
            "counts": self.counts(),
            "warnings": list(self.warnings),
            "run_errors": list(self.run_errors),
            "clauses": {cid: v.to_json() for cid, v in self.clauses.items()},
        }


@dataclass(frozen=True)
class ReplayContext:
    """What a replay command needs besides the test: how the run was configured.

    ``driver`` is the driver command when the implementation runs behind one
    (docs/drivers.md); the replay then names it with ``--driver``, since a
    driver's label is no ``MODULE:ATTR``.
    """

    transport: str | None
    profile: str
    seed: int | str | None
    chaos: bool = False
    contract: str = DEFAULT_CONTRACT
    driver: str | None = None

    def commands(self, k_expr: str) -> tuple[str, str]:
        """``(zmq-conformance command, pytest command)`` rerunning ``k_expr``."""
        cli = ["zmq-conformance", "run"]
        plain = ["pytest", "--zmq-conformance-only"]
        if self.contract != DEFAULT_CONTRACT:
            cli += ["--contract", self.contract]
            plain += ["--zmq-contract", self.contract]
        if self.driver:
            cli += ["--driver", self.driver]
            plain += ["--zmq-driver", self.driver]
        elif self.transport:
            cli += ["--transport", self.transport]
            plain += ["--zmq-transport", self.transport]
        cli += ["--profile", self.profile, "-k", k_expr]
        plain += ["--zmq-profile", self.profile, "-k", k_expr]
        if self.seed is not None:
            cli += ["--hypothesis-seed", str(self.seed)]
            plain += [f"--hypothesis-seed={self.seed}"]
        if self.chaos:
            cli.append("--chaos")
            plain.append("--zmq-chaos")
        return shlex.join(cli), shlex.join(plain)


def aggregate(
    results: Iterable[TestResult],
    *,
    context: ReplayContext,
    chaos_enabled: bool = False,
    clauses: Mapping[str, Clause] = CLAUSES,
    no_test_reason: str = NO_TEST_REASON,
) -> dict[str, ClauseVerdict]:
    """One verdict per registry clause from the tests' outcomes.

    Clause IDs in ``results`` that the registry lacks are ignored here (the
    plugin rejects them at collection). ``no_test_reason`` is the skip reason
    of a clause no test checked (the plugin names the ``-k``/``-m``
    selection when there was one).
    """
    by_clause: dict[str, list[TestResult]] = {cid: [] for cid in clauses}
    for result in results:
        for cid in dict.fromkeys((*result.clauses, *result.blamed)):
            if cid in by_clause:
                by_clause[cid].append(_as_seen_by(result, cid))
    verdicts: dict[str, ClauseVerdict] = {}
    for cid, clause in clauses.items():
        tests = by_clause[cid]
        verdicts[cid] = _verdict(
            clause, tests, context=context, chaos_enabled=chaos_enabled,
            no_test_reason=no_test_reason,
        )
    return verdicts


def _as_seen_by(result: TestResult, clause_id: str) -> TestResult:
    """``result`` as evidence for one clause: a failure blamed elsewhere is inconclusive."""
    if result.outcome not in FAILING or not result.blamed or clause_id in result.blamed:
        return result
    inconclusive = TestResult(
        result.nodeid,
        result.clauses,
        outcome="skipped",
        duration_s=result.duration_s,
        reason=f"inconclusive: the test failed on {', '.join(result.blamed)} first",
        k_expr=result.k_expr,
        chaos=result.chaos,
        measurements=result.measurements,
    )
    return inconclusive


def _verdict(
    clause: Clause,
    tests: Sequence[TestResult],
    *,
    context: ReplayContext,
    chaos_enabled: bool,
    no_test_reason: str,
) -> ClauseVerdict:
    if not tests:
        reason = CHAOS_REASON if clause.chaos and not chaos_enabled else no_test_reason
        return ClauseVerdict(clause, "skipped", reason=reason)
    verdict = strongest(t.outcome for t in tests)
    result = ClauseVerdict(
        clause, verdict, tests=list(tests), duration_s=sum(t.duration_s for t in tests)
    )
    deciding = [t for t in tests if t.outcome == verdict]
    if verdict in FAILING:
        with_example = [t for t in deciding if t.counterexample]
        if with_example:
            best = min(with_example, key=lambda t: len(t.counterexample or ""))
            result.counterexample = best.counterexample
            deciding = [best]
    if verdict == "skipped":
        result.reason = one_reason([t.reason for t in deciding if t.reason], clause.id)
    elif verdict in ("xfailed", "xpassed", "blocked", "crashed"):
        reasons = [t.reason for t in deciding if t.reason]
        result.reason = "; ".join(dict.fromkeys(reasons)) or None
    elif verdict in ("failed", "flaky"):
        tallies = [t.reruns.describe() for t in tests
                   if t.outcome == verdict and t.reruns is not None]
        result.reason = "; ".join(dict.fromkeys(tallies)) or None
    k_parts = [t.k_expr for t in deciding if t.k_expr]
    if k_parts and verdict != "skipped":
        k_expr = " or ".join(dict.fromkeys(f"({k})" if " " in k else k for k in k_parts))
        if len(k_parts) == 1:
            k_expr = k_parts[0]
        chaos = clause.chaos or any(t.chaos for t in deciding)
        ctx = replace(context, chaos=chaos)
        result.replay, result.replay_pytest = ctx.commands(k_expr)
    return result


def exit_status(report: RunReport | None, pytest_status: int) -> int:
    """The CLI's exit status from the verdicts and pytest's own status.

    0: every clause passed, was skipped or failed as expected; 1: a clause
    failed, was flaky, was blocked, crashed or unexpectedly passed (or pytest saw a failing
    test); 2: usage or configuration error, or no test selected; 3: the
    suite could not run (collection error, internal error, interrupted), or
    a test ended with a run error (a fault proxy stopped, a node never
    started: the clauses it would have judged have no evidence) and no clause
    failed.
    """
    if pytest_status == 4:
        return 2
    if pytest_status == 5:
        return 2
    if pytest_status == 2 and report is not None and report.failed:
        # Interrupted after a failure: ``-x``/``--maxfail`` under xdist stops
        # the workers that way. (A signal is reported as 3 by the CLI itself.)
        return 1
    if pytest_status in (2, 3) or report is None:
        return 3
    if pytest_status == 1 or report.failed:
        return 1
    if report.run_errors:
        return 3
    return 0
