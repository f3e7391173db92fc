"""The mutant catalog: deliberately broken transports the suite must catch.

Each :class:`Mutant` names a transport factory (``MODULE:ATTR``) that differs
from a working *base* transport by one documented defect, the real failure
mode it models, and the clauses whose tests must fail against it.
``zmq-conformance self-check`` runs the suite against every entry and reports
which survived: a surviving mutant means a clause test is too weak (or, for a
user's own catalog, that an expected-failure list hides a real bug).

Each contract has a built-in catalog derived from its reference
implementation (:attr:`conformance.contracts.Contract.mutants`; for ``p2p``,
:data:`conformance.contracts.p2p.mutants.CATALOG`). Users add their
own with ``--extra MODULE:ATTR`` (an iterable of :class:`Mutant`, or a
callable returning one) or through the entry-point group
``zmq_conformance.mutants`` (see ``docs/mutants.md``).

This module is never imported by the plugin or the suite: self-check is
tooling around the suite, not part of a normal run.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from conformance import contracts
from conformance.config.loading import DEFAULT_TRANSPORT
from conformance.contracts import CLAUSES, DEFAULT_CONTRACT
from conformance.errors import ConfigError

__all__ = [
    "ENTRY_POINT_GROUP",
    "FailureMode",
    "Mutant",
    "builtin_catalog",
    "by_name",
    "contract_of",
    "load_catalog",
    "load_extra",
    "validate",
]

ENTRY_POINT_GROUP: Final = "zmq_conformance.mutants"

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class FailureMode:
    """A real-world way transports of this shape break.

    ``design`` marks the bug classes ``DESIGN.md`` lists under "Bug classes the
    suite must catch"; the catalog must cover each of them.
    """

    key: str
    description: str
    design: bool = False


@dataclass(frozen=True)
class Mutant:
    """One catalog entry.

    Attributes:
        name: unique, ``snake_case``; used on the command line (``--mutant``).
        factory: ``MODULE:ATTR`` of the mutant transport factory.
        description: the defect, in one sentence.
        models: a key of the contract's ``FAILURE_MODES`` (for user catalogs: any
            short text).
        clauses: the clause IDs whose tests must fail against the mutant;
            self-check runs the tests of these clauses first.
        chaos: killing it needs the fault-injecting proxy; runs only with
            ``--chaos``.
        base: the unmutated factory it derives from; self-check runs it too and
            it must pass every selected clause.
        isolate: its targeted run needs a process of its own (the default): its
            defect can hang, abort or spin, or leaves threads, sockets or a
            context behind after its tests. ``False`` lets self-check run it in
            one process with other such mutants (:mod:`conformance.selfcheck.batch`),
            which saves the start-up of a run per mutant.
    """

    name: str
    factory: str
    description: str
    models: str
    clauses: tuple[str, ...]
    chaos: bool = False
    base: str = DEFAULT_TRANSPORT
    isolate: bool = True


def validate(mutants: Sequence[Mutant], *, origin: str = "catalog") -> None:
    """Raise :class:`ConfigError` for a malformed catalog (names, clauses, factories)."""
    seen: set[str] = set()
    for mutant in mutants:
        if not isinstance(mutant, Mutant):
            raise ConfigError(f"{origin}: {mutant!r} is not a conformance.selfcheck.Mutant")
        where = f"{origin}: mutant {mutant.name!r}"
        if not _NAME.match(mutant.name):
            raise ConfigError(f"{where}: names are snake_case ([a-z][a-z0-9_]*)")
        if mutant.name in seen:
            raise ConfigError(f"{where}: duplicate name")
        seen.add(mutant.name)
        if not mutant.clauses:
            raise ConfigError(f"{where}: names no target clause")
        unknown = [c for c in mutant.clauses if c not in CLAUSES]
        if unknown:
            raise ConfigError(
                f"{where}: unknown clause {unknown[0]!r}; known: {', '.join(CLAUSES)}"
            )
        owners = {getattr(contracts.contract_of(c), "name", None) for c in mutant.clauses}
        if len(owners) > 1:
            names = ", ".join(sorted(map(str, owners)))
            raise ConfigError(f"{where}: targets clauses of several contracts ({names})")
        if not mutant.chaos and all(CLAUSES[c].chaos for c in mutant.clauses):
            raise ConfigError(f"{where}: targets only chaos clauses but is not marked chaos")
        for path in (mutant.factory, mutant.base):
            module, sep, attr = path.partition(":")
            if not sep or not module or not attr:
                raise ConfigError(f"{where}: {path!r} is not MODULE:ATTR")


def by_name(mutants: Iterable[Mutant]) -> dict[str, Mutant]:
    return {m.name: m for m in mutants}


def load_extra(path: str, *, option: str = "--extra") -> tuple[Mutant, ...]:
    """Load a user catalog ``MODULE:ATTR``: an iterable of Mutant or a callable returning one."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{option}={path!r}: expected MODULE:ATTR, e.g. mypkg.mutants:CATALOG")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{option}={path!r}: cannot import {module_name!r}: {exc}") from None
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(f"{option}={path!r}: no attribute {attr!r}") from None
    return _as_catalog(target, origin=f"{option}={path!r}")


def _as_catalog(target: Any, *, origin: str) -> tuple[Mutant, ...]:
    if callable(target) and not isinstance(target, Mutant):
        target = target()
    if isinstance(target, Mutant):
        return (target,)
    try:
        items = tuple(target)
    except TypeError:
        raise ConfigError(f"{origin}: expected an iterable of Mutant") from None
    validate(items, origin=origin)
    return items


def _entry_point_catalogs() -> list[tuple[str, tuple[Mutant, ...]]]:
    found: list[tuple[str, tuple[Mutant, ...]]] = []
    for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        origin = f"entry point {point.name} ({point.value}) in {ENTRY_POINT_GROUP}"
        try:
            target = point.load()
        except Exception as exc:
            raise ConfigError(f"{origin}: cannot load: {type(exc).__name__}: {exc}") from None
        found.append((origin, _as_catalog(target, origin=origin)))
    return found


def builtin_catalog(contract: str = DEFAULT_CONTRACT) -> tuple[Mutant, ...]:
    """The built-in catalog of ``contract`` (:attr:`Contract.mutants`)."""
    path = contracts.get(contract).mutants
    return _as_catalog(contracts.resolve(path), origin=f"built-in catalog {path}")


def contract_of(mutant: Mutant) -> str:
    """The contract whose clauses ``mutant`` targets (``validate`` checks it is one)."""
    found = contracts.contract_of(mutant.clauses[0])
    return found.name if found is not None else DEFAULT_CONTRACT


def load_catalog(
    extras: Sequence[str] = (), *, builtin: bool = True, entry_points: bool = True,
    contract: str = DEFAULT_CONTRACT,
) -> tuple[Mutant, ...]:
    """``contract``'s built-in catalog, plus entry-point catalogs, plus ``--extra`` ones
    (in that order), keeping the mutants that target ``contract``'s clauses.

    Raises :class:`ConfigError` on a bad extra or a name used twice.
    """
    combined: list[Mutant] = list(builtin_catalog(contract)) if builtin else []
    if entry_points:
        for _origin, items in _entry_point_catalogs():
            combined.extend(items)
    for path in extras:
        combined.extend(load_extra(path))
    validate(combined, origin="combined catalog")
    return tuple(m for m in combined if contract_of(m) == contract)
