"""Stateful machines: Hypothesis ``RuleBasedStateMachine``s over real nodes.

:mod:`~conformance.machines.model` holds the model of what must be true;
:mod:`~conformance.machines.cluster` drives a cluster of real nodes against it.
The suite runs them in ``conformance/suite/test_machines.py``.
"""

from __future__ import annotations

from typing import Any, cast

from hypothesis import settings as Settings
from hypothesis.stateful import RuleBasedStateMachine, get_state_machine_test

from conformance.machines.cluster import ClusterMachine, NodeRef
from conformance.machines.model import ClusterModel, Violation
from conformance.spec import TransportSpec

__all__ = ["ClusterMachine", "ClusterModel", "NodeRef", "Violation", "machine_test"]


def machine_test(machine: type[ClusterMachine], spec: TransportSpec,
                 settings: Settings) -> Any:
    """The Hypothesis test function that runs ``machine(spec)``; call it to run.

    ``run_state_machine_as_test`` is this, called at once; having the function
    lets callers apply ``hypothesis.seed`` first.
    """
    factory = cast(type[RuleBasedStateMachine], lambda: machine(spec))
    return get_state_machine_test(factory, settings=settings)
