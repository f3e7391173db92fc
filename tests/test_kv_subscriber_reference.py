"""Reference KV-event subscriber specifics, over real sockets.

The ``kv-events-subscriber`` contract proves the clauses (and
``tests/test_kv_subscriber_contract.py`` runs it); these pin what the
reference documents beyond them: its counters, giving a gap up after
``replay_attempts``, the end-to-end path with the reference publisher in
both encodings, option validation and release.
"""

from __future__ import annotations

import socket
import time

import pytest

from conformance.contracts.kv_events.subscriber.peer import (
    FakePublisher,
    ReplayRequest,
    Session,
    SubscriberSpec,
)
from conformance.testing import resources
from reference_impl.kv_events.publisher import KVEventPublisher
from reference_impl.kv_events.schema import BlockStored, Encoding, KVEventBatch
from reference_impl.kv_events.subscriber import KVEventSubscriber

SPEC = SubscriberSpec.load("reference_impl.kv_events.subscriber:KVEventSubscriber")


def _endpoints() -> tuple[str, str]:
    sockets = [socket.socket(), socket.socket()]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return f"tcp://127.0.0.1:{ports[0]}", f"tcp://127.0.0.1:{ports[1]}"


def _batch(i: int) -> KVEventBatch:
    return KVEventBatch(float(i), [BlockStored([i], None, [1, 2, 3], 16, None, "GPU")])


@pytest.mark.parametrize("encoding", ["map", "array"])
def test_end_to_end_with_the_reference_publisher(encoding: Encoding) -> None:
    pub_ep, replay_ep = _endpoints()
    with KVEventPublisher(pub_ep, replay_ep, topic="kv", encoding=encoding) as pub, \
            KVEventSubscriber(pub_ep, replay_ep, topic="kv", encoding=encoding) as sub:
        got: list[tuple[int, KVEventBatch]] = []
        deadline = time.monotonic() + 5
        while not got:  # the first batch that arrives is where the subscriber joins
            pub.publish(_batch(-1))
            got += sub.poll(20)
            assert time.monotonic() < deadline
        first = got[0][0]
        for i in range(2000):
            pub.publish(_batch(i))
        while (not got or got[-1][0] < first + 2000) and time.monotonic() < deadline + 10:
            got += sub.poll(100)
        seqs = [seq for seq, _ in got]
        assert seqs == list(range(first, seqs[-1] + 1))
        assert [b for _, b in got[-2000:]] == [_batch(i) for i in range(2000)]


def test_counters_for_garbage_duplicates_and_restarts() -> None:
    with Session(SPEC, clause="test") as s:
        s.subscribed()
        fake = s.fake
        fake.publish()
        fake.send_frames([fake.topic])
        fake.publish_payload(b"\xc1")
        fake.publish()
        s.drive_until(lambda: s.seqs() == [0, 2], timeout=5, what="0 and 2")
        fake.restart(salt=1)
        s.subscribed()
        fake.publish()
        s.drive_until(lambda: s.seqs() == [0, 2, 0], timeout=5, what="the restart")
        stats = s.sub.stats()
        assert stats["garbled"] >= 2
        assert stats["restarts"] == 1
        assert stats["delivered"] == 3


def test_gap_given_up_after_replay_attempts() -> None:
    """A replay ROUTER that never answers: after ``replay_attempts`` timeouts the
    missing batches are counted lost and the ones held behind the gap delivered."""
    fake = FakePublisher(topic="kv", encoding="map")

    def ignore(fake: FakePublisher, request: ReplayRequest) -> None:
        return None

    fake.policy = ignore
    sub = KVEventSubscriber(fake.endpoint, fake.replay_endpoint, topic="kv",
                            replay_timeout_ms=100, replay_attempts=2, resync_idle_ms=0)
    try:
        got: list[tuple[int, KVEventBatch]] = []
        deadline = time.monotonic() + 5
        while fake.subscriptions == 0:
            got += sub.poll(5)
            fake.pump()
            assert time.monotonic() < deadline
        fake.publish()
        fake.publish(live=False)
        fake.publish()
        start = time.monotonic()
        while len(got) < 2:
            got += sub.poll(5)
            fake.pump()
            assert time.monotonic() < deadline
        waited = time.monotonic() - start
        assert [seq for seq, _ in got] == [0, 2]
        assert 0.2 <= waited < 0.2 + 1.0, "two attempts of 100 ms, then given up"
        assert len({r.identity for r in fake.requests}) == 2, "each attempt on a new socket"
        stats = sub.stats()
        assert stats["lost"] == 1 and stats["replay_timeouts"] == 2
    finally:
        sub.close()
        fake.close()


def test_close_is_idempotent_and_releases_everything() -> None:
    pub_ep, replay_ep = _endpoints()
    KVEventSubscriber(pub_ep, replay_ep).close()  # warm-up
    baseline = resources.wait_until_stable()
    sub = KVEventSubscriber(pub_ep, replay_ep, resync_idle_ms=10)
    sub.poll(30)
    sub.close()
    sub.close()
    with pytest.raises(RuntimeError, match="close"):
        sub.poll(0)
    resources.wait_for_release(baseline, what="subscriber close", check_threads=False)


def test_bad_options_are_named() -> None:
    pub_ep, replay_ep = _endpoints()
    for kwargs, name in (({"encoding": "json"}, "encoding"),
                         ({"replay_timeout_ms": 0}, "replay_timeout_ms"),
                         ({"replay_attempts": 0}, "replay_attempts"),
                         ({"resync_idle_ms": -1}, "resync_idle_ms")):
        with pytest.raises(ValueError, match=name):
            KVEventSubscriber(pub_ep, replay_ep, **kwargs)
