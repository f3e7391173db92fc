"""The clause type: one requirement of one contract, by stable ID.

A clause is one requirement of one contract (``p2p``,
``kv-events-publisher``, ``kv-events-subscriber``, ``control``). Each contract family
writes its clause texts in its own package
(``conformance/contracts/<family>/.../clauses.py``) with :class:`Clause` and
:func:`clause_table`; the registry (:mod:`conformance.contracts`) merges those
tables into ``conformance.contracts.CLAUSES``, the single source of truth the
plugin, the reports and ``zmq-conformance list`` read. This module imports no
family, so the families' tables can import it without a circle.
Every test names one or more IDs with ``@pytest.mark.clause("CONN-1")``;
reports are aggregated per clause. IDs are unique across contracts (each
family has its own prefixes) and never change meaning once published.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


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
