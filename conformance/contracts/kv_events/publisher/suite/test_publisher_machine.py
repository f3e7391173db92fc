"""The publisher's stateful machine (:mod:`..machine`) as a suite test.

Steps per run and runs follow the profile (``--zmq-profile``), capped so the
contract's default run stays short; the shrunk counterexample lists the
steps (``state.publish(count=3)``, ``state.restart()``, ...).
"""

from __future__ import annotations

import pytest
from hypothesis.errors import FlakyFailure
from hypothesis.stateful import run_state_machine_as_test

from conformance.config import profiles
from conformance.contracts.kv_events.publisher.machine import PublisherMachine
from conformance.contracts.kv_events.spec import PublisherSpec


@pytest.mark.clause("EVT-1", "EVT-2", "EVT-4")
def test_publisher_machine(kv_publisher_spec: PublisherSpec) -> None:
    """Publish, subscribe (reading or stalled), leave, unstall, replay and restart in
    any order; every stream and every replay follows the per-incarnation model."""
    machine = type("PublisherMachineUnderTest", (PublisherMachine,),
                   {"spec": kv_publisher_spec})
    active = profiles.active()
    settings = profiles.suite_settings(
        max_examples=min(active.max_examples, 8),
        stateful_step_count=min(active.stateful_step_count, 20),
    )
    try:
        run_state_machine_as_test(machine, settings=settings)
    except FlakyFailure as flaky:
        # A failure that did not recur on replay: report what failed, not Hypothesis's
        # wrapper (whose message names no clause, so it would blame all three).
        raise flaky.exceptions[0] from None
