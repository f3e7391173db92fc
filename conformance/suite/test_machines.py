"""Stateful machines against the transport under test (CONN-*, POLL-*, MSG-*, RES-*).

Each test runs one machine of :mod:`conformance.machines` through
``run_state_machine_as_test`` under the active profile: a failure prints the
shrunk sequence of steps that breaks the transport and an assertion message
that starts with the clause ID.
"""

from __future__ import annotations

import pytest

from conformance import profiles
from conformance.machines import ClusterMachine, machine_test
from conformance.spec import TransportSpec

#: Clauses the cluster machine checks (each has an assertion naming it).
CLUSTER_CLAUSES = (
    "CONN-1", "CONN-2", "CONN-3", "CONN-4", "CONN-5", "CONN-6", "CONN-7",
    "POLL-1", "POLL-2", "POLL-3", "POLL-5",
    "MSG-1", "MSG-2", "MSG-4",
    "RES-1", "RES-2",
)


@pytest.mark.clause(*CLUSTER_CLAUSES)
def test_cluster_machine(zmq_transport_spec: TransportSpec) -> None:
    """2-4 nodes: connect, send, poll, settle, mark dead, close, reconnect, restart,
    flap and hostile frames, checked step by step against the model."""
    machine_test(ClusterMachine, zmq_transport_spec, profiles.suite_settings())()
