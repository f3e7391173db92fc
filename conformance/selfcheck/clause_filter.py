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
``0`` turns shrinking off: the kept Hypothesis tests run without the shrink
phase (the first failing example is reported as found), and a stateful
machine, whose settings are built at call time, stops shrinking at its first
step. A kill needs only a failing example.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

OPTION = "--selfcheck-clause"
SHRINK_OPTION = "--selfcheck-shrink-seconds"
#: Where a test function's own settings are kept while shrinking is off.
_SAVED = "_selfcheck_saved_settings"
_patched: list[Any] = []


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


def pytest_unconfigure(config: pytest.Config) -> None:
    """Give back the test functions' own settings (a process may run several sessions)."""
    while _patched:
        function = _patched.pop()
        function._hypothesis_internal_use_settings = getattr(function, _SAVED)
        delattr(function, _SAVED)


def _without_shrinking(items: list[pytest.Item]) -> None:
    """Drop the shrink phase from the settings of the Hypothesis tests in ``items``."""
    from hypothesis import Phase, settings

    for item in items:
        function = getattr(item, "obj", None)
        if not getattr(function, "is_hypothesis_test", False) or hasattr(function, _SAVED):
            continue
        own = function._hypothesis_internal_use_settings  # type: ignore[union-attr]
        setattr(function, _SAVED, own)
        function._hypothesis_internal_use_settings = settings(  # type: ignore[union-attr]
            own, phases=[p for p in own.phases if p is not Phase.shrink])
        _patched.append(function)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
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
    if config.getoption("selfcheck_shrink_seconds") == 0:
        _without_shrinking(keep)
    if drop:
        config.hook.pytest_deselected(items=drop)


def _breadth(item: pytest.Item) -> int:
    return len({value for marker in item.iter_markers("clause") for value in marker.args})
