"""The contract registry: every contract the suite knows, collected from the families.

The core (:mod:`conformance`: registry, supervision, configuration, verdicts
and reports, plugin, CLI, self-check; :mod:`chaos`: fault injection) knows no
contract by heart; this module is the only one of the core that names the
families (see ``docs/architecture.md``). Each family declares its contracts
once, as :class:`Contract` entries in its own ``contract.py``, and this module
collects them:

- ``p2p`` (:mod:`conformance.contracts.p2p`): the peer-to-peer control
  transport (ROUTER in, DEALER per peer), clauses CONN, POLL, MSG, HB, PROC, RES, SEC;
- ``kv-events-publisher`` and ``kv-events-subscriber``
  (:mod:`conformance.contracts.kv_events`): the KV-cache event stream
  (PUB + replay ROUTER), the publisher under test (EVT) or the consumer under
  test (EVS);
- ``control`` (:mod:`conformance.contracts.control`): the worker/server control
  channel, request/reply with PING heartbeats (CTL);
- ``engine-pipeline`` (:mod:`conformance.contracts.engine_pipeline`): API
  servers and EngineCore processes (vllm-v1 profile), PIPE.

A contract names everything a run needs by string (``MODULE:ATTR`` or package
name), imported only when used (:func:`resolve`), so importing this module
stays cheap and never loads a suite, a reference implementation or the mutant
catalog.
"""

from __future__ import annotations

from typing import Final

from conformance.clauses import Clause, merge
from conformance.contract import Contract, resolve
from conformance.contracts.control import contract as _control
from conformance.contracts.engine_pipeline import contract as _engine_pipeline
from conformance.contracts.kv_events import contract as _kv_events
from conformance.contracts.p2p import contract as _p2p
from conformance.errors import ConfigError

__all__ = [
    "CLAUSES", "CONTRACTS", "DEFAULT_CONTRACT", "NODE_MODES", "Contract", "clause",
    "contract_of", "get", "resolve",
]

#: Every contract by name, in the order ``list`` shows them.
CONTRACTS: Final[dict[str, Contract]] = {
    contract.name: contract
    for family in (_p2p, _kv_events, _control, _engine_pipeline)
    for contract in family.CONTRACTS
}
DEFAULT_CONTRACT: Final = "p2p"
#: Where a contract's nodes may run (``--nodes`` / ``--zmq-nodes``); ``process``
#: exists for the contracts with a ``nodes`` entry only.
NODE_MODES: Final = ("inprocess", "process")

#: Every clause of every contract, contract by contract; an ID claimed twice is an error.
CLAUSES: Final[dict[str, Clause]] = merge(c.clauses for c in CONTRACTS.values())


def clause(clause_id: str) -> Clause:
    """Return the clause with this ID, or raise ``KeyError`` naming the known IDs."""
    try:
        return CLAUSES[clause_id]
    except KeyError:
        known = ", ".join(CLAUSES)
        raise KeyError(f"unknown clause {clause_id!r}; known clauses: {known}") from None


def get(name: str, *, option: str = "--contract") -> Contract:
    """The contract called ``name``; :class:`ConfigError` naming the known ones otherwise."""
    try:
        return CONTRACTS[name]
    except KeyError:
        raise ConfigError(
            f"{option}={name!r}: unknown contract; choose one of {', '.join(CONTRACTS)}"
        ) from None


def contract_of(clause_id: str) -> Contract | None:
    """The contract a clause belongs to (``None`` for an unknown ID)."""
    for contract in CONTRACTS.values():
        if clause_id in contract.clauses:
            return contract
    return None
