"""KV-event wire profiles: layouts, schema versions, encodings, and the profile check.

Pure logic is tested directly; the references' replay layouts and the
publisher's profile check run over real sockets.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import zmq

from conformance.contracts.kv_events.publisher.profile_check import profile_mismatch
from conformance.contracts.kv_events.spec import make_spec
from reference_impl.kv_events.publisher import KVEventPublisher
from reference_impl.kv_events.schema import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
    encode_batch,
    first_difference,
    replay_request,
)
from reference_impl.kv_events.subscriber import KVEventSubscriber
from reference_impl.kv_events.wire import (
    ENCODINGS,
    REPLAY_LAYOUTS,
    SCHEMAS,
    WireError,
    WireProfile,
    as_batch,
    decode_payload,
    encode_payload,
    parse_replay_answer,
    replay_answer_frames,
    replay_end_frames,
    restrict,
    validate_payload,
)

_FULL = KVEventBatch(
    ts=2.5,
    events=[
        BlockStored([1, b"\x02"], 9, [1, 2, 3], 16, 4, "GPU", "lora", extra_keys=[["s"], None],
                    group_idx=1, kv_cache_spec_kind="full", kv_cache_spec_sliding_window=64,
                    locality="LOCAL", ownership="o", session_id="s",
                    lookahead_token_ids=[[1], [2]]),
        BlockRemoved([1], "CPU", group_idx=1, locality="REMOTE", ownership="o"),
        AllBlocksCleared(),
    ],
    data_parallel_rank=3,
)


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("schema", list(SCHEMAS))
def test_every_profile_round_trips_exactly(encoding: Any, schema: str) -> None:
    profile = WireProfile(encoding=encoding, schema=schema)
    batch = restrict(_FULL, profile.version)
    payload = encode_payload(batch, profile)
    assert validate_payload(payload, profile) is None
    assert first_difference(batch, as_batch(decode_payload(payload, profile, strict=True))) is None


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_the_base_schema_is_what_the_reference_structs_write(encoding: Any) -> None:
    batch = restrict(_FULL, SCHEMAS["base"])
    profile = WireProfile(encoding=encoding)
    assert validate_payload(encode_batch(batch, encoding), profile) is None
    assert first_difference(batch, decode_batch(encode_payload(batch, profile), encoding)) is None


def test_restrict_cuts_what_an_older_version_lacks() -> None:
    old = restrict(_FULL, SCHEMAS["vllm-0.9"])
    stored = old.events[0]
    assert isinstance(stored, BlockStored)
    assert stored.medium is None and stored.lora_name is None and stored.group_idx is None
    assert stored.block_hashes == [1, 2]  # bytes hashes become ints where only ints exist
    assert old.data_parallel_rank is None
    assert restrict(old, SCHEMAS["vllm-0.9"]) is old  # nothing to cut: the same object


@pytest.mark.parametrize(("payload", "profile", "problem"), [
    ({"ts": 1.0, "events": [{"type": "BlockRemoved", "block_hashes": [1]}]},
     WireProfile(), "batch.events[0] (BlockRemoved): field 'medium' missing (schema base)"),
    ({"ts": 1.0, "events": [{"type": "BlockRemoved", "block_hashes": [1], "medium": None,
                              "locality": "x"}]},
     WireProfile(), "field 'locality' is not in schema base"),
    ({"ts": 1.0, "events": [{"type": "BlockRemoved", "block_hashes": ["h"], "medium": None}]},
     WireProfile(), "block_hashes: a list of block hashes (int or bytes)"),
    ([1.0, [["BlockRemoved", [1], None, 7]], None], WireProfile(encoding="array"),
     "batch.events[0] (BlockRemoved): 3 fields, schema base has 2"),
    ([1.0, [], None, 5], WireProfile(encoding="array-map"), "batch: 4 elements"),
    ({"ts": 1.0, "events": [{"type": "BlockTeleported"}]}, WireProfile(),
     "unknown event type 'BlockTeleported'"),
    ([1.0, []], WireProfile(), "batch: a map in encoding 'map', got an array of 2"),
])
def test_validate_names_the_first_departure(payload: Any, profile: WireProfile,
                                            problem: str) -> None:
    found = validate_payload(msgspec.msgpack.encode(payload), profile)
    assert found is not None and problem in found, found


def test_a_forward_compatible_read_ignores_what_it_does_not_know() -> None:
    payload = msgspec.msgpack.encode([1.0, [["BlockRemoved", [1], None, "new"],
                                            ["BlockTeleported", 1]], 2, "trailing"])
    unknown: list[str] = []
    data = decode_payload(payload, WireProfile(encoding="array"), unknown=unknown)
    assert data == {"ts": 1.0, "events": [{"type": "BlockRemoved", "block_hashes": [1],
                                           "medium": None}], "data_parallel_rank": 2}
    assert unknown == ["BlockTeleported"]
    with pytest.raises(WireError, match="medium"):
        decode_payload(msgspec.msgpack.encode([1.0, [["BlockRemoved", [1]]]]),
                       WireProfile(encoding="array"))


@pytest.mark.parametrize("layout", REPLAY_LAYOUTS)
def test_replay_frames_are_told_apart_by_their_count(layout: Any) -> None:
    answer = parse_replay_answer(replay_answer_frames(layout, b"kv", (5).to_bytes(8, "big"),
                                                      b"p"))
    assert (answer.layout, answer.seq, answer.payload, answer.is_end) == (layout, 5, b"p", False)
    assert answer.topic == (b"kv" if layout == "topic-seq-payload" else None)
    end = parse_replay_answer(replay_end_frames(layout))
    assert end.is_end and end.seq == -1 and end.layout == layout
    for bad in ([b"x", b"", b""], [b"", b"1"], [b"", b"a", b"b", b"c", b"d"]):
        with pytest.raises(WireError):
            parse_replay_answer(bad)


def test_an_unknown_profile_value_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="schema must be one of"):
        WireProfile(schema="vllm-9.9")
    with pytest.raises(ValueError, match="wire must be one of"):
        WireProfile(replay_layout="topic")  # type: ignore[arg-type]


# --- the references, over real sockets ----------------------------------------------


def _ports() -> tuple[str, str]:
    socks = [socket.socket() for _ in range(2)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return f"tcp://127.0.0.1:{ports[0]}", f"tcp://127.0.0.1:{ports[1]}"


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


def test_the_reference_publisher_answers_in_the_topic_layout(
    ctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    endpoint, replay = _ports()
    with KVEventPublisher(endpoint, replay, topic="kv", replay_layout="topic-seq-payload") as pub:
        for i in range(3):
            pub.publish(KVEventBatch(float(i), []))
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(replay)
        deadline = time.monotonic() + 5
        answers: list[list[bytes]] = []
        while time.monotonic() < deadline and not answers:
            if pub.stats()["published"] == 3:
                dealer.send_multipart(replay_request(1))
                while dealer.poll(2000):
                    answers.append(dealer.recv_multipart())
                    if answers[-1][2] == (-1).to_bytes(8, "big", signed=True):
                        break
    assert [parse_replay_answer(a).seq for a in answers] == [1, 2, -1]
    assert [a[1] for a in answers] == [b"kv", b"kv", b""]


@pytest.mark.parametrize("layout", REPLAY_LAYOUTS)
def test_the_reference_subscriber_reads_both_layouts(
    ctx: zmq.Context[zmq.Socket[bytes]], layout: Any,
) -> None:
    pub = ctx.socket(zmq.XPUB)
    router = ctx.socket(zmq.ROUTER)
    for sock in (pub, router):
        sock.setsockopt(zmq.LINGER, 0)
    pub.bind("tcp://127.0.0.1:0")
    router.bind("tcp://127.0.0.1:0")
    with KVEventSubscriber(pub.getsockopt_string(zmq.LAST_ENDPOINT),
                           router.getsockopt_string(zmq.LAST_ENDPOINT), topic="kv") as sub:
        assert pub.poll(5000)
        pub.recv()  # the subscription
        batches = [KVEventBatch(float(i), [AllBlocksCleared()]) for i in range(3)]
        payloads = [encode_batch(b) for b in batches]
        unknown = msgspec.msgpack.encode({"ts": 9.0, "events": [
            {"type": "BlockTeleported"}, {"type": "AllBlocksCleared"}]})
        pub.send_multipart([b"kv", (0).to_bytes(8, "big"), payloads[0]])
        pub.send_multipart([b"kv", (2).to_bytes(8, "big"), payloads[2]])  # seq 1 missing
        got: list[tuple[int, KVEventBatch]] = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(got) < 3:
            got += sub.poll(20)
            if router.poll(0):
                identity, _, start = router.recv_multipart()
                seq = int.from_bytes(start, "big")
                for s in range(seq, 3):
                    frames = replay_answer_frames(layout, b"kv", s.to_bytes(8, "big"),
                                                  payloads[s])
                    router.send_multipart([identity, *frames])
                router.send_multipart([identity, *replay_end_frames(layout)])
        assert [s for s, _ in got] == [0, 1, 2]
        pub.send_multipart([b"kv", (3).to_bytes(8, "big"), unknown])
        while time.monotonic() < deadline and len(got) < 4:
            got += sub.poll(20)
        assert got[3] == (3, KVEventBatch(9.0, [AllBlocksCleared()]))
        assert sub.stats()["unknown_events"] == 1


# --- the profile check ----------------------------------------------------------------


class _SpeaksTopicLayout(KVEventPublisher):
    """Declares the default layout but always answers in the topic layout."""

    def __init__(self, endpoint: str, replay_endpoint: str, *, topic: str = "",
                 **options: Any) -> None:
        options.pop("replay_layout", None)
        super().__init__(endpoint, replay_endpoint, topic=topic,
                         replay_layout="topic-seq-payload", **options)


class _SpeaksArrays(KVEventPublisher):
    """Declares map payloads but always writes arrays."""

    def __init__(self, endpoint: str, replay_endpoint: str, *, topic: str = "",
                 **options: Any) -> None:
        options.pop("encoding", None)
        super().__init__(endpoint, replay_endpoint, topic=topic, encoding="array", **options)


def test_the_reference_speaks_every_declared_profile() -> None:
    for overrides in ({}, {"wire": "topic-seq-payload", "encoding": "array-map"},
                      {"encoding": "array"}):
        assert profile_mismatch(make_spec(KVEventPublisher, overrides=overrides)) is None


def test_a_wrong_replay_layout_is_a_mismatch_naming_the_one_it_speaks() -> None:
    found = profile_mismatch(make_spec(_SpeaksTopicLayout))
    assert found is not None
    assert found.startswith("Profile mismatch: no replay answer of this publisher is in the "
                            "declared layout wire=seq-payload")
    assert found.endswith("(it answers in wire=topic-seq-payload).")


def test_a_wrong_encoding_is_a_mismatch_naming_the_one_it_speaks() -> None:
    found = profile_mismatch(make_spec(_SpeaksArrays))
    assert found is not None
    assert "nothing this publisher sent decodes under wire=seq-payload encoding=map" in found
    assert "declare the profile it speaks, encoding=array schema=" in found


class _ReadsArrays(KVEventSubscriber):
    """Declares nothing (map payloads) but decodes arrays."""

    def __init__(self, endpoint: str, replay_endpoint: str, *, topic: str = "",
                 **options: Any) -> None:
        super().__init__(endpoint, replay_endpoint, topic=topic, encoding="array", **options)


def test_a_subscriber_reading_another_encoding_is_a_mismatch() -> None:
    from conformance.contracts.kv_events.subscriber.peer import SubscriberSpec
    from conformance.contracts.kv_events.subscriber.profile_check import (
        profile_mismatch as subscriber_mismatch,
    )

    found = subscriber_mismatch(SubscriberSpec("reads-arrays", _ReadsArrays, {}))
    assert found is not None
    assert found.startswith("Profile mismatch: the subscriber delivered none of the batches "
                            "the suite sent in encoding=map schema=base")
    assert found.endswith("(it reads encoding=array).")
    assert subscriber_mismatch(SubscriberSpec("ref", KVEventSubscriber, {})) is None
