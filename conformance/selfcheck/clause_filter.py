"""A pytest plugin for self-check runs: keep only the tests of some clauses.

``zmq-conformance self-check`` loads it into each suite run it starts
(``-p conformance.selfcheck.clause_filter --selfcheck-clause CONN-3 ...``) to
try a mutant against the clauses it targets before falling back to the whole
suite. A test is kept when any of its ``@pytest.mark.clause(...)`` IDs is
wanted; the kept tests run narrowest first (fewest clauses), so a run that
stops at its first failure kills as fast as it can. Normal runs never load
this module.

``--selfcheck-shrink-seconds`` caps the time Hypothesis spends shrinking a
failure (its own cap is five minutes). Against a mutant, a failing example
often waits out a harness deadline, so every shrink step costs seconds; the
self-check needs the kill, not the minimal example. The cap is Hypothesis's
module constant ``MAX_SHRINKING_SECONDS``, patched in this process only.
``0`` skips shrinking altogether on the kept ``@given`` tests (their shrink and
explain phases are dropped, and so is the example database): a failing example
is then reported after two runs (the failure and Hypothesis's replay of it),
which is what a kill needs.

Among tests of equal breadth, plain tests run before ``@given`` ones: a plain
test fails after one run, a ``@given`` one after at least two.
"""

from __future__ import annotations

import warnings

import pytest

OPTION = "--selfcheck-clause"
SHRINK_OPTION = "--selfcheck-shrink-seconds"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("zmq-selfcheck", "zmq-conformance self-check (internal)")
    group.addoption(
        OPTION, action="append", default=[], metavar="ID", dest="selfcheck_clauses",
        help="keep only tests marked with this clause (repeatable)",
    )
    group.addoption(
        SHRINK_OPTION, type=int, default=None, metavar="SECONDS",
        dest="selfcheck_shrink_seconds",
        help="cap Hypothesis shrinking at SECONDS per failing test (0: no shrinking)",
    )


def pytest_configure(config: pytest.Config) -> None:
    seconds = config.getoption("selfcheck_shrink_seconds")
    if seconds is None:
        return
    from hypothesis.internal.conjecture import engine

    if not hasattr(engine, "MAX_SHRINKING_SECONDS"):
        warnings.warn(f"{SHRINK_OPTION}: this Hypothesis has no MAX_SHRINKING_SECONDS; "
                      "shrinking is not capped", stacklevel=1)
        return
    engine.MAX_SHRINKING_SECONDS = max(0, seconds)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("selfcheck_shrink_seconds") == 0:
        for item in items:
            _without_shrinking(item)
    wanted = set(config.getoption("selfcheck_clauses") or ())
    if not wanted:
        return
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        ids = {value for marker in item.iter_markers("clause") for value in marker.args}
        (keep if ids & wanted else drop).append(item)
    # Specific tests first, broad ones (a stateful machine checking every clause) last:
    # with -x the run stops at the first kill, and specific tests kill fastest.
    keep.sort(key=_breadth)
    items[:] = keep
    if drop:
        config.hook.pytest_deselected(items=drop)


def _breadth(item: pytest.Item) -> tuple[int, bool]:
    clauses = {value for marker in item.iter_markers("clause") for value in marker.args}
    return len(clauses), _is_given(item)


def _is_given(item: pytest.Item) -> bool:
    return bool(getattr(getattr(item, "obj", None), "is_hypothesis_test", False))


def _without_shrinking(item: pytest.Item) -> None:
    """Drop the shrink and explain phases from a ``@given`` test's settings, and its
    example database: the run is decided by the seed alone, not by failures saved by
    earlier runs (each would be replayed first, and each failure of a mutant can
    cost a harness deadline). Hypothesis reads the settings at call time."""
    if not _is_given(item):
        return
    from hypothesis import Phase, settings

    test = item.obj  # type: ignore[attr-defined]
    current = test._hypothesis_internal_use_settings
    phases = [p for p in current.phases if p not in (Phase.shrink, Phase.explain)]
    test._hypothesis_internal_use_settings = settings(current, phases=phases, database=None)
