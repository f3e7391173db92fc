"""Fixtures of the publisher suite: the publisher under test.

``kv_publisher_spec`` is the publisher the session configured
(``--zmq-contract kv-events-publisher --zmq-transport MODULE:ATTR``, see
:mod:`conformance.config.selection`), or the reference when this suite is collected
in a session of another contract. Before any test uses it, the publisher is
checked once against its declared wire profile
(:mod:`..profile_check`): a mismatch skips every test with that one reason.
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance.config.fixtures import contract_spec
from conformance.contracts.kv_events.publisher.clauses import CONTRACT
from conformance.contracts.kv_events.publisher.profile_check import profile_mismatch
from conformance.contracts.kv_events.spec import PublisherSpec


@pytest.fixture
def kv_publisher_spec(request: pytest.FixtureRequest, zmq_transport_factory: Any
                      ) -> PublisherSpec:
    spec: PublisherSpec = contract_spec(request, zmq_transport_factory, CONTRACT)
    mismatch = profile_mismatch(spec)
    if mismatch is not None:
        pytest.skip(mismatch)
    return spec
