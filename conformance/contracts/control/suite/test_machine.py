"""The control-channel state machine (see :mod:`conformance.contracts.control.machine`).

One test per side under test, so that a clause is only ever judged on
evidence about the side that provides it: the machine on both sides judges
CTL-3..6; with the reference client it judges the server (CTL-3); with the
reference server it judges the client (CTL-4..6).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from conformance.contracts.control.machine import ControlMachine, Side, machine_settings, run
from conformance.contracts.control.spec import ControlSpec

Recorder = Callable[[str, object], None]


def _run(spec: ControlSpec, side: Side, record_property: Recorder) -> None:
    if spec.server is not None:
        spec.require_added_handlers("CTL-3" if side != "client" else "CTL-4",
                                    "the suite's echo, slow and failing handlers for the "
                                    "machine")
    spec.require_suite_types("CTL-4")
    built: list[ControlMachine] = []

    def build() -> ControlMachine:
        built.append(ControlMachine(spec))
        return built[-1]

    try:
        run(build, machine_settings(), side)
    finally:
        record_property("examples", len(built))


def _sides(spec: ControlSpec) -> Side:
    if spec.server is not None and spec.client is not None:
        return "both"
    return "server" if spec.server is not None else "client"


@pytest.mark.clause("CTL-3", "CTL-4", "CTL-5", "CTL-6")
def test_control_machine(control_spec: ControlSpec, record_property: Recorder) -> None:
    """Requests, slow and failing handlers, heartbeats, restarts and outages against the model."""
    if _sides(control_spec) != "both":
        pytest.skip(f"the machine on both sides needs a server and a client, and "
                    f"{control_spec.name} provides only a {_sides(control_spec)}")
    _run(control_spec, "both", record_property)


@pytest.mark.clause("CTL-3")
def test_control_machine_server_side(control_spec: ControlSpec,
                                     record_property: Recorder) -> None:
    """The machine with the reference client: the server keeps serving through it all."""
    if _sides(control_spec) != "server":
        pytest.skip("the server-side machine runs for an implementation with a server and no "
                    "client (the machine on both sides covers the rest)")
    _run(control_spec, "server", record_property)


@pytest.mark.clause("CTL-4", "CTL-5", "CTL-6")
def test_control_machine_client_side(control_spec: ControlSpec,
                                     record_property: Recorder) -> None:
    """The machine with the reference server: the client's timeouts, heartbeats, re-registration."""
    if _sides(control_spec) != "client":
        pytest.skip("the client-side machine runs for an implementation with a client and no "
                    "server (the machine on both sides covers the rest)")
    _run(control_spec, "client", record_property)
