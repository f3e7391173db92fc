"""The hello's ``calls`` and ``publish_copies_timed`` (docs/drivers.md, sections 3 and 6).

EVT-3's burst of 300 large batches goes to a driver in one request that
reports each ``publish()`` call's own time, instead of 30 requests of ten
(each carrying the 600 KB batch). These tests check that the request carries
what the suite judges (every copy once, in order, on the wire; one outcome
and one time per call; a call over the watchdog's limit is ``blocked``), that
it is sent only to a driver that declares it, and that a driver without it
(``tests/drivers/kv_publisher_v1.py``) gets the old path with the same figures.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from conformance import contracts
from conformance.contracts.kv_events.driver import DriverPublisher
from conformance.contracts.kv_events.publisher.peers import Rig, make_batch
from conformance.contracts.kv_events.spec import make_spec
from conformance.drivers import driver_spec, shutdown
from conformance.drivers.protocol import Hello, ProtocolError
from conformance.errors import CallBlocked
from reference_impl.kv_events.publisher import KVEventPublisher, PublisherClosedError

PYTHON_DRIVER = (f"{shlex.quote(sys.executable)} -m conformance.drivers.python "
                 "reference_impl.kv_events.publisher:KVEventPublisher")
V1_SCRIPT = Path(__file__).parent / "drivers" / "kv_publisher_v1.py"
PROTOCOL_1_DRIVER = f"{shlex.quote(sys.executable)} {shlex.quote(str(V1_SCRIPT))}"
HELLO = {"type": "hello", "protocol": 1, "contract": "kv-events-publisher"}


@pytest.fixture(autouse=True)
def _no_driver_left() -> Iterator[None]:
    yield
    shutdown()


def _rig(command: str, **overrides: Any) -> Rig:
    return Rig(driver_spec(contracts.get("kv-events-publisher"), command), clause="EVT-3",
               **overrides)


def test_the_hello_declares_calls_or_none() -> None:
    assert Hello.parse(HELLO, contract="kv-events-publisher").calls == ()
    declared = Hello.parse({**HELLO, "calls": ["publish_copies_timed"]},
                           contract="kv-events-publisher")
    assert declared.offers("publish_copies_timed") and not declared.offers("publish_many")
    with pytest.raises(ProtocolError, match="'calls' must be an array of strings"):
        Hello.parse({**HELLO, "calls": "publish_copies_timed"}, contract="kv-events-publisher")


def test_one_request_carries_the_burst_with_each_call_timed() -> None:
    with _rig(PYTHON_DRIVER, max_queue=1000) as rig:
        assert rig.publisher._process.hello.offers("publish_copies_timed")
        sub = rig.sub()
        rig.join(sub)
        calls = rig.publisher._process.calls
        first = make_batch()
        accepted, times = rig.publish_copies_timed(first, 25, run=10)
        assert rig.publisher._process.calls == calls + 1  # one request, not three
        assert accepted == [True] * 25
        assert len(times) == 25 and all(0.0 < t < 1.0 for t in times)
        assert len(set(times)) > 1  # each call's own time, not a run's mean
        assert [b.ts for b in rig.model[-25:]] == [first.ts + k for k in range(25)]
        rig.wait_all(sub)
        rig.check_order(sub, clause="EVT-3")


def test_each_outcome_is_that_calls_and_a_closed_publisher_refuses_all() -> None:
    with _rig(PYTHON_DRIVER) as rig:
        publisher = rig.publisher
        assert isinstance(publisher, DriverPublisher)
        rig.shutdown()
        got = publisher.zmq_conformance_publish_copies_timed(make_batch(), 3, limit=5.0)
    assert got is not None
    outcomes, times = got
    assert [type(o) for o in outcomes] == [PublisherClosedError] * 3 and len(times) == 3


def test_a_driver_that_does_not_declare_it_gets_runs_and_run_means() -> None:
    """The protocol-1 driver never sees the call (it would answer ``unsupported``): the
    burst goes as single ``publish`` requests, and each call of a run of ``run`` is
    credited with the run's mean, so means over runs are what they were."""
    with _rig(PROTOCOL_1_DRIVER) as rig:
        assert not rig.publisher._process.hello.offers("publish_copies_timed")
        sub = rig.sub()
        rig.join(sub)
        accepted, times = rig.publish_copies_timed(make_batch(), 7, run=3)
        assert accepted == [True] * 7
        assert not rig.publisher._no_timed_copies  # never asked
        assert times[0] == times[1] == times[2] and times[3] == times[4] == times[5]
        rig.wait_all(sub)
        rig.check_order(sub, clause="EVT-3")


class _SlowSecondCall(KVEventPublisher):
    """The reference publisher whose timed burst reports its second call as taking 9 s:
    the suite's judging of the reported times, without a publisher that really waits."""

    def zmq_conformance_publish_copies_timed(
        self, batch: Any, count: int, *, limit: float,
    ) -> tuple[list[Exception | None], list[float]]:
        for k in range(count):
            self.publish(msgspec.structs.replace(batch, ts=batch.ts + k))
        return [None] * count, [0.001, 9.0] + [0.001] * (count - 2)


def test_a_call_reported_over_the_limit_is_blocked() -> None:
    spec = make_spec(_SlowSecondCall)
    with Rig(spec, clause="EVT-3") as rig, pytest.raises(CallBlocked, match="call 2 of 4"):
        rig.publish_copies_timed(make_batch(), 4, run=2)


def test_in_process_each_call_is_timed_on_its_own() -> None:
    spec = make_spec(KVEventPublisher)
    with Rig(spec, clause="EVT-3") as rig:
        before = rig.publish_seconds
        accepted, times = rig.publish_copies_timed(make_batch(), 5, run=2)
        assert accepted == [True] * 5 and len(times) == 5
        assert rig.publish_seconds - before == pytest.approx(sum(times))
