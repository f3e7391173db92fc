"""The contract type: one contract's clauses and the parts a run of it needs.

Each contract family declares its contracts with :class:`Contract` in its own
package (``conformance/contracts/<family>/contract.py``); the registry
(:mod:`conformance.contracts`) only collects them. A contract names its parts
by string (``MODULE:ATTR`` or a package name), imported with :func:`resolve`
only when a run needs them, so declaring one loads no suite, reference
implementation or mutant catalog. This module imports no family, so the
families' declarations can import it without a circle.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from conformance.clauses import Clause

__all__ = ["Contract", "resolve"]


@dataclass(frozen=True)
class Contract:
    """One contract: its clauses and the parts a run of it needs.

    Attributes:
        name: what ``--contract`` / ``--zmq-contract`` take (``p2p``).
        title: one line for ``list`` and the reports.
        clauses: the contract's clauses by ID (a slice of the registry).
        suite: packages whose directories hold its clause tests.
        chaos_suite: packages collected in addition with ``--chaos``.
        default_factory: ``MODULE:ATTR`` of the reference implementation, the
            implementation under test when none is configured.
        mutants: ``MODULE:ATTR`` of its self-check catalog (a tuple of
            :class:`conformance.selfcheck.Mutant`, or a callable returning
            one); imported by self-check only.
        fixture: the fixture through which its tests receive the
            implementation under test.
        make_spec: ``MODULE:ATTR`` of ``make_spec(factory, *, name, overrides,
            origin)``, which pairs a factory with its declared capabilities.
        capabilities: ``MODULE:ATTR`` of the capability dataclass (its fields
            are what ``--capability NAME=VALUE`` accepts).
        factory_shape: the call the suite makes, for error messages.
        probe: arguments (positional, keyword) the factory must accept; a
            factory whose signature cannot bind them does not fit.
        objects: the implementation may be a plain object (not callable),
            e.g. one with ``server``/``client`` attributes.
        preflight: ``MODULE:ATTR`` of ``preflight(spec)``, run once per session
            before any test (in the xdist controller); it raises
            :class:`conformance.errors.ConfigError` when no clause can be
            judged (a wire profile mismatch), which ends the run as a usage
            error with its message.
        nodes: ``MODULE:ATTR`` of ``nodes_spec(spec, mode, *, option)``, which
            applies a ``--nodes`` / ``--zmq-nodes`` choice
            (:data:`conformance.contracts.NODE_MODES`) to a spec; ``None``:
            the contract's nodes run in the test process only.
        driver: ``MODULE:ATTR`` of ``proxy(command, hello)``, the factory (or
            implementation object) that puts a driver process in place of a
            Python implementation (``--driver``, :mod:`conformance.drivers`);
            empty while the contract has no driver bridge.
        python_service: ``MODULE:ATTR`` of the family's
            :class:`conformance.drivers.serving.Service` subclass, through which
            the Python driver (``python -m conformance.drivers.python``) serves
            a Python implementation of this contract; empty: not served.
        workers_per_cpu: xdist workers per CPU of a ``zmq-conformance run``
            without ``-n`` (:meth:`default_workers`), rounded down. 2.5 where
            the tests mostly wait (p2p: heartbeat timeouts, "nothing arrives"
            windows, pauses), so more of them wait at once than there are
            CPUs (on 2 cores, 5 workers took a median 26.7 s against 28.1 s at
            4, five interleaved pairs); 1 where more workers than CPUs only
            add start-up (the KV and control runs took 20-40 % longer at 4
            workers than at 2).
    """

    name: str
    title: str
    clauses: Mapping[str, Clause]
    suite: tuple[str, ...]
    chaos_suite: tuple[str, ...]
    default_factory: str
    mutants: str
    fixture: str
    make_spec: str
    capabilities: str
    factory_shape: str
    probe: tuple[tuple[Any, ...], Mapping[str, Any]] = field(default=((), {}))
    objects: bool = False
    preflight: str = ""
    nodes: str | None = None
    driver: str = ""
    python_service: str = ""
    workers_per_cpu: float = 1

    def spec_builder(self) -> Callable[..., Any]:
        builder: Callable[..., Any] = resolve(self.make_spec)
        return builder

    def default_workers(self, cpus: int, *, driver: bool = False) -> int:
        """Workers for a host with ``cpus`` usable CPUs: :attr:`workers_per_cpu` per CPU,
        at least 2 (a worker that crashes costs its test, the other goes on) and at
        most 8 (each worker starts its own interpreter and fault proxy).

        Through a ``driver``, at most 2 per CPU: every call then costs CPU in two
        processes, so the run is CPU-bound sooner (on 2 cores p2p through the
        Python driver took 16.2-16.4 s at 4 workers, 17.8-17.9 s at 5).
        """
        per_cpu = min(self.workers_per_cpu, 2) if driver else self.workers_per_cpu
        return min(8, max(2, int(per_cpu * cpus)))

    def capability_type(self) -> type[Any]:
        kind: type[Any] = resolve(self.capabilities)
        return kind


def resolve(path: str) -> Any:
    """Import ``MODULE:ATTR`` of the project itself (a programming error if it fails)."""
    module_name, _, attr = path.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    return target
