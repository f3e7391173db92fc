"""The control-channel state machine (see :mod:`conformance.contracts.control.machine`)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import settings

from conformance import profiles
from conformance.contracts.control.machine import ControlMachine, run
from conformance.contracts.control.spec import ControlSpec


def machine_settings() -> settings:
    """Half the profile's examples and half its steps: each step waits on the network."""
    profile = profiles.active()
    return profiles.suite_settings(max_examples=max(4, profile.max_examples // 2),
                                   stateful_step_count=max(8, profile.stateful_step_count // 2))


@pytest.mark.clause("CTL-3", "CTL-4", "CTL-5", "CTL-6")
def test_control_machine(control_spec: ControlSpec,
                         record_property: Callable[[str, object], None]) -> None:
    """Requests, slow and failing handlers, heartbeats, restarts and outages against the model."""
    built: list[ControlMachine] = []

    def build() -> ControlMachine:
        built.append(ControlMachine(control_spec))
        return built[-1]

    try:
        run(build, machine_settings())
    finally:
        record_property("examples", len(built))
