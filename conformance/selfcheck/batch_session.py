"""The in-session plugin of a batch run together: several mutants in one pytest session.

Starting a pytest process per mutant costs about a second before any test
runs; a catalog of well-behaved mutants (none hangs, aborts or leaks a
context) can share one session instead (:func:`conformance.selfcheck.batch.run_together`
starts it). Load it with
``-p conformance.selfcheck.batch_session --selfcheck-batch SPEC --selfcheck-batch-report OUT``
next to ``--zmq-contract NAME`` and the contract's suite. ``SPEC`` is a batch
spec (:func:`conformance.selfcheck.batch.write_spec`): its jobs are the
mutants (``tag`` the mutant's name; ``tests``, when given, the only test
functions of its clauses' tests that run).

Each suite test is parametrized over the mutants that target one of its
clauses (``zmq_transport_factory`` set to the mutant's spec, which the
family fixtures take when the session's contract is theirs); other tests
are deselected. A mutant's tests run together, narrowest first (as
:mod:`conformance.selfcheck.clause_filter` orders them), and once one fails
the mutant's remaining tests are skipped: the per-mutant equivalent of
``-x``. ``OUT`` gets ``{"results": {mutant: [outcome, ...]}, "running": ...}``:
per mutant, every test's outcome and the text of each failure (so the caller
can check that the failure names the clause), and the test in progress
(rewritten before and after each test: if the process dies, it names the
test, its mutant and its clauses).

A mutant that can hang or crash its process does not belong in a batch: it
would take the others' verdicts with it. Run it alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conformance import contracts
from conformance.config.loading import contract_spec_from_path
from conformance.config.selection import configured_contract
from conformance.selfcheck import batch, clause_filter

OPTION = batch.SESSION_OPTION
REPORT_OPTION = batch.SESSION_REPORT_OPTION
_ARG = "zmq_transport_factory"

#: Mutants with a failed test (their later tests are skipped).
_killed: set[str] = set()
#: Per mutant, the outcome of each of its tests.
_results: dict[str, list[dict[str, str]]] = {}
#: Each collected test's mutant, by node id.
_names: dict[str, str] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("zmq-selfcheck", "zmq-conformance self-check (internal)")
    group.addoption(OPTION, default=None, metavar="SPEC", dest="selfcheck_batch",
                    help="batch spec whose jobs (mutants) run together in this session")
    group.addoption(REPORT_OPTION, default=None, metavar="FILE",
                    dest="selfcheck_batch_report", help="where to write each mutant's outcomes")


def _mutants(config: pytest.Config) -> list[dict[str, Any]]:
    """The batch's jobs as ``{"name", "factory", "clauses", "tests"}``."""
    path = config.getoption("selfcheck_batch")
    if not path:
        return []
    jobs = batch.read_spec(Path(path))[0]
    return [{"name": j.tag, "factory": j.factory, "clauses": list(j.clauses),
             "tests": list(j.tests)} for j in jobs]


def pytest_configure(config: pytest.Config) -> None:
    _results.update({m["name"]: [] for m in _mutants(config)})


#: Each parametrized spec's mutant, by identity (the specs are kept alive here).
_spec_names: dict[int, tuple[Any, str]] = {}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    mutants = _mutants(metafunc.config)
    if not mutants or _ARG not in metafunc.fixturenames:
        return
    clauses = {v for m in metafunc.definition.iter_markers("clause") for v in m.args}
    name = metafunc.function.__name__
    chosen = [m for m in mutants if clauses & set(m["clauses"])
              and (not m.get("tests") or name in m["tests"])]
    if not chosen:
        return
    contract = contracts.get(configured_contract(metafunc.config).name)
    specs = [contract_spec_from_path(contract, m["factory"], option=OPTION)
             for m in chosen]
    for spec, mutant in zip(specs, chosen, strict=True):
        _spec_names[id(spec)] = (spec, str(mutant["name"]))
    metafunc.parametrize(_ARG, specs, ids=[m["name"] for m in chosen])


def _mutant_of(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    if callspec is None or _ARG not in callspec.params:
        return None
    entry = _spec_names.get(id(callspec.params[_ARG]))
    return entry[1] if entry is not None else None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mutants = _mutants(config)
    if not mutants:
        return
    order = {m["name"]: i for i, m in enumerate(mutants)}
    keep: list[tuple[int, tuple[int, bool], int, pytest.Item]] = []
    drop: list[pytest.Item] = []
    for index, item in enumerate(items):
        name = _mutant_of(item)
        if name is None:
            drop.append(item)
        else:
            keep.append((order[name], _breadth(item), index, item))
    keep.sort(key=lambda entry: entry[:3])
    items[:] = [entry[3] for entry in keep]
    if config.getoption("selfcheck_shrink_seconds", None) == 0:
        clause_filter._without_shrinking(items)
    if drop:
        config.hook.pytest_deselected(items=drop)


def _breadth(item: pytest.Item) -> tuple[int, bool]:
    """Narrowest first, as :mod:`conformance.selfcheck.clause_filter` orders; among
    equals, plain tests before ``@given`` ones (a plain test fails in one run, a
    ``@given`` one in two: the failure and Hypothesis's replay of it)."""
    clauses = {v for m in item.iter_markers("clause") for v in m.args}
    given = bool(getattr(getattr(item, "obj", None), "is_hypothesis_test", False))
    return len(clauses), given


def pytest_runtest_setup(item: pytest.Item) -> None:
    name = _mutant_of(item)
    if name is None:
        return
    if name in _killed:
        pytest.skip(f"{name} already killed by an earlier test")
    clauses = sorted({v for m in item.iter_markers("clause") for v in m.args})
    _write(item.config, running={"test": item.nodeid, "mutant": name, "clauses": clauses})


def pytest_runtest_teardown(item: pytest.Item) -> None:
    if _mutant_of(item) is not None:
        _write(item.config, running=None)


def _write(config: pytest.Config, *, running: dict[str, Any] | None) -> None:
    """The report so far, and the test in progress: if the process dies (a mutant that
    aborts inside libzmq), the caller still knows which test of which mutant it was."""
    path = config.getoption("selfcheck_batch_report")
    if path:
        Path(path).write_text(json.dumps({"results": _results, "running": running}))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    name = _names.get(report.nodeid)
    if name is None:
        return
    if report.failed:
        _killed.add(name)
    if report.when == "call" or report.outcome != "passed":
        _results[name].append(
            {"test": report.nodeid, "when": report.when, "outcome": report.outcome,
             "text": report.longreprtext[-4000:] if report.failed else ""})


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    for item in session.items:
        name = _mutant_of(item)
        if name is not None:
            _names[item.nodeid] = name


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _mutants(session.config):
        _write(session.config, running=None)
