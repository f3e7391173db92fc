"""The control-channel state machine (see :mod:`conformance.contracts.control.machine`)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from conformance.contracts.control.machine import ControlMachine, machine_settings, run
from conformance.contracts.control.spec import ControlSpec


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
