"""Fixtures of the subscriber suite: the subscriber under test.

``kv_subscriber_spec`` is the subscriber the session configured
(``--zmq-contract kv-events-subscriber --zmq-transport MODULE:ATTR``, see
:mod:`conformance.config.selection`); ``ZMQ_CONFORMANCE_KV_SUBSCRIBER``
(``MODULE:ATTR``) overrides it, and without either it is the reference.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from conformance.config.fixtures import contract_spec
from conformance.contracts.kv_events.subscriber.clauses import CONTRACT
from conformance.contracts.kv_events.subscriber.peer import SubscriberSpec

ENV_SUBSCRIBER = "ZMQ_CONFORMANCE_KV_SUBSCRIBER"
DEFAULT_SUBSCRIBER = "reference_impl.kv_events.subscriber:KVEventSubscriber"


@pytest.fixture
def kv_subscriber_spec(request: pytest.FixtureRequest, zmq_transport_factory: Any
                       ) -> SubscriberSpec:
    override = os.environ.get(ENV_SUBSCRIBER)
    if override:
        return SubscriberSpec.load(override)
    spec: SubscriberSpec = contract_spec(request, zmq_transport_factory, CONTRACT)
    return spec
