"""The engine's loop: PIPE-4 (never blocked), PIPE-7 (hostile frames), PIPE-8 (routing).

The suite plays clients with raw sockets (:class:`RawClient`) where it must
send what no well-behaved client sends or stop reading on purpose.
"""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from conformance.contracts.engine_pipeline.harness import Rig, Streams, request_id
from conformance.contracts.engine_pipeline.hostile_values import (
    aux_index_out_of_range,
    shape_not_buffer,
)
from conformance.contracts.engine_pipeline.peers import RawClient
from reference_impl.engine_pipeline import profiles, wire
from reference_impl.engine_pipeline.model import ENGINE_ABORT_TOKEN, REJECT_TOKEN
from reference_impl.engine_pipeline.wire import (
    ENGINE_CORE_DEAD,
    EngineOutputs,
    FinishReason,
    RequestType,
)


def _finished(raw: RawClient, rid: str, timeout_s: float) -> list[Any]:
    """``rid``'s outputs read from ``raw`` until it finished or ``timeout_s`` passed."""
    outs: list[Any] = []
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and not any(o.finish_reason is not None for o in outs):
        for message in raw.decoded(min(0.5, max(0.01, end - time.monotonic()))):
            if isinstance(message, EngineOutputs):
                outs += [o for o in message.outputs if o.request_id == rid]
    return outs


@pytest.mark.clause("PIPE-4")
def test_a_stalled_client_costs_the_others_nothing(rig: Rig) -> None:
    """Client 1 stops reading while the engine floods it; client 0 is served within a bound."""
    fast = RawClient(client_index=0, wire=rig.caps.wire)
    stalled = RawClient(client_index=1, stalled=True, wire=rig.caps.wire)
    rig.closers += [fast.close, stalled.close]
    rig.engine([fast.handshake_address, stalled.handshake_address], clause="PIPE-4",
               model={"detail_bytes": 16 << 10})
    from threading import Thread

    waiter = Thread(target=stalled.wait_ready, daemon=True)
    waiter.start()
    fast.wait_ready()
    waiter.join(60)
    for _ in range(4):
        stalled.add(request_id("flood"), 400)
    _flood_under_way(fast, steps=200, limit_s=10.0)
    bound_s = 5.0  # a stalled engine never serves client 0; a working one takes ms
    rid = request_id("fast")
    started = time.monotonic()
    fast.add(rid, 5)
    outs = _finished(fast, rid, bound_s + 3)
    took = time.monotonic() - started
    assert outs and outs[-1].finish_reason is not None, (
        f"PIPE-4: client 0's 5-token request did not finish within {bound_s + 3:.1f} s while "
        "client 1 stopped reading (the engine blocked on the stalled client)")
    assert took <= bound_s, (f"PIPE-4: client 0 waited {took:.2f} s for 5 tokens while client 1 "
                             f"stalled; bound {bound_s} s")


def _flood_under_way(raw: RawClient, *, steps: int, limit_s: float) -> None:
    """Ask the engine for its step count (over client 0) until it made ``steps`` steps.

    Utility results travel the output path too, so an engine blocked on the
    stalled client answers none of these either: that is a PIPE-4 failure.
    """
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        call_id = raw.utility("step_count")
        for message in raw.decoded(1.0):
            answer = message.utility_output if isinstance(message, EngineOutputs) else None
            if answer is not None and answer.call_id == call_id and int(answer.result) >= steps:
                return
    raise AssertionError(f"PIPE-4: client 0 got no step count of {steps} or more within "
                         f"{limit_s} s while client 1 stalled (the engine's output path "
                         "blocked on the stalled client)")


