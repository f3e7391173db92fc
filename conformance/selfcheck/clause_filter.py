"""A pytest plugin for self-check runs: keep only the tests of some clauses.

``zmq-conformance self-check`` loads it into each suite run it starts
(``-p conformance.selfcheck.clause_filter --selfcheck-clause CONN-3 ...``) to
try a mutant against the clauses it targets before falling back to the whole
suite. A test is kept when any of its ``@pytest.mark.clause(...)`` IDs is
wanted. Normal runs never load this module.
"""

from __future__ import annotations

import pytest

OPTION = "--selfcheck-clause"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        OPTION, action="append", default=[], metavar="ID", dest="selfcheck_clauses",
        help="self-check: keep only tests marked with this clause (repeatable)",
    )


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
    if drop:
        items[:] = keep
        config.hook.pytest_deselected(items=drop)
