"""Stateful machines: Hypothesis ``RuleBasedStateMachine``s over real nodes.

:mod:`~conformance.contracts.p2p.machines.model` holds the model of what must be true;
:mod:`~conformance.contracts.p2p.machines.cluster` drives a cluster of real nodes against it.
The suite runs them in ``conformance/contracts/p2p/suite/test_machines.py`` with
:func:`run_machine`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from hypothesis import seed as fixed_seed
from hypothesis import settings as Settings
from hypothesis.errors import Flaky
from hypothesis.internal.reflection import function_digest
from hypothesis.stateful import RuleBasedStateMachine, get_state_machine_test

from conformance.contracts.p2p.machines.cluster import ClusterMachine, NodeRef
from conformance.contracts.p2p.machines.model import ClusterModel, Violation

__all__ = ["ClusterMachine", "ClusterModel", "NodeRef", "Violation", "run_machine"]


def run_machine(build: Callable[[], ClusterMachine], settings: Settings,
                *, seed: int | None = None) -> None:
    """Run the machines ``build()`` makes as a Hypothesis test; raise the failure, if any.

    ``build`` is e.g. ``lambda: ClusterMachine(spec)``. A defect that depends on
    timing may not reproduce when Hypothesis replays the failing example;
    Hypothesis then raises ``Flaky*`` (for a replay that fails at an earlier
    step: "inconsistent data generation"), which names no clause. That is
    turned into an ``AssertionError`` carrying the first failure seen, so the
    report still starts with the clause ID.
    """
    seen: list[AssertionError] = []

    def factory() -> ClusterMachine:
        instance = build()
        instance.failure_log = seen
        return instance

    test = get_state_machine_test(cast(type[RuleBasedStateMachine], factory),
                                  settings=settings)
    # Hypothesis keys its example database by the factory's digest; ``factory``
    # is the same closure for every caller, so key by what the caller built.
    inner = getattr(getattr(test, "hypothesis", None), "inner_test", None)
    if inner is not None:
        inner._hypothesis_internal_add_digest = function_digest(build)
    if seed is not None:
        test = fixed_seed(seed)(test)
    try:
        test()
    except Flaky as exc:
        if not seen:
            raise
        first = seen[0]
        raise AssertionError(
            f"{first} [seen while generating examples; Hypothesis could not replay it "
            f"({type(exc).__name__}): the defect depends on timing]"
        ) from exc
