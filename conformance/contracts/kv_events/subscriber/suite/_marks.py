"""The clause marker of the subscriber suite.

Uses the core's ``clause`` marker once the registry knows the EVS clauses,
and a suite-local ``kv_clause`` marker until then.
"""

from __future__ import annotations

import pytest

from conformance.clauses import CLAUSES


def clause(*ids: str) -> pytest.MarkDecorator:
    if all(i in CLAUSES for i in ids):
        return pytest.mark.clause(*ids)
    return pytest.mark.kv_clause(*ids)
