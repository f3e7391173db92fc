"""Guards around one suite test: its postmortem journal, and shrinking capped once a
call blocked.

A test whose call blocked fails again on every shrink step, each waiting for
the watchdog; the verdict does not change, so :func:`cap_shrinking` (the
watchdog's block hook) caps Hypothesis's shrinking for the rest of the test.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

from conformance.supervision import cleanup, postmortem

__all__ = ["cap_shrinking", "journaled", "restore_shrinking"]


def journaled(
    item: pytest.Item, clauses: tuple[str, ...], sentinel: postmortem.Sentinel | None
) -> Generator[None, object, object]:
    """Around one suite test where a sentinel runs: its journal and stall deadline,
    then the families' cleanups (a generator for a ``wrapper=True`` hook)."""
    if sentinel is None:
        return (yield)
    props = {str(k): str(v) for k, v in item.user_properties}
    sentinel.begin(item.nodeid, clauses, props)
    try:
        return (yield)
    finally:
        # What the test's implementations left open goes before the next test
        # starts (the test has measured it): the families' cleanups.
        cleanup.test_ended()
        sentinel.end()


#: Hypothesis's shrinking budget for a test whose call blocked: every shrink
#: step re-runs an example that blocks again, and the verdict does not change.
_BLOCKED_SHRINK_S = 20
_saved_shrink_s: list[int] = []


def cap_shrinking() -> None:
    """A call blocked: cap Hypothesis's shrinking of this test (a private constant)."""
    from hypothesis.internal.conjecture import engine

    current = getattr(engine, "MAX_SHRINKING_SECONDS", None)
    if isinstance(current, int) and not _saved_shrink_s:
        _saved_shrink_s.append(current)
        engine.MAX_SHRINKING_SECONDS = min(current, _BLOCKED_SHRINK_S)


def restore_shrinking() -> None:
    """Undo :func:`cap_shrinking` (after the test)."""
    if _saved_shrink_s:
        from hypothesis.internal.conjecture import engine

        engine.MAX_SHRINKING_SECONDS = _saved_shrink_s.pop()
