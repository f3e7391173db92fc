"""Fixtures of the subscriber suite: the subscriber under test.

``kv_subscriber_spec`` is the subscriber the session configured
(``--zmq-contract kv-events-subscriber --zmq-transport MODULE:ATTR``, see
:mod:`conformance.config.selection`); ``ZMQ_CONFORMANCE_KV_SUBSCRIBER``
(``MODULE:ATTR``) overrides it, and without either it is the reference.
Before any test uses it, the subscriber is checked once against its declared
encoding (:mod:`..profile_check`): a mismatch skips every test with that one
reason.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from conformance.config.fixtures import contract_spec
from conformance.contracts.kv_events.subscriber.clauses import CONTRACT
from conformance.contracts.kv_events.subscriber.peer import SubscriberSpec
from conformance.contracts.kv_events.subscriber.profile_check import profile_mismatch

ENV_SUBSCRIBER = "ZMQ_CONFORMANCE_KV_SUBSCRIBER"
DEFAULT_SUBSCRIBER = "reference_impl.kv_events.subscriber:KVEventSubscriber"


@pytest.fixture
def kv_subscriber_spec(request: pytest.FixtureRequest, zmq_transport_factory: Any
                       ) -> SubscriberSpec:
    override = os.environ.get(ENV_SUBSCRIBER)
    spec: SubscriberSpec = (SubscriberSpec.load(override) if override
                            else contract_spec(request, zmq_transport_factory, CONTRACT))
    mismatch = profile_mismatch(spec)
    if mismatch is not None:
        pytest.skip(mismatch)
    return spec
