"""The KV-event contracts' registry entries: the publisher and the subscriber under test."""

from __future__ import annotations

from typing import Final

from conformance.contract import Contract
from conformance.contracts.kv_events.publisher.clauses import CLAUSES as PUBLISHER_CLAUSES
from conformance.contracts.kv_events.subscriber.clauses import CLAUSES as SUBSCRIBER_CLAUSES

__all__ = ["CONTRACTS"]

#: Endpoints the factory's signature is probed with (never bound).
_PROBE_ENDPOINTS: Final = ("tcp://127.0.0.1:1", "tcp://127.0.0.1:2")

CONTRACTS: Final = (
    Contract(
        name="kv-events-publisher",
        title="KV-cache event publisher under test (PUB + replay ROUTER)",
        clauses=PUBLISHER_CLAUSES,
        suite=("conformance.contracts.kv_events.publisher.suite",),
        chaos_suite=(),
        default_factory="reference_impl.kv_events.publisher:KVEventPublisher",
        mutants="conformance.contracts.kv_events.publisher.mutants:CATALOG",
        fixture="kv_publisher_spec",
        make_spec="conformance.contracts.kv_events.spec:make_spec",
        capabilities="conformance.contracts.kv_events.spec:PublisherCapabilities",
        factory_shape="factory(endpoint: str, replay_endpoint: str, *, topic: str)",
        probe=(_PROBE_ENDPOINTS, {"topic": ""}),
        driver="conformance.contracts.kv_events.driver:PublisherFactory",
        python_service="conformance.contracts.kv_events.service:PublisherService",
    ),
    Contract(
        name="kv-events-subscriber",
        title="KV-cache event consumer under test (SUB + replay client)",
        clauses=SUBSCRIBER_CLAUSES,
        suite=("conformance.contracts.kv_events.subscriber.suite",),
        chaos_suite=(),
        default_factory="reference_impl.kv_events.subscriber:KVEventSubscriber",
        mutants="conformance.contracts.kv_events.subscriber.mutants:selfcheck_catalog",
        fixture="kv_subscriber_spec",
        make_spec="conformance.contracts.kv_events.spec:make_subscriber_spec",
        capabilities="conformance.contracts.kv_events.spec:SubscriberCapabilities",
        factory_shape="factory(endpoint: str, replay_endpoint: str, *, topic: str)",
        probe=(_PROBE_ENDPOINTS, {"topic": ""}),
        driver="conformance.contracts.kv_events.driver:SubscriberFactory",
        python_service="conformance.contracts.kv_events.service:SubscriberService",
    ),
)
