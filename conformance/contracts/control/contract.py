"""The ``control`` contract's registry entry: its clauses and where its parts live."""

from __future__ import annotations

from typing import Final

from conformance.contract import Contract
from conformance.contracts.control.clauses import CLAUSES

__all__ = ["CONTRACTS"]

CONTRACTS: Final = (
    Contract(
        name="control",
        title="worker/server control channel (request/reply, PING heartbeats, re-registration)",
        clauses=CLAUSES,
        suite=("conformance.contracts.control.suite",),
        chaos_suite=("conformance.contracts.control.chaos_suite",),
        default_factory="reference_impl.control:REFERENCE",
        mutants="conformance.contracts.control.mutants:CATALOG",
        fixture="control_spec",
        make_spec="conformance.contracts.control.spec:make_spec",
        capabilities="conformance.contracts.control.spec:ControlCapabilities",
        factory_shape="an object with factories server(endpoint, handlers) and/or "
        "client(endpoint, *, heartbeat_ivl_ms, heartbeat_timeout_ms, request_timeout_ms, "
        "register), or a callable of no arguments returning one",
        probe=((), {}),
        driver="conformance.contracts.control.driver:ControlDriver",
        python_service="conformance.contracts.control.service:ControlService",
        objects=True,
        preflight="conformance.contracts.control.preflight:check_profile",
    ),
)
