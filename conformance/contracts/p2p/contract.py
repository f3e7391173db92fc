"""The ``p2p`` contract's registry entry: its clauses and where its parts live."""

from __future__ import annotations

from typing import Final

from conformance.contract import Contract
from conformance.contracts.p2p.clauses import CLAUSES

__all__ = ["CONTRACTS"]

CONTRACTS: Final = (
    Contract(
        name="p2p",
        title="peer-to-peer control transport (ROUTER in, DEALER per peer, ZMTP heartbeats)",
        clauses=CLAUSES,
        suite=("conformance.contracts.p2p.suite",),
        chaos_suite=("conformance.contracts.p2p.chaos_suite",),
        default_factory="reference_impl:ZmqTransport",
        mutants="conformance.contracts.p2p.mutants:CATALOG",
        fixture="zmq_transport_spec",
        make_spec="conformance.contracts.p2p.spec:make_spec",
        capabilities="conformance.contracts.p2p.spec:Capabilities",
        factory_shape="factory(local_id: str, host: str, port: int)",
        workers_per_cpu=2.5,
        probe=(("127.0.0.1:1", "127.0.0.1", 1), {}),
        nodes="conformance.contracts.p2p.process_nodes:nodes_spec",
        driver="conformance.contracts.p2p.driver:TransportFactory",
        python_service="conformance.contracts.p2p.service:TransportService",
    ),
)
