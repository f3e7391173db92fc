"""Stateful machines against the transport under test (CONN-*, POLL-*, MSG-*, RES-*).

Each test runs one machine of :mod:`conformance.contracts.p2p.machines` under the active
profile: a failure prints the shrunk sequence of steps that breaks the
transport (as Hypothesis prints them) and an assertion message that starts
with the clause ID, e.g. ``MSG-2: message #3 n0->n1 (sent on n0>n1#1)
duplicated: ...``.

Budget: one example is a fresh cluster of 2-4 nodes driven for
``stateful_step_count`` steps and settled at the end, a few milliseconds per
step on loopback. The machines run ``EXAMPLES_SCALE`` times the profile's
``max_examples`` (``ci``: 60 examples of 25 steps, a few seconds;
``thorough``: 1600 examples of 80 steps).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from conformance.config import profiles
from conformance.contracts.p2p.machines import ClusterMachine, run_machine_part
from conformance.contracts.p2p.spec import TransportSpec

#: Machines are cheap per example and find races only by volume.
EXAMPLES_SCALE = 4

#: The cluster machine's examples run as this many tests, on workers side by side
#: (:func:`~conformance.contracts.p2p.machines.run_machine_part`).
MACHINE_PARTS = 2

#: Clauses the cluster machine checks (each has an assertion naming it).
CLUSTER_CLAUSES = (
    "CONN-1", "CONN-2", "CONN-3", "CONN-4", "CONN-5", "CONN-6", "CONN-7",
    "POLL-1", "POLL-2", "POLL-3", "POLL-5",
    "MSG-1", "MSG-2", "MSG-4",
    "RES-1", "RES-2",
)


@pytest.mark.clause(*CLUSTER_CLAUSES)
@pytest.mark.long(8)
@pytest.mark.parametrize("part", range(MACHINE_PARTS))
def test_cluster_machine(
    zmq_transport_spec: TransportSpec, record_property: Callable[[str, object], None],
    part: int,
) -> None:
    """2-4 nodes: connect, send, poll, settle, mark dead, close, reconnect, restart,
    flap and hostile frames, checked step by step against the model (one of
    :data:`MACHINE_PARTS` shares of the examples)."""
    profile = profiles.active()
    settings = profiles.suite_settings(max_examples=EXAMPLES_SCALE * profile.max_examples)
    built: list[ClusterMachine] = []

    def build() -> ClusterMachine:
        built.append(ClusterMachine(zmq_transport_spec))
        return built[-1]

    try:
        run_machine_part(build, settings, part=part, parts=MACHINE_PARTS,
                         name="test_cluster_machine")
    finally:
        record_property("examples", len(built))
