"""The contract families: which contracts exist, and where each one's parts live.

The core (:mod:`conformance`: registry, supervision, configuration, verdicts
and reports, plugin, CLI, self-check; :mod:`chaos`: fault injection) knows no
contract by heart; this module is the only one of the core that names the
families (see ``docs/architecture.md``). Each contract is one :class:`Contract`
entry below, pointing at its family package under ``conformance/contracts/``:

- ``p2p`` (:mod:`conformance.contracts.p2p`): the peer-to-peer control
  transport (ROUTER in, DEALER per peer), clauses CONN, POLL, MSG, HB, RES, SEC;
- ``kv-events-publisher`` and ``kv-events-subscriber``
  (:mod:`conformance.contracts.kv_events`): the KV-cache event stream
  (PUB + replay ROUTER), the publisher under test (EVT) or the consumer under
  test (EVS);
- ``control`` (:mod:`conformance.contracts.control`): the worker/server control
  channel, request/reply with PING heartbeats (CTL);
- ``engine-pipeline`` (:mod:`conformance.contracts.engine_pipeline`): API
  servers and EngineCore processes (vllm-v1 profile), PIPE.

Everything a run needs is named by string (``MODULE:ATTR`` or package name)
and imported only when used, so importing this module stays cheap and never
loads a suite, a reference implementation or the mutant catalog.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from conformance.clauses import Clause, merge
from conformance.contracts.control.clauses import CLAUSES as _CONTROL
from conformance.contracts.engine_pipeline.clauses import CLAUSES as _PIPELINE
from conformance.contracts.kv_events.publisher.clauses import CLAUSES as _PUBLISHER
from conformance.contracts.kv_events.subscriber.clauses import CLAUSES as _SUBSCRIBER
from conformance.contracts.p2p.clauses import CLAUSES as _P2P
from conformance.errors import ConfigError

__all__ = [
    "CLAUSES", "CONTRACTS", "DEFAULT_CONTRACT", "NODE_MODES", "Contract", "clause",
    "contract_of", "get", "resolve",
]

_KV_ENDPOINTS: Final = ("tcp://127.0.0.1:1", "tcp://127.0.0.1:2")


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
            :class:`ConfigError` when no clause can be judged (a wire profile
            mismatch), which ends the run as a usage error with its message.
        nodes: ``MODULE:ATTR`` of ``nodes_spec(spec, mode, *, option)``, which
            applies a ``--nodes`` / ``--zmq-nodes`` choice (:data:`NODE_MODES`)
            to a spec; ``None``: the contract's nodes run in the test process only.
        driver: ``MODULE:ATTR`` of ``proxy(command, hello)``, the factory (or
            implementation object) that puts a driver process in place of a
            Python implementation (``--driver``, :mod:`conformance.drivers`);
            empty while the contract has no driver bridge.
        python_service: ``MODULE:ATTR`` of the family's
            :class:`conformance.drivers.serving.Service` subclass, through which
            the Python driver (``python -m conformance.drivers.python``) serves
            a Python implementation of this contract; empty: not served.
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

    def spec_builder(self) -> Callable[..., Any]:
        builder: Callable[..., Any] = resolve(self.make_spec)
        return builder

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


_P2P_CONTRACT = Contract(
    name="p2p",
    title="peer-to-peer control transport (ROUTER in, DEALER per peer, ZMTP heartbeats)",
    clauses=_P2P,
    suite=("conformance.contracts.p2p.suite",),
    chaos_suite=("conformance.contracts.p2p.chaos_suite",),
    default_factory="reference_impl:ZmqTransport",
    mutants="conformance.contracts.p2p.mutants:CATALOG",
    fixture="zmq_transport_spec",
    make_spec="conformance.contracts.p2p.spec:make_spec",
    capabilities="conformance.contracts.p2p.spec:Capabilities",
    factory_shape="factory(local_id: str, host: str, port: int)",
    probe=(("127.0.0.1:1", "127.0.0.1", 1), {}),
    nodes="conformance.contracts.p2p.process_nodes:nodes_spec",
    driver="conformance.contracts.p2p.driver:TransportFactory",
    python_service="conformance.contracts.p2p.driver:TransportService",
)

_PUBLISHER_CONTRACT = Contract(
    name="kv-events-publisher",
    title="KV-cache event publisher under test (PUB + replay ROUTER)",
    clauses=_PUBLISHER,
    suite=("conformance.contracts.kv_events.publisher.suite",),
    chaos_suite=(),
    default_factory="reference_impl.kv_events.publisher:KVEventPublisher",
    mutants="conformance.contracts.kv_events.publisher.mutants:CATALOG",
    fixture="kv_publisher_spec",
    make_spec="conformance.contracts.kv_events.spec:make_spec",
    capabilities="conformance.contracts.kv_events.spec:PublisherCapabilities",
    factory_shape="factory(endpoint: str, replay_endpoint: str, *, topic: str)",
    probe=(_KV_ENDPOINTS, {"topic": ""}),
    driver="conformance.contracts.kv_events.driver:PublisherFactory",
    python_service="conformance.contracts.kv_events.driver:PublisherService",
)

_SUBSCRIBER_CONTRACT = Contract(
    name="kv-events-subscriber",
    title="KV-cache event consumer under test (SUB + replay client)",
    clauses=_SUBSCRIBER,
    suite=("conformance.contracts.kv_events.subscriber.suite",),
    chaos_suite=(),
    default_factory="reference_impl.kv_events.subscriber:KVEventSubscriber",
    mutants="conformance.contracts.kv_events.subscriber.mutants:selfcheck_catalog",
    fixture="kv_subscriber_spec",
    make_spec="conformance.contracts.kv_events.spec:make_subscriber_spec",
    capabilities="conformance.contracts.kv_events.spec:SubscriberCapabilities",
    factory_shape="factory(endpoint: str, replay_endpoint: str, *, topic: str)",
    probe=(_KV_ENDPOINTS, {"topic": ""}),
    driver="conformance.contracts.kv_events.driver:SubscriberFactory",
    python_service="conformance.contracts.kv_events.driver:SubscriberService",
)

_CONTROL_CONTRACT = Contract(
    name="control",
    title="worker/server control channel (request/reply, PING heartbeats, re-registration)",
    clauses=_CONTROL,
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
    python_service="conformance.contracts.control.driver:ControlService",
    objects=True,
    preflight="conformance.contracts.control.preflight:check_profile",
)

_PIPELINE_CONTRACT = Contract(
    name="engine-pipeline",
    title="API server <-> EngineCore pipeline (vllm-v1: ROUTER/DEALER, PUSH/PULL, aux frames)",
    clauses=_PIPELINE,
    suite=("conformance.contracts.engine_pipeline.suite",),
    chaos_suite=("conformance.contracts.engine_pipeline.chaos_suite",),
    default_factory="reference_impl.engine_pipeline:REFERENCE",
    mutants="conformance.contracts.engine_pipeline.mutants:CATALOG",
    fixture="pipeline_spec",
    make_spec="conformance.contracts.engine_pipeline.spec:make_spec",
    capabilities="conformance.contracts.engine_pipeline.spec:PipelineCapabilities",
    factory_shape="an object with factories engine(addresses, *, engine_index, model) and/or "
    "client(addresses, *, client_index, client_count, engine_indices), or a callable of no "
    "arguments returning one",
    probe=((), {}),
    driver="conformance.contracts.engine_pipeline.driver:PipelineDriver",
    python_service="conformance.contracts.engine_pipeline.driver:PipelineService",
)

#: Every contract by name, in the order ``list`` shows them.
CONTRACTS: Final[dict[str, Contract]] = {
    c.name: c
    for c in (_P2P_CONTRACT, _PUBLISHER_CONTRACT, _SUBSCRIBER_CONTRACT, _CONTROL_CONTRACT,
              _PIPELINE_CONTRACT)
}
DEFAULT_CONTRACT: Final = "p2p"
#: Where a contract's nodes may run (``--nodes`` / ``--zmq-nodes``); ``process``
#: exists for the contracts with a ``nodes`` entry only.
NODE_MODES: Final = ("inprocess", "process")

#: Every clause of every contract, contract by contract; an ID claimed twice is an error.
CLAUSES: Final[dict[str, Clause]] = merge((_P2P, _PUBLISHER, _SUBSCRIBER, _CONTROL, _PIPELINE))


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
