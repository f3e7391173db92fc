"""Reference KV-event publisher specifics, over real sockets.

The ``kv-events-publisher`` contract proves the clauses; these pin what the
reference documents beyond them: its counters (shed, encode errors,
abandoned replays), replay completeness under back-pressure
(``ROUTER_MANDATORY``), the rank endpoint derivation, option validation and
resource release.
"""

from __future__ import annotations

import itertools
import random
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import zmq

from conformance.testing import resources
from reference_impl.kv_events.publisher import (
    KVEventPublisher,
    PublisherClosedError,
    rank_endpoints,
)
from reference_impl.kv_events.schema import (
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
    decode_seq,
    is_end_marker,
    replay_request,
)


def _endpoints() -> tuple[str, str]:
    ports = []
    sockets = []
    for _ in range(2):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
        ports.append(s.getsockname()[1])
    for s in sockets:
        s.close()
    return f"tcp://127.0.0.1:{ports[0]}", f"tcp://127.0.0.1:{ports[1]}"


def _batch(i: int, size: int = 0) -> KVEventBatch:
    return KVEventBatch(float(i), [BlockStored([i], None, list(range(size)), 16, None, "GPU")])


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


def _dealer(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, **opts: int
            ) -> zmq.Socket[bytes]:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    for name, value in opts.items():
        sock.setsockopt(getattr(zmq, name), value)
    sock.connect(endpoint)
    return sock


def _read_replay(sock: zmq.Socket[bytes], timeout_ms: int = 5000) -> tuple[list[int], bool]:
    """Seqs of one replay answer and whether the end marker came."""
    seqs: list[int] = []
    while sock.poll(timeout_ms):
        frames = sock.recv_multipart()
        assert frames[0] == b"" and len(frames) == 3
        if is_end_marker(frames[1]):
            return seqs, True
        seqs.append(decode_seq(frames[1]))
    return seqs, False


def _wait(condition: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.002)


@pytest.mark.parametrize("encoding", ["map", "array"])
def test_seq_from_zero_and_payload(ctx: zmq.Context[zmq.Socket[bytes]], encoding: str) -> None:
    pub_ep, replay_ep = _endpoints()
    with KVEventPublisher(pub_ep, replay_ep, topic="t", encoding=encoding) as pub:  # type: ignore[arg-type]
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(pub_ep)
        batches = [_batch(i, 3) for i in range(20)]
        for b in batches:
            pub.publish(b)
        dealer = _dealer(ctx, replay_ep)
        dealer.send_multipart(replay_request(0))
        seqs, ended = _read_replay(dealer)
        assert (seqs, ended) == (list(range(20)), True)
        published = list(batches)
        deadline = time.monotonic() + 5
        while not sub.poll(10):  # the subscription is in place once a batch arrives
            published.append(_batch(len(published)))
            pub.publish(published[-1])
            assert time.monotonic() < deadline
        live = sub.recv_multipart()
        seq = decode_seq(live[1])
        assert live[0] == b"t"
        assert decode_batch(live[2], encoding) == published[seq]  # type: ignore[arg-type]
        dealer.send_multipart(replay_request(0))
        answers = []
        while dealer.poll(2000):
            frames = dealer.recv_multipart()
            if is_end_marker(frames[1]):
                break
            answers.append(frames[2])
        assert [decode_batch(p, encoding) for p in answers[:20]] == batches  # type: ignore[arg-type]


