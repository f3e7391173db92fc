"""Stateful machines: Hypothesis ``RuleBasedStateMachine``s over real nodes.

:mod:`~conformance.machines.model` holds the model of what must be true;
:mod:`~conformance.machines.cluster` drives a cluster of real nodes against it.
The suite runs them in ``conformance/suite/test_machines.py`` with
:func:`run_machine`.
"""

from __future__ import annotations

from typing import cast

from hypothesis import seed as fixed_seed
from hypothesis import settings as Settings
from hypothesis.errors import Flaky
from hypothesis.stateful import RuleBasedStateMachine, get_state_machine_test

from conformance.machines.cluster import ClusterMachine, NodeRef
from conformance.machines.model import ClusterModel, Violation
from conformance.spec import TransportSpec

__all__ = ["ClusterMachine", "ClusterModel", "NodeRef", "Violation", "run_machine"]


def run_machine(machine: type[ClusterMachine], spec: TransportSpec, settings: Settings,
                *, seed: int | None = None) -> None:
    """Run ``machine(spec)`` as a Hypothesis test; raise the shrunk failure, if any.

    A defect that depends on timing may not reproduce when Hypothesis replays
    the failing example; Hypothesis then raises ``Flaky*`` (for a replay that
    fails at an earlier step: "inconsistent data generation"), which names no
    clause. That is turned into an ``AssertionError`` carrying the first
    failure seen, so the report still starts with the clause ID.
    """
    seen: list[AssertionError] = []

    def build() -> ClusterMachine:
        instance = machine(spec)
        instance.failure_log = seen
        return instance

    test = get_state_machine_test(cast(type[RuleBasedStateMachine], build), settings=settings)
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
