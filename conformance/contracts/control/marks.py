"""The clause marker of the control suite.

The core's ``clause`` marker once the contract registry knows the CTL
clauses; a suite-local ``ctl_clause`` marker until then (the core rejects
clause IDs it does not know).
"""

from __future__ import annotations

import pytest

from conformance.clauses import CLAUSES


def clause(*ids: str) -> pytest.MarkDecorator:
    if all(i in CLAUSES for i in ids):
        return pytest.mark.clause(*ids)
    return pytest.mark.ctl_clause(*ids)
