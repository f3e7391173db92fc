"""``publish_many`` and ``publish_copies`` (docs/drivers.md, section 6) through real drivers.

A burst of ``publish()`` calls runs back to back in the driver process, so a
queue fills (EVT-3) and a backlog is queued at shutdown (EVT-7) as they do
in-process. These tests check the calls carry what the suite judges: every
batch once and in order on the wire, one outcome per batch (the error each
``publish()`` raised), and that a driver written before the addition
(``tests/drivers/kv_publisher_v1.py``, which answers ``unsupported``) is driven
one ``publish`` at a time with the same result.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conformance import contracts
from conformance.contracts.kv_events.driver import MANY_BATCHES
from conformance.contracts.kv_events.publisher.peers import Rig, make_batch
from conformance.drivers import driver_spec, shutdown
from reference_impl.kv_events.publisher import PublisherClosedError
from reference_impl.kv_events.schema import BlockRemoved, KVEventBatch

PYTHON_DRIVER = (f"{shlex.quote(sys.executable)} -m conformance.drivers.python "
                 "reference_impl.kv_events.publisher:KVEventPublisher")
V1_SCRIPT = Path(__file__).parent / "drivers" / "kv_publisher_v1.py"
PROTOCOL_1_DRIVER = f"{shlex.quote(sys.executable)} {shlex.quote(str(V1_SCRIPT))}"


@pytest.fixture(autouse=True)
def _no_driver_left() -> Iterator[None]:
    yield
    shutdown()


def _rig(command: str, **overrides: Any) -> Rig:
    return Rig(driver_spec(contracts.get("kv-events-publisher"), command), clause="EVT-2",
               **overrides)


@pytest.mark.parametrize("command", [PYTHON_DRIVER, PROTOCOL_1_DRIVER],
                         ids=["in-one-request", "one-publish-each"])
def test_a_burst_arrives_once_in_order_whatever_the_driver_offers(command: str) -> None:
    count = MANY_BATCHES * 2 + 7  # more than one publish_many request
    with _rig(command) as rig:
        sub = rig.sub()
        rig.join(sub)
        assert rig.publish_many(make_batch() for _ in range(count)) == [True] * count
        first = make_batch()
        assert rig.publish_copies(first, 5) == [True] * 5
        assert [b.ts for b in rig.model[-5:]] == [first.ts + k for k in range(5)]
        rig.wait_all(sub)
        rig.check_order(sub, clause="EVT-2")
        one_by_one = rig.publisher._one_by_one, rig.publisher._no_copies
    assert one_by_one == ((False, False) if command == PYTHON_DRIVER else (True, True))


def test_each_outcome_is_what_that_publish_raised() -> None:
    unencodable = KVEventBatch(ts=0.0, events=[BlockRemoved(block_hashes=[2**70], medium=None)])
    not_a_batch = {"ts": "soon", "events": 3}
    with _rig(PYTHON_DRIVER) as rig:
        publisher = rig.publisher
        got = publisher.zmq_conformance_publish_many(
            [make_batch(), unencodable, not_a_batch, make_batch()])
        assert got is not None
        outcomes, seconds = got
        assert [type(o) for o in outcomes] == [type(None), ValueError, ValueError, type(None)]
        assert "cannot cross the driver protocol" in str(outcomes[1])  # refused here
        assert "not a KVEventBatch" in str(outcomes[2])  # refused by the driver
        assert 0.0 < seconds < 5.0
        assert rig.stats()["published"] + rig.stats()["queued"] <= 2
        rig.shutdown()
        after = publisher.zmq_conformance_publish_many([make_batch(), make_batch()])
        copies = publisher.zmq_conformance_publish_copies(make_batch(), 3)
    assert after is not None and copies is not None
    assert [type(o) for o in after[0] + copies[0]] == [PublisherClosedError] * 5