def test_encode_error_skips_no_seq(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    pub_ep, replay_ep = _endpoints()
    with KVEventPublisher(pub_ep, replay_ep) as pub:
        bad = KVEventBatch(1.0, [BlockStored([1], None, [object()], 16, None, None)])  # type: ignore[list-item]
        pub.publish(_batch(0))
        pub.publish(bad)
        pub.publish(_batch(2))
        _wait(lambda: pub.stats()["published"] == 2)
        assert pub.stats()["encode_errors"] == 1
        dealer = _dealer(ctx, replay_ep)
        dealer.send_multipart(replay_request(0))
        assert _read_replay(dealer) == ([0, 1], True)


def test_full_queue_sheds_and_counts_never_blocks() -> None:
    pub_ep, replay_ep = _endpoints()
    pub = KVEventPublisher(pub_ep, replay_ep, max_queue=5)
    n = 20_000
    start = time.perf_counter()
    for i in range(n):
        pub.publish(_batch(i))
    elapsed = time.perf_counter() - start
    pub.shutdown()
    stats = pub.stats()
    assert stats["published"] + stats["dropped"] + stats["undelivered"] == n
    assert elapsed < 5.0, f"20k publish() calls took {elapsed:.1f} s"


def test_replay_is_complete_under_backpressure(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    """A reader that does not read while 4000 x 4 KiB answers queue up: ROUTER_MANDATORY
    turns the full pipe into EAGAIN, the publisher resumes, nothing is skipped."""
    pub_ep, replay_ep = _endpoints()
    with KVEventPublisher(pub_ep, replay_ep, buffer_steps=4000,
                          replay_stall_timeout_ms=20_000) as pub:
        for i in range(4000):
            pub.publish(_batch(i, 1000))
        _wait(lambda: pub.stats()["published"] == 4000)
        reader = _dealer(ctx, replay_ep, RCVHWM=10)
        reader.send_multipart(replay_request(0))
        time.sleep(0.5)  # let the pipes fill: the point of the test is a reader that lags
        pub.publish(_batch(4000))  # publishing goes on during the replay
        seqs, ended = _read_replay(reader)
        assert ended
        assert seqs == list(range(4000)) or seqs == list(range(1, 4001))


def test_stalled_reader_is_abandoned_without_end_marker(ctx: zmq.Context[zmq.Socket[bytes]]
                                                        ) -> None:
    pub_ep, replay_ep = _endpoints()
    with KVEventPublisher(pub_ep, replay_ep, buffer_steps=3000,
                          replay_stall_timeout_ms=300) as pub:
        for i in range(3000):
            pub.publish(_batch(i, 1000))
        _wait(lambda: pub.stats()["published"] == 3000)
        reader = _dealer(ctx, replay_ep, RCVHWM=5)
        reader.send_multipart(replay_request(0))
        _wait(lambda: pub.stats()["replays_abandoned"] == 1)
        seqs, ended = _read_replay(reader, timeout_ms=500)
        assert not ended, "a partial replay must not end with the end marker"
        assert seqs == list(range(len(seqs))), "what did arrive is a gap-free prefix"
        other = _dealer(ctx, replay_ep)
        other.send_multipart(replay_request(2999))
        assert _read_replay(other) == ([2999], True)


def test_hostile_requests_never_stop_the_thread(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    pub_ep, replay_ep = _endpoints()
    with KVEventPublisher(pub_ep, replay_ep, buffer_steps=500) as pub:
        for i in range(500):
            pub.publish(_batch(i, 100))
        hostile = _dealer(ctx, replay_ep)
        for frames in ([b""], [b"", b"1234567"], [b"", b"\xff" * 8], [b"x", b"\x00" * 8],
                       [b"", b"\x00" * 8, b"more"], [b"", b"\x00" * 9]):
            hostile.send_multipart(frames)
        for _ in range(200):
            hostile.send_multipart(replay_request(0))  # a flood from one socket
        gone = _dealer(ctx, replay_ep)
        gone.send_multipart(replay_request(0))
        gone.close(linger=0)  # gone mid-replay
        _wait(lambda: pub.stats()["bad_requests"] >= 4)
        good = _dealer(ctx, replay_ep)
        good.send_multipart(replay_request(490))
        assert _read_replay(good) == (list(range(490, 500)), True)
        assert decode_seq(b"\xff" * 8) == -1
        pub.publish(_batch(500))
        _wait(lambda: pub.stats()["published"] == 501)
        assert pub.stats()["thread_errors"] == 0


def test_shutdown_is_bounded_idempotent_and_releases_everything() -> None:
    pub_ep, replay_ep = _endpoints()
    KVEventPublisher(pub_ep, replay_ep).shutdown()  # warm-up: libzmq's first-use descriptors
    baseline = resources.wait_until_stable()
    threads = threading.active_count()
    pub = KVEventPublisher(*_endpoints(), shutdown_timeout_ms=500)
    for i in range(10_000):
        pub.publish(_batch(i, 100))
    start = time.monotonic()
    pub.shutdown()
    assert time.monotonic() - start < 0.5 + 1.0
    pub.shutdown()
    stats = pub.stats()
    assert stats["published"] + stats["undelivered"] == 10_000
    with pytest.raises(PublisherClosedError):
        pub.publish(_batch(0))
    assert threading.active_count() == threads
    resources.wait_for_release(baseline, what="publisher shutdown", check_threads=False)


def test_rank_endpoints_never_collide() -> None:
    for pub_port, replay_port in ((5557, 5558), (5558, 5557), (6000, 6003), (7000, 7100)):
        ports: set[int] = set()
        for rank in range(16):
            a, b = rank_endpoints(f"tcp://h:{pub_port}", f"tcp://h:{replay_port}", rank)
            for endpoint in (a, b):
                port = int(endpoint.rpartition(":")[2])
                assert port not in ports, (rank, endpoint)
                ports.add(port)
    assert rank_endpoints("tcp://*:5557", "tcp://*:5558", 0) == ("tcp://*:5557", "tcp://*:5558")
    assert rank_endpoints("ipc:///tmp/kv", "ipc:///tmp/kv-r", 2) == ("ipc:///tmp/kv-dp2",
                                                                     "ipc:///tmp/kv-r-dp2")
    with pytest.raises(ValueError, match="rank"):
        rank_endpoints("tcp://h:65535", "tcp://h:65534", 1)
    with pytest.raises(ValueError, match="share port"):
        rank_endpoints("tcp://h:5557", "tcp://h:5557", 1)


def _bind_ranks(ranks: int) -> list[KVEventPublisher]:
    """Publishers of ``ranks`` ranks from one configuration (retrying taken base ports)."""
    for attempt in itertools.count():
        # Below the ephemeral range, where outgoing connections do not take ports.
        base = random.randrange(20_000, 30_000)
        pub_ep, replay_ep = f"tcp://127.0.0.1:{base}", f"tcp://127.0.0.1:{base + 1}"
        publishers: list[KVEventPublisher] = []
        try:
            for rank in range(ranks):
                publishers.append(KVEventPublisher(pub_ep, replay_ep, data_parallel_rank=rank))
        except zmq.ZMQError as exc:
            for p in publishers:
                p.shutdown()
            if exc.errno != zmq.EADDRINUSE or attempt >= 20:
                raise
            continue  # another process holds a derived port: try another base
        return publishers
    raise AssertionError("unreachable")


def test_data_parallel_ranks_all_bind_and_stamp_a_copy(
    ctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    publishers = _bind_ranks(4)
    try:
        bound = {p.endpoint for p in publishers} | {p.replay_endpoint for p in publishers}
        assert len(bound) == 8
        batch = KVEventBatch(1.0, [BlockRemoved([1], None)])
        third = publishers[2]
        third.publish(batch)
        _wait(lambda: third.stats()["published"] == 1)
        assert batch.data_parallel_rank is None, "the caller's batch is not mutated"
        dealer = _dealer(ctx, third.replay_endpoint)
        dealer.send_multipart(replay_request(0))
        frames = dealer.recv_multipart()
        assert decode_batch(frames[2]).data_parallel_rank == 2
    finally:
        for p in publishers:
            p.shutdown()


def test_bad_options_are_named() -> None:
    pub_ep, replay_ep = _endpoints()
    for kwargs, name in (({"encoding": "json"}, "encoding"), ({"buffer_steps": 0}, "buffer_steps"),
                         ({"max_queue": 0}, "max_queue"),
                         ({"heartbeat_ivl_ms": -1}, "heartbeat_ivl_ms")):
        with pytest.raises(ValueError, match=name):
            KVEventPublisher(pub_ep, replay_ep, **kwargs)
    with pytest.raises(TypeError, match="KVEventBatch"), \
            KVEventPublisher(pub_ep, replay_ep) as pub:
        pub.publish({"ts": 1.0})  # type: ignore[arg-type]


def test_failed_bind_leaves_nothing_open() -> None:
    pub_ep, replay_ep = _endpoints()
    with KVEventPublisher(pub_ep, replay_ep), pytest.raises(zmq.ZMQError):
        KVEventPublisher(pub_ep, replay_ep)

