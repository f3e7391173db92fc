"""Fixtures of the subscriber suite: the subscriber under test.

``kv_subscriber_spec`` builds from ``ZMQ_CONFORMANCE_KV_SUBSCRIBER``
(``MODULE:ATTR``), defaulting to the reference subscriber.
"""

from __future__ import annotations

import os

import pytest

from conformance.contracts.kv_events.subscriber.peer import SubscriberSpec

ENV_SUBSCRIBER = "ZMQ_CONFORMANCE_KV_SUBSCRIBER"
DEFAULT_SUBSCRIBER = "reference_impl.kv_events.subscriber:KVEventSubscriber"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kv_clause(*ids): kv-events-subscriber clauses")


@pytest.fixture(scope="session")
def kv_subscriber_spec() -> SubscriberSpec:
    return SubscriberSpec.load(os.environ.get(ENV_SUBSCRIBER) or DEFAULT_SUBSCRIBER)
