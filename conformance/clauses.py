"""The clause registry: every clause of every contract, by stable ID.

A clause is one requirement of one contract (``p2p``,
``kv-events-publisher``, ``kv-events-subscriber``, ``control``). Each contract family
writes its clause texts in its own package
(``conformance/contracts/<family>/.../clauses.py``); this module defines
:class:`Clause` and merges those tables into :data:`CLAUSES`, the single
source of truth the plugin, the reports and ``zmq-conformance list`` read.
Every test names one or more IDs with ``@pytest.mark.clause("CONN-1")``;
reports are aggregated per clause. IDs are unique across contracts (each
family has its own prefixes) and never change meaning once published.
:mod:`conformance.contracts` says which clauses belong to which contract.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class Clause:
    """One requirement of a contract.

    ``family`` groups clauses in reports (``CONN``, ``POLL``, ``EVT``, ...);
    ``chaos`` clauses need a fault-injecting proxy and run only on request.
    """

    id: str
    title: str
    requirement: str
    chaos: bool = False

    @property
    def family(self) -> str:
        return self.id.split("-", 1)[0]


def clause_table(*items: Clause) -> dict[str, Clause]:
    """A contract's clauses by ID, in the order given; a repeated ID is an error."""
    table: dict[str, Clause] = {}
    for item in items:
        if item.id in table:
            raise ValueError(f"duplicate clause id {item.id}")
        table[item.id] = item
    return table


def merge(tables: Iterable[Mapping[str, Clause]]) -> dict[str, Clause]:
    """One table of several contracts' clauses; an ID claimed twice is an error."""
    return clause_table(*(c for table in tables for c in table.values()))


def get(clause_id: str) -> Clause:
    """Return the clause with this ID, or raise ``KeyError`` naming the known IDs."""
    try:
        return CLAUSES[clause_id]
    except KeyError:
        known = ", ".join(CLAUSES)
        raise KeyError(f"unknown clause {clause_id!r}; known clauses: {known}") from None


# The families' tables import Clause from this module, so they load after it
# is defined (conformance.contracts imports this module before any family).
from conformance.contracts.control.clauses import CLAUSES as _CONTROL  # noqa: E402
from conformance.contracts.engine_pipeline.clauses import CLAUSES as _PIPELINE  # noqa: E402
from conformance.contracts.kv_events.publisher.clauses import (  # noqa: E402
    CLAUSES as _PUBLISHER,
)
from conformance.contracts.kv_events.subscriber.clauses import (  # noqa: E402
    CLAUSES as _SUBSCRIBER,
)
from conformance.contracts.p2p.clauses import CLAUSES as _P2P  # noqa: E402

#: Every clause of every contract, contract by contract (see conformance.contracts).
CLAUSES: Final[dict[str, Clause]] = merge((_P2P, _PUBLISHER, _SUBSCRIBER, _CONTROL, _PIPELINE))
