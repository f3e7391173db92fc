"""Running a family's stateful machine so that a timing failure still names its clause.

A machine drives real sockets, so a defect may depend on timing and not
reproduce when Hypothesis replays the failing example. Hypothesis then raises
one of its ``Flaky*`` wrappers ("produces unreliable results", "inconsistent
data generation"), which names no clause: the report would blame every
clause of the test, or none. :func:`run` raises the first real failure
instead, as an ``AssertionError`` whose message starts like the original
(its clause ID first) and says that Hypothesis could not replay it.

The first failure is found inside the wrapper (its exception group) or, when
the wrapper holds none, in ``seen``: a list the caller's machines append
their failures to as they happen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

from hypothesis import settings as Settings
from hypothesis.errors import Flaky
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

__all__ = ["TIMING_NOTE", "first_assertion", "run", "timing_failure"]

#: What the message of an unreplayable failure ends with.
TIMING_NOTE = "[Hypothesis could not replay it: the defect depends on timing]"


def run(build: Callable[[], RuleBasedStateMachine], settings: Settings,
        *, seen: Sequence[BaseException] = ()) -> None:
    """Run the machines ``build()`` makes as a Hypothesis test (see the module docstring)."""
    try:
        run_state_machine_as_test(cast(type[RuleBasedStateMachine], build), settings=settings)
    except Flaky as exc:
        underlying = first_assertion(exc) or (seen[0] if seen else None)
        if underlying is None:
            raise
        raise timing_failure(underlying) from exc


def timing_failure(exc: BaseException) -> AssertionError:
    """``exc`` as an ``AssertionError`` ending with :data:`TIMING_NOTE`, its notes kept."""
    message = str(exc) if isinstance(exc, AssertionError) else f"{type(exc).__name__}: {exc}"
    result = AssertionError(f"{message} {TIMING_NOTE}")
    for note in getattr(exc, "__notes__", ()):
        result.add_note(note)
    return result


def first_assertion(exc: BaseException) -> AssertionError | None:
    """The first ``AssertionError`` in ``exc`` or its (nested) exception groups."""
    if isinstance(exc, AssertionError):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        found = first_assertion(inner)
        if found is not None:
            return found
    return None
