"""What crosses the pipeline: PIPE-1 (fidelity, framing), PIPE-2 (streams), PIPE-3 (buffers).

The full pipeline (client and engine under test) carries payloads out and
back: the fake model echoes a request's payload on its first output, so a
payload is checked after two encodings and two decodings. Raw peers check
each side's frames alone: the suite's engine reads the client's ADD frames,
the suite's client reads the engine's outputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from conformance.contracts.engine_pipeline.harness import Rig, Streams, guarded, request_id
from conformance.contracts.engine_pipeline.peers import RawClient, RawEngine
from reference_impl.engine_pipeline import vllm_wire, wire
from reference_impl.engine_pipeline.model import detail_of, token_of
from reference_impl.engine_pipeline.wire import EngineOutputs, FinishReason, RequestType

_rng = np.random.default_rng(20260)


def _arrays() -> dict[str, Any]:
    """Arrays of every dtype kind the profile carries, in every awkward shape."""
    values: dict[str, Any] = {}
    for dtype in ("|b1", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "<f2", "<f4",
                  "<f8", "<c8", "<c16", ">i4", ">f8", "<M8[ns]", "<m8[s]", "|S3", "<U2"):
        base = np.frombuffer(_rng.bytes(np.dtype(dtype).itemsize * 24), dtype=dtype)
        values[f"{dtype}-vec"] = base.copy()
        values[f"{dtype}-0d"] = base[0].copy() if base.ndim else base
        values[f"{dtype}-0d"] = np.array(base[0], dtype=dtype)
        values[f"{dtype}-empty"] = base[:0].reshape(0, 3)
        values[f"{dtype}-strided"] = base[::3]
        values[f"{dtype}-fortran"] = base.reshape(4, 6).T
    for size in (255, 256, 257, 65535, 65536, 65537):
        values[f"u8-{size}"] = np.frombuffer(_rng.bytes(size), dtype=np.uint8)
        values[f"bytes-{size}"] = _rng.bytes(size)
    return values


def _same(sent: Any, got: Any) -> str | None:
    """Where ``got`` differs from ``sent`` (dtype, shape and bytes for arrays)."""
    if isinstance(sent, np.ndarray):
        if not isinstance(got, np.ndarray):
            return f"an array arrived as {type(got).__name__}"
        if sent.dtype != got.dtype or sent.shape != got.shape:
            return f"{sent.dtype}{sent.shape} arrived as {got.dtype}{got.shape}"
        if np.ascontiguousarray(sent).tobytes() != np.ascontiguousarray(got).tobytes():
            return f"{sent.dtype}{sent.shape}: the bytes differ"
        return None
    if isinstance(sent, bytes):
        if bytes(got) != sent:
            return f"{len(sent)} bytes arrived as {len(bytes(got))} different bytes"
        return None
    return None if sent == got else f"{sent!r:.40} arrived as {got!r:.40}"


@pytest.mark.clause("PIPE-1")
def test_payloads_of_every_dtype_and_size_round_trip_byte_exact(rig: Rig) -> None:
    client, _ = rig.pipeline(clause="PIPE-1")
    values = _arrays()
    names = sorted(values)
    rids = []
    # Several values per message: six at a time.
    for start in range(0, len(names), 6):
        rid = request_id("fid")
        rids.append((rid, names[start:start + 6]))
        client.add(rid, [1], 1, payload={n: values[n] for n in names[start:start + 6]})
    streams = rig.collect(client, [r for r, _ in rids], clause="PIPE-1")
    for rid, chunk in rids:
        echoed = streams.outputs[rid][0].payload
        assert isinstance(echoed, dict), f"PIPE-1: {rid}: payload echoed as {echoed!r:.60}"
        for n in chunk:
            problem = _same(values[n], echoed.get(n))
            assert problem is None, f"PIPE-1: payload value {n!r}: {problem}"


@pytest.mark.clause("PIPE-1")
def test_client_frames_follow_the_profile(rig: Rig) -> None:
    """The suite's engine reads the client's ADD: type byte, strict blob, aux frames used."""
    client = rig.client(clause="PIPE-1")
    engine = RawEngine(client.handshake_address, wire=rig.caps.wire)
    rig.closers.append(engine.close)
    ready = rig.ready_in_background(client, clause="PIPE-1")
    engine.join()
    ready()
    big = np.arange(1000, dtype="<f4")
    small = np.arange(3, dtype="<i2")
    rid = request_id("frames")
    guarded("add()", lambda: client.add(rid, [5, 6], 4, payload={"big": big, "small": small,
                                                                  "blob": b"z" * 300}), 5.0)
    got = engine.requests(3.0)
    assert got, "PIPE-1: the suite engine received no request frames after add()"
    frames = got[0]
    assert frames[0] == RequestType.ADD.value, f"PIPE-1: type frame {frames[0]!r}, expected ADD"
    # vllm-v1 sends the array and the bytes of 256 B or more in aux frames; vLLM 0.33's
    # layout (vllm-0.33) sends bytes inline, so only the array has a frame of its own.
    aux = 1 if rig.caps.wire == vllm_wire.PROFILE else 2
    assert len(frames) == 2 + aux, (
        f"PIPE-1: an ADD with a 4000-byte array, a 300-byte bytes value and a small array has "
        f"a blob and {aux} aux frame(s) on profile {rig.caps.wire}; got {len(frames) - 2}")
    request = engine.decode_add(frames[1:])  # strict: every aux index used
    assert request.request_id == rid and request.max_tokens == 4
    assert request.prompt_token_ids == [5, 6]
    assert _same(big, request.payload["big"]) is None and _same(small, request.payload["small"]) \
        is None, "PIPE-1: the arrays in the ADD differ from what add() was given"


@pytest.mark.clause("PIPE-1")
def test_oversize_request_is_refused_at_add(rig: Rig) -> None:
    limit = rig.caps.max_message_bytes
    client, _ = rig.pipeline(clause="PIPE-1")
    payload = np.zeros(limit + 1, dtype=np.uint8)
    rid = request_id("big")
    with pytest.raises(Exception) as info:
        guarded("add()", lambda: client.add(rid, [1], 1, payload=payload), 30.0)
    assert not isinstance(info.value, AssertionError)
    # Refused, the pipeline still works: the next request is answered.
    ok = request_id("after-big")
    client.add(ok, [1], 2)
    rig.collect(client, [ok], clause="PIPE-1").check(ok, "PIPE-1", max_tokens=2)


@pytest.mark.clause("PIPE-2")
def test_burst_streams_are_ordered_once_with_one_finish(rig: Rig) -> None:
    client, _ = rig.pipeline(clause="PIPE-2")
    lengths = {request_id("burst"): 1 + (i * 7) % 23 for i in range(300)}
    for rid, n in lengths.items():
        client.add(rid, [1, 2], n)
    streams = rig.collect(client, lengths, clause="PIPE-2")
    for rid, n in lengths.items():
        streams.check(rid, "PIPE-2", max_tokens=n, finish=FinishReason.LENGTH)


@pytest.mark.clause("PIPE-2")
def test_aborts_end_with_one_abort_finish_and_nothing_after(rig: Rig) -> None:
    client, _ = rig.pipeline(clause="PIPE-2", model={"stall_ms": 5})
    rids = [request_id("abort") for _ in range(20)]
    for rid in rids:
        client.add(rid, [1], 100_000)
    streams = Streams()
    deadline_tokens = 3
    while not all(len(streams.tokens(r)) >= deadline_tokens for r in rids):
        streams.take(guarded("outputs()", lambda: client.outputs(200), 5.0))
    client.abort(rids[:10])
    rig.collect(client, rids[:10], clause="PIPE-2", streams=streams)
    for rid in rids[:10]:
        streams.check(rid, "PIPE-2", finish=FinishReason.ABORT)
    # The others keep streaming; then they are aborted too.
    client.abort(rids[10:])
    rig.collect(client, rids[10:], clause="PIPE-2", streams=streams)
    for rid in rids:
        streams.check(rid, "PIPE-2", finish=FinishReason.ABORT)


@pytest.mark.clause("PIPE-2")
def test_engine_sends_nothing_after_an_abort_finish(rig: Rig) -> None:
    """The engine alone, read raw: after its ABORT finish a request is silent."""
    raw = RawClient(wire=rig.caps.wire)
    rig.closers.append(raw.close)
    rig.engine([raw.handshake_address], clause="PIPE-2", model={"stall_ms": 2})
    raw.wait_ready()
    rid = request_id("raw-abort")
    raw.add(rid, 100_000)
    seen: list[Any] = []
    while len(seen) < 5:
        seen += [o for m in raw.decoded(2.0) if isinstance(m, EngineOutputs)
                 for o in m.outputs if o.request_id == rid]
        assert seen, "PIPE-2: the engine produced no output for a running request"
    raw.abort([rid])
    after: list[Any] = []
    for m in raw.decoded(1.0):
        if isinstance(m, EngineOutputs):
            after += [o for o in m.outputs if o.request_id == rid]
    finishes = [i for i, o in enumerate(after) if o.finish_reason is not None]
    assert finishes, "PIPE-2: no ABORT finish after abort()"
    assert after[finishes[0]].finish_reason == FinishReason.ABORT
    assert finishes[0] == len(after) - 1, (
        f"PIPE-2: {len(after) - 1 - finishes[0]} output(s) of request {rid} after its ABORT "
        "finish (the engine kept running an aborted request)")


@pytest.mark.clause("PIPE-2")
def test_slow_reader_loses_nothing(rig: Rig) -> None:
    client, _process = rig.pipeline(clause="PIPE-2")
    rids = {request_id("slow"): 50 for _ in range(100)}
    for rid, n in rids.items():
        client.add(rid, [3], n)
    # Not reading while the engine produces everything.
    done = guarded("call('running')", lambda: _wait_idle(client), 15.0)
    assert done, "PIPE-2: the engine never finished its requests"
    streams = rig.collect(client, rids, clause="PIPE-2")
    for rid, n in rids.items():
        streams.check(rid, "PIPE-2", max_tokens=n)


def _wait_idle(client: Any) -> bool:
    return any(client.call("running", timeout_ms=2000) == [] for _ in range(300))


def _steps_reached(observer: RawClient, steps: int, limit_s: float = 20.0) -> None:
    """Wait (asking over an unstalled client) until the engine made ``steps`` steps."""
    import time

    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        call_id = observer.utility("step_count")
        for message in observer.decoded(1.0):
            answer = message.utility_output if isinstance(message, EngineOutputs) else None
            if answer is not None and answer.call_id == call_id and int(answer.result) >= steps:
                return
    raise AssertionError(f"PIPE-3: the engine did not reach step {steps} within {limit_s} s")


@pytest.mark.clause("PIPE-3")
def test_in_flight_output_buffers_are_never_modified(rig: Rig) -> None:
    """A stalled reader keeps large payload frames queued; the bytes read later are intact.

    Every output carries 200 deterministic inline bytes, so with 400
    requests one step's blob is above pyzmq's 64 KiB copy threshold (sent
    zero-copy); one request, added once the stalled connection's buffers are
    full, echoes a 1 KiB array (a small trailing aux frame, which pyzmq
    copies). An engine that reuses the blob buffer by the last frame's
    tracker overwrites that queued message.
    """
    raw = RawClient(stalled=True, wire=rig.caps.wire)
    observer = RawClient(client_index=1, wire=rig.caps.wire)
    rig.closers += [raw.close, observer.close]
    # 10 ms per step: the marked request joins while dozens of steps remain.
    rig.engine([raw.handshake_address, observer.handshake_address], clause="PIPE-3",
               model={"detail_bytes": 200, "stall_ms": 10})
    from threading import Thread

    waiter = Thread(target=observer.wait_ready, daemon=True)
    waiter.start()
    raw.wait_ready()
    waiter.join(60)
    steps, marked_steps = 120, 12
    rids = [request_id("zc") for _ in range(400)]
    for rid in rids:
        raw.add(rid, steps)
    # The stalled connection's socket buffers hold up to ~4 MiB (tcp_wmem's usual maximum,
    # 50-odd steps of 86 KB); after 80 steps later messages queue in the engine's pipe,
    # where a reused buffer shows.
    _steps_reached(observer, 80)
    marked = request_id("zc-aux")
    array = np.arange(256, dtype="<u4")
    raw.add(marked, marked_steps, payload={"a": array})
    seen: dict[str, list[Any]] = {}
    deadline_s = 20.0
    import time

    end = time.monotonic() + deadline_s
    want = {**dict.fromkeys(rids, steps), marked: marked_steps}
    while time.monotonic() < end and not all(
            len(seen.get(r, ())) >= n for r, n in want.items()):
        try:
            messages = raw.decoded(1.0)
        except wire.WireError as exc:
            raise AssertionError(f"PIPE-3: a queued output message no longer decodes ({exc}): "
                                 "its buffer was modified in flight") from exc
        for message in messages:
            assert isinstance(message, EngineOutputs), "PIPE-3: the engine reported its death"
            for out in message.outputs:
                seen.setdefault(out.request_id, []).append(out)
    for rid, n in want.items():
        outs = seen.get(rid, [])
        assert len(outs) == n, (
            f"PIPE-3: request {rid}: {len(outs)} outputs of {n} (queued frames were "
            "overwritten or lost)")
        for position, out in enumerate(outs):
            assert out.new_token_ids == [token_of(rid, position)], (
                f"PIPE-3: request {rid} output {position}: token {out.new_token_ids}, expected "
                f"{token_of(rid, position)} (a queued buffer was reused before it was sent)")
            assert bytes(out.detail) == detail_of(rid, position, 200), (
                f"PIPE-3: request {rid} output {position}: its bytes changed in flight")
    assert _same(array, seen[marked][0].payload["a"]) is None
