"""The subscriber under test against a raw-socket publisher: EVS-1 .. EVS-6, EVS-8, EVS-9.

Every example binds a fresh :class:`FakePublisher` on ephemeral ports and
waits (through XPUB) until the subscriber's subscription has arrived, so no
batch is lost to the slow-joiner window. Expected deliveries are computed
from what the fake published; content is compared field by field through
the public schema (:func:`reference_impl.kv_events.schema.first_difference`).
Time bounds derive from the subscriber's replay timeout (the suite's own
250 ms when the factory takes ``replay_timeout_ms``, else the declared
capability, else 5 s), with one second of slack for a loaded machine.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from conformance.config import profiles
from conformance.contracts.kv_events.spec import accepts
from conformance.contracts.kv_events.subscriber.peer import (
    SUITE_HEARTBEAT_IVL_MS,
    FakePublisher,
    ReplayRequest,
    Session,
    SubscriberSpec,
    answer_fully,
    make_batch,
)
from reference_impl.kv_events.schema import (
    BlockRemoved,
    KVEventBatch,
    encode_seq,
    first_difference,
)

#: Slack on every bound derived from the replay timeout.
_SLACK_S = 1.0


def _bound(spec: SubscriberSpec, attempts: int = 1) -> float:
    return attempts * spec.replay_timeout_ms / 1000 + _SLACK_S


def _settings(cap: int | None = None) -> settings:
    examples = profiles.active().max_examples
    return profiles.suite_settings(max_examples=min(examples, cap) if cap else examples)


def _expected(fake: FakePublisher, seqs: list[int]) -> list[tuple[int, KVEventBatch]]:
    return [(seq, fake.batches[seq]) for seq in seqs]


def _difference(expected: KVEventBatch, got: Any) -> str | None:
    """Where a delivered batch (in the subscriber's own types) differs, compared
    structurally (a consumer's own struct is never ``==`` to the suite's)."""
    try:
        return first_difference(expected, got)
    except ValueError as exc:
        return str(exc)


# --- EVS-1 ------------------------------------------------------------------------------


@pytest.mark.clause("EVS-1")
@_settings()
@given(
    steps=st.lists(
        st.tuples(
            st.integers(1, 3),  # batches published (retained) this step
            st.integers(0, 4),  # of the pending ones, how many go out live now
            st.lists(st.booleans(), max_size=4),  # which of those are lost on the way
        ),
        min_size=1,
        max_size=6,
    )
)
def test_every_batch_once_in_order(
    kv_subscriber_spec: SubscriberSpec, steps: list[tuple[int, int, list[bool]]]
) -> None:
    """Live copies lag behind what is retained, some never arrive: the application
    still sees 0..N-1 once each, in order. Replays answered from the history
    include batches whose live copies arrive later (the live duplicates)."""
    with Session(kv_subscriber_spec, clause="EVS-1") as s:
        s.subscribed()
        fake = s.fake
        fake.publish()  # seq 0 arrives: the subscriber's starting point
        pending: list[int] = []
        for publish_n, live_n, lost in steps:
            pending += [fake.publish(live=False) for _ in range(publish_n)]
            for i, seq in enumerate(pending[:live_n]):
                if not (i < len(lost) and lost[i]):
                    fake.send_live(seq)
            del pending[:live_n]
            s.poll_once()
        for seq in pending:
            fake.send_live(seq)
        final = fake.publish()  # a live batch after every loss, so every gap shows
        s.drive_until(lambda: final in s.seqs() or len(s.delivered) > final,
                      timeout=_bound(kv_subscriber_spec, 3), what=f"seq {final} delivered")
        s.drive_for(0.05)  # late duplicates would show up now
        s.check_delivered(_expected(fake, list(range(final + 1))))
        for request in fake.requests:
            assert request.start is not None, (
                f"EVS-1: malformed replay request {request.frames!r}; expected "
                "[b'', start as 8 bytes big-endian]"
            )


# --- EVS-2 ------------------------------------------------------------------------------


@pytest.mark.clause("EVS-2")
@_settings(cap=8)
@example(before=1, lost=2, after=1)  # on every run (a kill in one run, not two)
@given(before=st.integers(1, 4), lost=st.integers(1, 4), after=st.integers(1, 4))
def test_end_marker_is_signed_minus_one(
    kv_subscriber_spec: SubscriberSpec, before: int, lost: int, after: int
) -> None:
    """A gap whose batches the publisher no longer retains: the replay answer is
    what is retained, then the end marker. A subscriber that reads the marker
    as seq 2**64-1 either takes it for a batch (and then drops everything
    after as old) or keeps waiting and asks again for the same range."""
    spec = kv_subscriber_spec
    with Session(spec, clause="EVS-2") as s:
        s.subscribed()
        fake = s.fake
        for _ in range(before):
            fake.publish()
        s.drive_until(lambda: len(s.delivered) >= before, timeout=_bound(spec),
                      what=f"{before} batches delivered")
        first_lost = fake.next_seq
        for _ in range(lost):
            fake.publish(live=False)
        fake.forget(below=fake.next_seq)  # evicted before anyone asked
        closer = fake.publish()
        s.drive_until(lambda: closer in s.seqs(), timeout=_bound(spec, 3),
                      what=f"seq {closer} delivered after the unretained gap")
        gap_starts = [r.start for r in fake.requests]
        s.drive_for(_bound(spec) - _SLACK_S + 0.3)  # a missed end marker times out by now
        repeats = [r.start for r in fake.requests[len(gap_starts):]
                   if r.start is not None and r.start <= first_lost]
        assert not repeats, (
            f"EVS-2: after the end marker the subscriber asked again from {repeats[0]}: "
            "it did not read [b'', -1 (signed, 8 bytes), b''] as the end of the replay"
        )
        tail = [fake.publish() for _ in range(after)]
        s.drive_until(lambda: tail[-1] in s.seqs(), timeout=_bound(spec, 3),
                      what=f"seqs {tail} delivered after the replay ended")
        s.check_delivered(_expected(fake, [*range(before), closer, *tail]))


# --- EVS-3 ------------------------------------------------------------------------------


@pytest.mark.clause("EVS-3")
@_settings(cap=8)
@example(before=1, missing=2, mode="silent", partial=1)  # on every run (a kill in one run)
@given(
    before=st.integers(1, 3),
    missing=st.integers(1, 5),
    mode=st.sampled_from(["silent", "partial", "late"]),
    partial=st.integers(1, 4),
)
def test_unanswered_replay_times_out_and_retries(
    kv_subscriber_spec: SubscriberSpec, before: int, missing: int, mode: str, partial: int
) -> None:
    """The first replay request gets no answer, part of one (no end marker), or
    its answer only after the retry (late, with other content). The retry must
    come within the replay timeout plus slack, on a rebuilt socket (a new
    routing identity), and the application must end with every batch once,
    never the late answer's content."""
    spec = kv_subscriber_spec
    with Session(spec, clause="EVS-3") as s:
        s.subscribed()
        fake = s.fake
        for _ in range(before):
            fake.publish()
        s.drive_until(lambda: len(s.delivered) >= before, timeout=_bound(spec),
                      what=f"{before} batches delivered")
        gap = [fake.publish(live=False) for _ in range(missing)]
        first: list[ReplayRequest] = []

        def policy(fake: FakePublisher, request: ReplayRequest) -> None:
            if request.start is None or request.start > gap[0]:
                return answer_fully(fake, request)  # not the gap's request
            if not first:
                first.append(request)
                if mode == "partial":
                    fake.answer(request.identity, request.start, limit=partial, end=False)
                return None
            if mode == "late":
                _stale_answer(fake, first[0].identity, request.start)
            fake.policy = answer_fully
            return answer_fully(fake, request)

        fake.policy = policy
        closer = fake.publish()
        s.drive_until(lambda: bool(first), timeout=_bound(spec),
                      what="a replay request for the gap")
        if mode == "partial" and partial >= missing:
            # The partial answer held every missing batch: a complete subscriber has
            # nothing to retry; it must deliver everything once.
            s.drive_until(lambda: closer in s.seqs(), timeout=_bound(spec, 3),
                          what=f"seq {closer} delivered after a partial answer that held "
                          "every missing batch")
            s.drive_for(0.05)
            s.check_delivered(_expected(fake, list(range(closer + 1))))
            return
        retry_bound = _bound(spec)
        s.drive_until(lambda: len([r for r in fake.requests if r.at > first[0].at]) > 0,
                      timeout=retry_bound,
                      what="a retry of the unanswered replay (none within the replay "
                      "timeout + slack: is the replay socket stuck?)")
        retry = next(r for r in fake.requests if r.at > first[0].at)
        assert retry.identity != first[0].identity, (
            "EVS-3: the retry came on the same replay socket (same routing identity): "
            "late answers of the abandoned replay could be taken for answers to the new "
            "one; rebuild the socket after a timeout (lazy pirate)"
        )
        s.drive_until(lambda: closer in s.seqs(), timeout=_bound(spec, 3),
                      what=f"seq {closer} delivered after the retried replay")
        s.drive_for(0.05)
        s.check_delivered(_expected(fake, list(range(closer + 1))))


def _stale_answer(fake: FakePublisher, identity: bytes, start: int) -> None:
    """Answers to an abandoned request, with content no publisher sent under these seqs."""
    for seq in range(start, fake.next_seq):
        fake.send_replay(identity, seq, fake.encode(make_batch(seq, salt=99)))
    fake.send_end(identity)


# --- EVS-4 ------------------------------------------------------------------------------


@pytest.mark.clause("EVS-4")
@_settings(cap=8)
@example(old_missed=(2, 1), fresh_live=1)  # on every run (a kill in one run, not two)
@given(old_missed=st.integers(1, 6).flatmap(lambda old: st.tuples(st.just(old),
                                                                  st.integers(0, old - 1))),
       fresh_live=st.integers(1, 4))
def test_publisher_restart_is_recognised(
    kv_subscriber_spec: SubscriberSpec, old_missed: tuple[int, int], fresh_live: int
) -> None:
    """The publisher restarts on the same endpoints with seq back to 0 and new
    content. Some of its first batches go out before the subscriber has
    reconnected (missed live, retained for replay); then it publishes live.
    The application sees the old incarnation, then the new one from seq 0,
    each batch once with the new content: nothing dropped as a duplicate."""
    spec = kv_subscriber_spec
    old, missed = old_missed  # batches of the first incarnation; of the new one, missed live
    with Session(spec, clause="EVS-4") as s:
        s.subscribed()
        fake = s.fake
        for _ in range(old):
            fake.publish()
        s.drive_until(lambda: len(s.delivered) >= old, timeout=_bound(spec),
                      what=f"{old} batches of the first incarnation delivered")
        old_expected = _expected(fake, list(range(old)))
        fake.restart(salt=7)
        for _ in range(missed):
            fake.publish()  # nobody is subscribed yet: gone live, retained
        s.subscribed(timeout=5.0)
        for _ in range(fresh_live):
            fake.publish()
        total = old + missed + fresh_live
        s.drive_until(lambda: len(s.delivered) >= total, timeout=_bound(spec, 3),
                      what=f"the new incarnation's {missed + fresh_live} batches delivered "
                      "(were they dropped as duplicates of the old one?)")
        s.drive_for(0.05)
        s.check_delivered(old_expected + _expected(fake, list(range(missed + fresh_live))))


#: Batches published while the subscriber is busy elsewhere: more than the receive
#: queue a subscriber is likely to bound itself to (the reference kept 100,000).
_BACKLOG = 150_000


@pytest.mark.clause("EVS-4")
def test_publisher_restart_is_recognised_while_lagging(kv_subscriber_spec: SubscriberSpec
                                                       ) -> None:
    """The publisher floods a subscriber that is busy elsewhere (not polling), then
    restarts at once; the subscriber, still not polling, lives through its heartbeats
    and then delivers the new incarnation from seq 0.

    libzmq 4.3 aborts the subscriber's process here when its SUB socket has a
    bounded receive queue (now full) and ZMTP heartbeats on: the restart resets the
    connection that stopped reading, and the next heartbeat interval writes to it
    (``Assertion failed: !_io_error``). A crash is reported as ``crashed``.
    """
    spec = kv_subscriber_spec
    with Session(spec, clause="EVS-4") as s:
        s.subscribed()
        fake = s.fake
        payload = fake.encode(make_batch(0, fake.salt))
        for seq in range(_BACKLOG):
            fake.send_frames([fake.topic, encode_seq(seq), payload])
        fake.restart(salt=11)
        # Three heartbeat intervals unpolled (the suite's, when the factory takes one).
        takes_ivl = accepts(spec.factory, "heartbeat_ivl_ms")
        ivl_s = (SUITE_HEARTBEAT_IVL_MS if takes_ivl else 500) / 1000
        deadline = time.monotonic() + 3 * ivl_s + 0.2
        while time.monotonic() < deadline:
            fake.pump()
            time.sleep(0.01)
        s.subscribed(timeout=30.0)  # after the backlog, the new incarnation's subscription
        fresh = [fake.publish() for _ in range(3)]
        s.drive_until(lambda: [seq for seq, _ in s.delivered[-3:]] == fresh, timeout=60.0,
                      what="the new incarnation's first batches after the backlog")
        for seq, batch in s.delivered[-3:]:
            diff = _difference(fake.batches[seq], batch)
            assert diff is None, (
                f"EVS-4: batch {seq} of the new incarnation arrived with other content: {diff}")


# --- EVS-5 ------------------------------------------------------------------------------

_GARBAGE = ("frames_1", "frames_2", "frames_4", "short_seq", "long_seq", "undecodable",
            "unknown_tag", "wrong_shape", "empty_payload")


@pytest.mark.clause("EVS-5")
@_settings()
@given(
    items=st.lists(st.one_of(st.just("valid"), st.sampled_from(_GARBAGE)), min_size=1,
                   max_size=10),
    garble_replays=st.booleans(),
)
def test_garbled_frames_are_skipped(
    kv_subscriber_spec: SubscriberSpec, items: list[str], garble_replays: bool
) -> None:
    """Valid batches interleaved with garbage on the stream (and, optionally,
    garbage answers ahead of each replay): the application gets exactly the
    valid batches, in order; ``poll()`` never raises. Garbage with a valid seq
    frame uses that seq (a replay of it returns the same garbage)."""
    spec = kv_subscriber_spec
    with Session(spec, clause="EVS-5") as s:
        s.subscribed()
        fake = s.fake
        if garble_replays:
            def policy(fake: FakePublisher, request: ReplayRequest) -> None:
                fake.send_answer(request.identity, [b"\x00\x01"])  # 1 frame after the empty
                fake.send_answer(request.identity, [b"short", b"x"])
                answer_fully(fake, request)

            fake.policy = policy
        valid = [fake.publish()]
        #: Batches of only unknown events: skipped, or delivered without them (EVS-9).
        emptied: set[int] = set()
        for item in items:
            if item == "valid":
                valid.append(fake.publish())
            else:
                if item == "unknown_tag":
                    emptied.add(fake.next_seq)
                _send_garbage(fake, item)
            s.poll_once()
        valid.append(fake.publish())
        s.drive_until(lambda: valid[-1] in s.seqs(), timeout=_bound(spec, 4),
                      what=f"seq {valid[-1]} delivered after the garbage")
        s.drive_for(0.05)
        for seq, batch in [d for d in s.delivered if d[0] in emptied]:
            diff = _difference(KVEventBatch(ts=1.0, events=[]), batch)
            assert diff is None, (
                f"EVS-5: seq {seq} held only an event of an unknown type; delivered, it must "
                f"come without it: {diff}")
        s.delivered = [d for d in s.delivered if d[0] not in emptied]
        s.check_delivered(_expected(fake, valid))


def _send_garbage(fake: FakePublisher, kind: str) -> None:
    topic, seq_now = fake.topic, encode_seq(max(fake.next_seq - 1, 0))
    good = fake.history.get(fake.next_seq - 1, b"")
    if kind == "frames_1":
        fake.send_frames([topic])
    elif kind == "frames_2":
        fake.send_frames([topic, seq_now])
    elif kind == "frames_4":
        fake.send_frames([topic, encode_seq(fake.next_seq), good, b"extra"])
    elif kind == "short_seq":
        fake.send_frames([topic, b"\x00\x01", good])
    elif kind == "long_seq":
        fake.send_frames([topic, b"\x00" * 9, good])
    elif kind == "undecodable":
        fake.publish_payload(b"\xc1\xff\x00garbage")
    elif kind == "unknown_tag":
        fake.publish_payload(_unknown_tag(fake))
    elif kind == "wrong_shape":
        fake.publish_payload(msgspec.msgpack.encode({"ts": "yesterday", "events": 3}))
    elif kind == "empty_payload":
        fake.publish_payload(b"")
    else:  # pragma: no cover
        raise ValueError(kind)


def _unknown_tag(fake: FakePublisher) -> bytes:
    if fake.encoding == "map":
        return msgspec.msgpack.encode(
            {"ts": 1.0, "events": [{"type": "BlockTeleported", "block_hashes": [1]}]}
        )
    return msgspec.msgpack.encode([1.0, [["BlockTeleported", [1]]], None])


# --- EVS-6 ------------------------------------------------------------------------------

_TOPICS = ("", "k", "kv", "kv-events", "kv-events-dp1", "other")


@pytest.mark.clause("EVS-6")
@_settings()
@given(
    topic=st.sampled_from(["", "kv", "kv-events"]),
    plan=st.lists(st.tuples(st.booleans(), st.sampled_from(_TOPICS)), min_size=1, max_size=12),
)
def test_only_the_configured_topic(
    kv_subscriber_spec: SubscriberSpec, topic: str, plan: list[tuple[bool, str]]
) -> None:
    """Batches of the configured topic interleaved with other streams (other
    topics with their own seqs from 0, including prefixes and extensions of
    the configured one). With topic ``""`` every message is one stream and all
    are delivered."""
    spec = kv_subscriber_spec
    own_topic = topic or "kv"
    with Session(spec, clause="EVS-6", topic=topic, fake_topic=own_topic) as s:
        s.subscribed()
        fake = s.fake
        expected = [fake.publish()]
        other_seq = 0
        for own, other in plan:
            if own or not topic or other == topic:
                seq = fake.publish(live=False)
                fake.send_live(seq, topic=(topic or other).encode())
                expected.append(seq)
            else:
                stray = make_batch(other_seq, salt=5)
                fake.send_frames([other.encode(), encode_seq(other_seq), fake.encode(stray)])
                other_seq += 1
            s.poll_once()
        expected.append(fake.publish())
        s.drive_until(lambda: expected[-1] in s.seqs() or len(s.delivered) > len(expected),
                      timeout=_bound(spec, 3), what=f"seq {expected[-1]} delivered")
        s.drive_for(0.05)
        s.check_delivered(_expected(fake, expected))



# --- EVS-8 ------------------------------------------------------------------------------

_LAYOUT_FRAMES = {"seq-payload": "[b'', seq, payload]",
                  "topic-seq-payload": "[b'', topic, seq, payload]"}


@pytest.mark.clause("EVS-8")
@pytest.mark.parametrize("missing", [1, 3])
def test_replays_are_read_in_every_declared_layout(kv_subscriber_spec: SubscriberSpec,
                                                   missing: int) -> None:
    """For each replay layout the subscriber reads (both, unless it declares one): a gap
    whose batches come only in a replay answered in that layout, end marker included,
    is filled: every batch once, in order."""
    spec = kv_subscriber_spec
    for layout in spec.layouts:
        with Session(spec, clause="EVS-8") as s:
            s.subscribed()
            fake = s.fake
            fake.layout = layout
            fake.publish()
            s.drive_until(lambda: len(s.delivered) >= 1, timeout=_bound(spec),
                          what="seq 0 delivered")
            for _ in range(missing):
                fake.publish(live=False)
            closer = fake.publish()
            try:
                s.drive_until(lambda last=closer: last in s.seqs(),  # type: ignore[misc]
                              timeout=_bound(spec, 3),
                              what=f"seq {closer} delivered after the gap")
                timed_out = False
            except AssertionError:
                timed_out = True
            s.drive_for(0.05)
            if not any(r.start is not None for r in fake.requests):
                # No replay was asked for: EVS-1's defect, and no evidence about layouts.
                raise AssertionError(
                    f"EVS-1: the subscriber asked for no replay of a gap of {missing} batches, "
                    f"so whether it reads the {layout} layout cannot be judged; delivered "
                    f"seqs {s.seqs()}"
                )
            if timed_out:
                others = [w for w in ("seq-payload", "topic-seq-payload") if w != layout]
                raise AssertionError(
                    f"EVS-8: the gap's {missing} batches, replayed in layout {layout} "
                    f"{_LAYOUT_FRAMES[layout]}, were not delivered: the subscriber does not "
                    f"read that layout (declare wire={others[0]} if it reads only that one); "
                    f"delivered seqs {s.seqs()}"
                )
            s.check_delivered(_expected(fake, list(range(closer + 1))))


# --- EVS-9 ------------------------------------------------------------------------------


def _newer(fake: FakePublisher, batch: KVEventBatch, kind: str) -> tuple[bytes, KVEventBatch]:
    """``batch`` as a newer producer writes it (``kind``), and what a consumer of the
    declared schema must read from it."""
    data = msgspec.msgpack.decode(fake.encode(batch))
    events: list[Any] = data["events"] if isinstance(data, dict) else data[1]
    if kind == "unknown_keys":
        for event in events:
            if isinstance(event, dict):
                event["retention_tier"] = ["hot", 2]
            else:
                event.append(["hot", 2])  # an array event grows at its end
        if isinstance(data, dict):
            data["producer_epoch"] = 3
        else:
            data.append(3)  # so does an array batch
    elif kind == "unknown_event":
        teleported: Any = (["BlockTeleported", [9], "NVME"] if fake.encoding == "array"
                           else {"type": "BlockTeleported", "block_hashes": [9]})
        events.insert(1, teleported)
    else:  # pragma: no cover
        raise ValueError(kind)
    return msgspec.msgpack.encode(data), batch


@pytest.mark.clause("EVS-9")
@_settings(cap=6)
@example(kinds=["unknown_keys", "unknown_event"])  # on every run (a kill in one run)
@given(kinds=st.lists(st.sampled_from(["unknown_keys", "unknown_event", "plain"]), min_size=1,
                      max_size=5))
def test_batches_of_a_newer_producer_are_read(kv_subscriber_spec: SubscriberSpec,
                                              kinds: list[str]) -> None:
    """Live batches with fields the declared schema does not know (unknown map keys,
    extra trailing array elements) and with an event of an unknown type between known
    ones: each is delivered with exactly its known content, in order, and the stream
    goes on."""
    spec = kv_subscriber_spec
    with Session(spec, clause="EVS-9") as s:
        s.subscribed()
        fake = s.fake
        expected: list[tuple[int, KVEventBatch | None]] = [(fake.publish(), None)]
        for index, kind in enumerate(kinds):
            if kind == "plain":
                expected.append((fake.publish(), None))
                continue
            # Int hashes only: whether bytes hashes decode is not this clause's question.
            batch = make_batch(3 * (index + 1))
            batch.events.append(BlockRemoved([index], "GPU"))
            payload, known = _newer(fake, batch, kind)
            expected.append((fake.publish_payload(payload), known))
        closer = fake.publish()
        expected.append((closer, None))
        s.drive_until(lambda: closer in s.seqs(), timeout=_bound(spec, 3),
                      what=f"seq {closer} delivered after batches of a newer producer")
        s.drive_for(0.05)
        want = [(seq, known if known is not None else fake.batches[seq])
                for seq, known in expected]
        got = s.seqs()
        what = dict(zip([q for q, _ in expected], ["plain", *kinds, "plain"], strict=True))
        missing = [seq for seq, _ in want if seq not in got]
        assert not missing, (
            f"EVS-9: seq {missing[0]} ({what[missing[0]]}) was not delivered: a batch of a "
            f"newer producer was dropped; delivered {got}"
        )
        s.check_delivered(want)
