"""Stateful machines: Hypothesis ``RuleBasedStateMachine``s over real nodes.

:mod:`~conformance.contracts.p2p.machines.model` holds the model of what must be true;
:mod:`~conformance.contracts.p2p.machines.cluster` drives a cluster of real nodes against it.
The suite runs them in ``conformance/contracts/p2p/suite/test_machines.py`` with
:func:`run_machine`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import cast

from hypothesis import seed as fixed_seed
from hypothesis import settings as Settings
from hypothesis.errors import Flaky
from hypothesis.internal.reflection import function_digest
from hypothesis.stateful import RuleBasedStateMachine, get_state_machine_test

from conformance.contracts.p2p.machines.cluster import ClusterMachine, NodeRef
from conformance.contracts.p2p.machines.model import ClusterModel, Violation

__all__ = [
    "ClusterMachine", "ClusterModel", "NodeRef", "Violation", "part_examples", "run_machine",
    "run_machine_part",
]


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


def part_examples(total: int, parts: int) -> int:
    """Examples per part when a machine's ``total`` examples are split into ``parts`` tests.

    Every Hypothesis run starts with the same simplest example, so ``parts``
    runs repeat it ``parts - 1`` times: each part gets one more than an even
    share of the rest, and together they run at least ``total`` distinct
    examples, as many as the unsplit run (``parts * (share - 1) >= total - 1``).
    """
    if parts < 1:
        raise ValueError(f"parts={parts!r}: expected at least 1")
    if parts == 1:
        return total
    return 1 + -(-(total - 1) // parts)


def run_machine_part(build: Callable[[], ClusterMachine], settings: Settings,
                     *, part: int, parts: int, name: str) -> None:
    """Run part ``part`` (0-based) of ``parts`` of the machines ``settings`` asks for.

    A machine's examples are independent, so a long machine split into
    ``parts`` tests (``@pytest.mark.parametrize("part", range(parts))``) runs
    them on several workers side by side: same step count per example, at
    least as many distinct examples in total (:func:`part_examples`).

    Each part draws from its own seed, derived from the run's (the one
    ``--hypothesis-seed`` or a re-run sets, read when the test runs) and
    ``name`` and ``part``, so a run stays reproducible from its seed and the
    parts never draw the same examples. Without a run seed (plain pytest)
    Hypothesis draws a fresh one per part anyway.
    """
    from hypothesis import core

    if not 0 <= part < parts:
        raise ValueError(f"part={part!r}: expected 0 <= part < parts={parts}")
    share = settings.__class__(settings, max_examples=part_examples(settings.max_examples, parts))
    run_seed = core.global_force_seed
    seed = None
    if run_seed is not None and parts > 1:
        seed = random.Random(f"{run_seed}|{name}|part {part} of {parts}").getrandbits(64)
    run_machine(build, share, seed=seed if parts > 1 else None)
