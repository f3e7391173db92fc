"""``publish_many``, ``publish_copies`` and ``publish_then_shutdown`` (docs/drivers.md,
section 6) through real drivers.

A burst of ``publish()`` calls runs back to back in the driver process, so a
queue fills (EVT-3) and a backlog is queued at shutdown (EVT-7) as they do
in-process. These tests check the calls carry what the suite judges: every
batch once and in order on the wire, one outcome per batch (the error each
``publish()`` raised), and that a driver written before the addition
(``tests/drivers/kv_publisher_v1.py``, which answers ``unsupported``) is driven
one ``publish`` at a time with the same result. ``publish_then_shutdown`` leaves
EVT-7 a backlog at ``shutdown()`` (a round trip before it let the publisher drain
first), so the ShutdownDropsQueue mutant is caught through a driver.
"""

from __future__ import annotations

import shlex
import sys
import time
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


MUTANT_DRIVER = (f"{shlex.quote(sys.executable)} -m conformance.drivers.python "
                 "conformance.contracts.kv_events.publisher.mutants:ShutdownDropsQueue")


def _burst_then_shutdown(command: str) -> tuple[Rig, dict[str, int], int, int]:
    """EVT-7's burst (3000 batches), stats() and shutdown() through ``command``: the rig,
    the stats before shutdown(), the batches a reader got, the undelivered count."""
    rig = _rig(command)
    try:
        reader = rig.sub()
        rig.join(reader)
        before, took = rig.publish_then_shutdown(
            (make_batch(events=3, tokens=256) for _ in range(3000)), limit=5.0)
        assert 0.0 <= took < 5.0
        after = rig.stats()
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and not rig.arrived(reader, len(rig.model) - 1):
            reader.drain(20)
        arrived = [i for i in (rig.index_of(m[2]) for m in reader.got) if i is not None]
        return rig, dict(before), max(arrived) + 1 if arrived else 0, int(
            after.get("undelivered", 0))
    finally:
        rig.close()


def test_publish_then_shutdown_leaves_the_backlog_to_shutdown() -> None:
    """One request: the burst, stats() and shutdown() back to back in the driver, so a
    backlog is queued when shutdown() starts (published grows after the stats taken
    just before it), and a correct publisher delivers it. The process is free again."""
    rig, before, delivered, undelivered = _burst_then_shutdown(PYTHON_DRIVER)
    assert not rig.publisher._no_burst_shutdown
    assert int(before["published"]) < len(rig.model), "no backlog at shutdown()"
    assert delivered + undelivered >= len(rig.model) > 3000  # the join's batches too
    assert rig.publisher._released


def test_shutdown_drops_queue_is_caught_through_a_driver() -> None:
    """The ShutdownDropsQueue mutant, served by the Python driver: the backlog it was
    given at shutdown() vanishes, neither published nor reported (EVT-7's check)."""
    rig, before, delivered, undelivered = _burst_then_shutdown(MUTANT_DRIVER)
    assert int(before["published"]) < len(rig.model)
    assert delivered + undelivered < len(rig.model)


def test_a_driver_without_publish_then_shutdown_gets_the_plain_calls() -> None:
    rig, before, delivered, undelivered = _burst_then_shutdown(PROTOCOL_1_DRIVER)
    assert rig.publisher._no_burst_shutdown and rig.publisher._one_by_one
    assert "published" in before
    assert delivered + undelivered >= len(rig.model) > 3000