def _hostile_frames(marker: Path, profile: str) -> dict[str, list[bytes]]:
    encoder = profiles.codec(profile).Encoder()

    def blob_of(request: wire.AddRequest) -> bytes:
        return bytes(encoder.encode(request)[0])

    blob = blob_of(wire.AddRequest("hostile", [1], 1, 0))
    # A pickle whose loading would create the marker file (never run by a strict decoder).
    evil = pickle.dumps(_Opener(str(marker)))
    pickled = blob_of(wire.AddRequest(
        "pickled", [1], 1, 0, {"x": msgspec.msgpack.Ext(wire.EXT_PICKLE, evil)}))
    bad_index = blob_of(wire.AddRequest(
        "badindex", [1], 1, 0, {"x": aux_index_out_of_range(profile, 5)}))
    bad_shape = blob_of(wire.AddRequest("badshape", [1], 1, 0,
                                        {"x": shape_not_buffer(profile)}))
    return {
        "unknown type byte": [b"\x7f", blob],
        "empty type frame": [b"", blob],
        "no blob": [RequestType.ADD.value],
        "truncated MessagePack": [RequestType.ADD.value, blob[: len(blob) // 2]],
        "garbage": [RequestType.ADD.value, os.urandom(64)],
        "wrong shape of ADD": [RequestType.ADD.value, msgspec.msgpack.encode({"a": 1})],
        "ABORT not a list": [RequestType.ABORT.value, msgspec.msgpack.encode(7)],
        "UTILITY short": [RequestType.UTILITY.value, msgspec.msgpack.encode([0, 1])],
        "aux index out of range": [RequestType.ADD.value, bad_index],
        "shape vs buffer": [RequestType.ADD.value, bad_shape],
        "pickle extension": [RequestType.ADD.value, pickled],
        "unused aux frame": [RequestType.ADD.value, blob, b"extra" * 100],
    }


class _Opener:
    """Unpickling this opens (creates) a file: the marker of code execution."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.path, "w"))


@pytest.mark.clause("PIPE-7")
def test_hostile_frames_never_run_code_nor_silence_the_engine(rig: Rig) -> None:
    marker = rig.tmp_path / "unpickled-marker"
    raw = RawClient(wire=rig.caps.wire)
    rig.closers.append(raw.close)
    process = rig.engine([raw.handshake_address], clause="PIPE-7")
    raw.wait_ready()
    for name, frames in _hostile_frames(marker, rig.caps.wire).items():
        raw.send_raw(frames)
        rid = request_id("after")
        raw.add(rid, 2)
        outs = _finished(raw, rid, 1.0 + rig.death_bound_s)
        assert not marker.exists(), (
            f"PIPE-7: after {name!r} the marker file exists: the engine unpickled a frame "
            "(code execution, CVE-2025-30165)")
        if rig.caps.malformed_input == "tolerate":
            assert outs and outs[-1].finish_reason is not None, (
                f"PIPE-7: after {name!r} the engine (malformed_input=tolerate) no longer answers "
                f"a valid request: its input loop died silently (vLLM #26139); "
                f"{process.describe()}")
        else:
            if not outs:
                status = process.exit_status(rig.death_bound_s)
                assert status not in (None, 0), (
                    f"PIPE-7: after {name!r} the engine (malformed_input=fatal) neither answered "
                    f"nor died visibly within {rig.death_bound_s} s; {process.describe()}")
                return


@pytest.mark.clause("PIPE-7")
def test_hostile_outputs_never_run_code_nor_silence_the_client(rig: Rig) -> None:
    from conformance.contracts.engine_pipeline.peers import RawEngine

    marker = rig.tmp_path / "unpickled-marker"
    client = rig.client(clause="PIPE-7")
    engine = RawEngine(client.handshake_address, wire=rig.caps.wire)
    rig.closers.append(engine.close)
    ready = rig.ready_in_background(client, clause="PIPE-7")
    engine.join()
    ready()
    rid = request_id("victim")
    client.add(rid, [1], 3)
    evil = pickle.dumps(_Opener(str(marker)))
    good = engine.outputs_frames([wire.EngineOutput(rid, [1])])[0]
    hostile = {
        "garbage": [os.urandom(40)],
        "truncated": [good[:5]],
        "pickle extension": engine.outputs_frames([wire.EngineOutput(
            rid, [1], None, msgspec.msgpack.Ext(wire.EXT_PICKLE, evil))]),
        "aux index out of range": engine.outputs_frames([wire.EngineOutput(
            rid, [1], None, aux_index_out_of_range(rig.caps.wire, 3))]),
    }
    for frames in hostile.values():
        engine.send_frames(frames)
    from reference_impl.engine_pipeline.model import token_of

    engine.send_outputs([wire.EngineOutput(rid, [token_of(rid, 0)], int(FinishReason.LENGTH))])
    streams = Streams()
    end = time.monotonic() + 1.0 + rig.death_bound_s
    while time.monotonic() < end and not streams.finished(rid):
        try:
            streams.take(client.outputs(100))
        except Exception:
            break
    assert not marker.exists(), ("PIPE-7: the client unpickled an output frame: the marker "
                                 "file exists (code execution)")
    if rig.caps.malformed_input == "tolerate":
        assert streams.finished(rid), (
            "PIPE-7: after hostile output frames the client (malformed_input=tolerate) never "
            "delivered the valid output that followed them")
        assert client.alive, "PIPE-7: hostile output frames made the client dead (tolerate)"
    else:
        assert streams.finished(rid) or not client.alive, (
            "PIPE-7: the client (malformed_input=fatal) neither survived nor died visibly")


@pytest.mark.clause("PIPE-8")
def test_outputs_reach_the_client_that_asked(rig: Rig) -> None:
    clients = [rig.client(client_index=i, client_count=2, engine_indices=[0, 1],
                          clause="PIPE-8") for i in range(2)]
    handshakes = [c.handshake_address for c in clients]
    processes = [rig.engine(handshakes, engine_index=e, clause="PIPE-8") for e in range(2)]
    waits = [rig.ready_in_background(c, clause="PIPE-8") for c in clients]
    for wait in waits:
        wait()
    plan: dict[int, dict[str, tuple[list[int], FinishReason]]] = {0: {}, 1: {}}
    for ci, client in enumerate(clients):
        for engine in (0, 1):
            for kind, prompt, reason in (
                    ("len", [1], FinishReason.LENGTH),
                    ("rej", [REJECT_TOKEN], FinishReason.ERROR),
                    ("eab", [ENGINE_ABORT_TOKEN, 2], FinishReason.ABORT),
                    ("cab", [1], FinishReason.ABORT)):
                rid = request_id(f"c{ci}e{engine}{kind}")
                client.add(rid, prompt, 4 if kind != "cab" else 100_000, engine=engine)
                plan[ci][rid] = (prompt, reason)
    for ci, client in enumerate(clients):
        client.abort([r for r in plan[ci] if "cab" in r])
    for ci, client in enumerate(clients):
        streams = rig.collect(client, plan[ci], clause="PIPE-8")
        foreign = [r for r in streams.outputs if r not in plan[ci]]
        assert not foreign, (f"PIPE-8: client {ci} received outputs of another client's "
                             f"requests: {foreign[:3]}")
        for rid, (_, reason) in plan[ci].items():
            streams.check(rid, "PIPE-8", finish=reason)
    del processes


@pytest.mark.clause("PIPE-8")
def test_engine_routes_aborts_and_rejections_by_client_index(rig: Rig) -> None:
    raws = [RawClient(client_index=i, wire=rig.caps.wire) for i in range(2)]
    rig.closers += [r.close for r in raws]
    rig.engine([r.handshake_address for r in raws], clause="PIPE-8", model={"stall_ms": 2})
    from threading import Thread

    waiter = Thread(target=raws[1].wait_ready, daemon=True)
    waiter.start()
    raws[0].wait_ready()
    waiter.join(60)
    rid_abort, rid_reject = request_id("ab1"), request_id("rj1")
    raws[1].add(rid_abort, 100_000)
    raws[1].add(rid_reject, 4, prompt=[REJECT_TOKEN])
    time.sleep(0.1)
    raws[1].abort([rid_abort])
    # Read until both endings came (a condition, not the first 50 ms pause of the stream:
    # a descheduled engine pauses that long on a loaded machine) or the deadline passed.
    ends: dict[str, Any] = {}
    deadline = time.monotonic() + 5.0
    while not {rid_abort, rid_reject} <= set(ends) and time.monotonic() < deadline:
        ends.update((o.request_id, o.finish_reason)
                    for m in raws[1].decoded(0.2) if isinstance(m, EngineOutputs)
                    for o in m.outputs if o.finish_reason is not None)
    got0 = [o for m in raws[0].decoded(0.3) if isinstance(m, EngineOutputs) for o in m.outputs]
    assert not got0, f"PIPE-8: client 0 received client 1's outputs: {got0[:2]}"
    assert ends.get(rid_abort) == FinishReason.ABORT, (
        "PIPE-8: client 1 never received the ABORT finish of its own request")
    assert ends.get(rid_reject) == FinishReason.ERROR, (
        "PIPE-8: client 1 never received the rejection of its own request")
    assert ENGINE_CORE_DEAD not in raws[1].decoded(0.05)
