"""The engine-pipeline reference: the vllm-v1 wire module, the fake model, both sides.

The contract itself is checked by ``conformance/contracts/engine_pipeline``;
these tests pin what the reference documents beyond it: the exact frames of
the profile, strict decoding's typed errors, the model's token function,
and the client's and engine's options and errors (in one process, on real
sockets).
"""

from __future__ import annotations

import os
import pickle
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from reference_impl.engine_pipeline import (
    REFERENCE,
    REFERENCE_ADOPT,
    AddressInUse,
    ClientClosed,
    DuplicateRequest,
    EngineClient,
    EngineCore,
    EngineDead,
    EngineFatal,
    FakeModel,
    MessageTooLarge,
    ReadyTimeout,
    UtilityFailed,
    UtilityTimeout,
    token_of,
    wire,
)
from reference_impl.engine_pipeline.model import REJECT_TOKEN, ModelFailure
from reference_impl.engine_pipeline.wire import FinishReason, RequestType

# -- wire ----------------------------------------------------------------------


def _frames(value: Any) -> list[bytes]:
    return [bytes(memoryview(f).cast("B")) for f in wire.Encoder().encode(value)]


def test_type_bytes_and_sentinel_are_the_profiles() -> None:
    assert [t.value for t in RequestType] == [b"\x00", b"\x01", b"\x02", b"\x03"]
    assert wire.ENGINE_CORE_DEAD == b"ENGINE_CORE_DEAD"
    assert wire.engine_identity(1) == b"\x01\x00"
    assert wire.identity_index(b"\x02\x01") == 258
    assert wire.identity_index(b"abc") is None


@pytest.mark.parametrize("nbytes", [0, 1, 255, 256, 257, 65536])
def test_arrays_inline_below_the_threshold_aux_from_it(nbytes: int) -> None:
    array = np.zeros(nbytes, dtype=np.uint8)
    frames = _frames(wire.AddRequest("r", [], 1, 0, {"a": array}))
    assert len(frames) == (1 if nbytes < wire.INLINE_THRESHOLD else 2)
    got = wire.decode_add(frames, wire.Decoders()).payload["a"]
    assert got.dtype == array.dtype and got.shape == array.shape


def test_bytes_from_the_threshold_travel_in_aux_frames() -> None:
    payload = wire.prepare({"small": b"s" * 255, "big": b"b" * 256, "nested": [b"n" * 300]})
    frames = _frames(wire.AddRequest("r", [], 1, 0, payload))
    assert len(frames) == 3
    got = wire.decode_add(frames, wire.Decoders()).payload
    assert got == {"small": b"s" * 255, "big": b"b" * 256, "nested": [b"n" * 300]}


@pytest.mark.parametrize("array", [
    np.array(3.5), np.zeros((0, 4), "<i8"), np.arange(24.0).reshape(4, 6).T,
    np.arange(40, dtype=">u2")[::3], np.array(["ab", "c"]), np.array([1 + 2j], "<c16"),
    np.array(["2026-01-01"], "M8[D]"), np.array([True, False]),
], ids=["0d", "empty", "fortran", "strided-be", "unicode", "complex", "datetime", "bool"])
def test_awkward_arrays_round_trip(array: np.ndarray[Any, Any]) -> None:
    got = wire.decode_add(_frames(wire.AddRequest("r", [], 1, 0, {"a": array})),
                          wire.Decoders()).payload["a"]
    assert got.dtype == array.dtype and got.shape == array.shape
    assert np.array_equal(got, array)


def test_object_and_structured_arrays_are_refused_when_encoding() -> None:
    for array in (np.array([object()]), np.zeros(2, dtype=[("a", "<i4")])):
        with pytest.raises(wire.UnencodableValue):
            wire.Encoder().encode({"a": array})


def _ext_add(code: int, data: bytes, *aux: bytes) -> list[bytes]:
    blob = msgspec.msgpack.encode(wire.AddRequest("r", [], 1, 0,
                                                  {"x": msgspec.msgpack.Ext(code, data)}))
    return [blob, *aux]


class _Marker:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.path, "w"))


def test_strict_decoding_raises_typed_errors_and_never_unpickles(tmp_path: Path) -> None:
    decoders = wire.Decoders()
    marker = tmp_path / "marker"
    cases: list[tuple[list[bytes], type[wire.WireError]]] = [
        (_ext_add(wire.EXT_PICKLE, pickle.dumps(_Marker(str(marker)))), wire.ForbiddenExtension),
        (_ext_add(wire.EXT_CLOUDPICKLE, b"x"), wire.ForbiddenExtension),
        (_ext_add(99, b"x"), wire.ForbiddenExtension),
        (_ext_add(wire.EXT_AUX_BYTES, msgspec.msgpack.encode(1)), wire.AuxIndexError),
        (_ext_add(wire.EXT_NDARRAY, msgspec.msgpack.encode(["<f4", [3], b"12"])),
         wire.ShapeMismatch),
        (_ext_add(wire.EXT_NDARRAY, msgspec.msgpack.encode(["|O8", [1], b"12345678"])),
         wire.ShapeMismatch),
        ([*_frames(wire.AddRequest("r", [], 1, 0)), b"unused"], wire.UnusedAuxFrame),
        ([b"\xc1"], wire.MalformedPayload),
        ([msgspec.msgpack.encode({"a": 1})], wire.MalformedPayload),
    ]
    for frames, error in cases:
        with pytest.raises(error):
            wire.decode_add(frames, decoders)
    with pytest.raises(wire.UnknownRequestType):
        wire.decode_request([b"\x09", b"\x90"], decoders)
    with pytest.raises(wire.MalformedPayload):
        wire.decode_request([b"\x00"], decoders)
    assert not marker.exists()


# -- the fake model ------------------------------------------------------------


def test_fake_model_is_deterministic_and_ends_requests() -> None:
    model = FakeModel()
    model.add(wire.AddRequest("a", [1], 3, 1, {"p": 1}))
    model.add(wire.AddRequest("b", [REJECT_TOKEN], 3, 0))
    outs = model.step()
    assert (0, wire.EngineOutput("b", [], int(FinishReason.ERROR))) in outs
    first = next(o for c, o in outs if o.request_id == "a")
    assert first.new_token_ids == [token_of("a", 0)] and first.payload == {"p": 1}
    model.step()
    last = model.step()
    assert last == [(1, wire.EngineOutput("a", [token_of("a", 2)], int(FinishReason.LENGTH)))]
    assert not model.has_work
    with pytest.raises(ModelFailure):
        FakeModel(raise_at_step=1).step()
    with pytest.raises(ValueError, match="unknown fake-model option"):
        FakeModel.from_options({"nope": 1})


# -- both sides in one process ---------------------------------------------------


@contextmanager
def pipeline(**client_options: Any) -> Iterator[tuple[EngineClient, EngineCore]]:
    client = EngineClient("tcp", **client_options)
    engine = EngineCore([client.handshake_address], engine_index=0, model=FakeModel())

    def serve() -> None:
        with suppress(EngineFatal):  # the sentinel test makes the step fail on purpose
            engine.serve()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        client.wait_ready()
        yield client, engine
    finally:
        engine.shutdown()
        thread.join(5)
        client.close()
        assert not thread.is_alive(), "serve() did not return after shutdown()"


def _collect(client: EngineClient, rid: str) -> list[Any]:
    outs: list[Any] = []
    deadline = time.monotonic() + 5
    while not any(o.finished for o in outs) and time.monotonic() < deadline:
        outs += [o for o in client.outputs(200) if o.request_id == rid]
    return outs


def test_client_errors_are_typed() -> None:
    with pipeline(max_message_bytes=1000) as (client, _):
        with pytest.raises(MessageTooLarge):
            client.add("big", [1], 1, payload=b"x" * 2000)
        client.add("r", [1], 100_000)
        with pytest.raises(DuplicateRequest):
            client.add("r", [1], 1)
        with pytest.raises(UtilityFailed, match="raised on purpose"):
            client.call("fail", timeout_ms=2000)
        with pytest.raises(UtilityTimeout):
            client.call("sleep", 300, timeout_ms=50)
        assert client.call("echo", 1, timeout_ms=2000) == [1]
        client.abort(["r"])
        assert _collect(client, "r")[-1].finish_reason == FinishReason.ABORT
    with pytest.raises(ClientClosed):
        client.add("late", [1], 1)
    with pytest.raises(ClientClosed):
        client.outputs()


def test_sentinel_kills_the_client_and_fails_calls() -> None:
    with pipeline() as (client, engine):
        engine.model.raise_at_step = engine.model.steps + 1
        client.add("x", [1], 5)
        deadline = time.monotonic() + 3
        with pytest.raises(EngineDead, match="ENGINE_CORE_DEAD"):
            while time.monotonic() < deadline:
                client.outputs(100)
        assert not client.alive
        with pytest.raises(EngineDead):
            client.call("echo", timeout_ms=1000)


def test_restart_option_is_checked_and_adopt_fences_a_live_incarnation() -> None:
    """``restart`` is validated; with ``adopt`` a HELLO while the engine runs is refused,
    and so is a replacement while the dead incarnation's process still runs (here: this
    process, as the engine ran in a thread of it)."""
    from conformance.contracts.engine_pipeline.peers import RawEngine
    from reference_impl.engine_pipeline import HandshakeRefused

    with pytest.raises(ValueError, match="restart must be one of none, adopt"):
        EngineClient("tcp", restart="later")
    with pipeline(restart="adopt") as (client, engine):
        stranger = RawEngine(client.handshake_address, engine_index=0)
        try:
            answer = stranger.hello(3.0)
        finally:
            stranger.close()
        assert answer is not None and answer["status"] == "REFUSED"
        assert "is running" in answer["reason"]
        engine.model.raise_at_step = engine.model.steps + 1
        client.add("x", [1], 5)
        deadline = time.monotonic() + 3
        with pytest.raises(EngineDead):
            while time.monotonic() < deadline:
                client.outputs(100)
        replacement = EngineCore([client.handshake_address], engine_index=0, model=FakeModel(),
                                 handshake_timeout_ms=3000)
        with pytest.raises(HandshakeRefused, match="still running"):
            replacement.serve()
        assert not client.alive and client.adoptions == 0


def test_ready_timeout_names_the_missing_engines() -> None:
    client = EngineClient("tcp", engine_indices=[0, 3], ready_timeout_ms=100)
    try:
        with pytest.raises(ReadyTimeout, match=r"\[0, 3\]"):
            client.wait_ready()
    finally:
        client.close()


def test_ipc_addresses_are_private_and_removed(tmp_path: Path) -> None:
    client = EngineClient("ipc")
    paths = [a.removeprefix("ipc://") for a in client.addresses.values()]
    assert all(os.path.exists(p) and len(p) <= 107 for p in paths)
    held = {role: f"ipc://{tmp_path}/{role}" for role in ("handshake", "input", "output")}
    owner = EngineClient(held)
    with pytest.raises(AddressInUse):
        EngineClient(held)
    owner.close()
    client.close()
    assert not any(os.path.exists(p) for p in paths)
    assert not any(os.path.exists(a.removeprefix("ipc://")) for a in held.values())
    EngineClient(held).close()  # free again


def test_reference_declares_its_capabilities() -> None:
    assert REFERENCE.capabilities["wire"] == "vllm-v1"
    assert REFERENCE.capabilities["restart"] == "none,adopt"
    assert REFERENCE_ADOPT.capabilities["restart"] == "adopt"
    assert REFERENCE() is REFERENCE


# -- CURVE ---------------------------------------------------------------------------


def test_curve_keys_that_do_not_fit_are_value_errors_naming_the_option() -> None:
    import zmq

    public, secret = zmq.curve_keypair()
    cases: list[tuple[Any, dict[str, Any], str]] = [
        (EngineClient, {"curve_server_secret_key": b"short",
                        "curve_allowed_client_keys": [public]}, "curve_server_secret_key"),
        (EngineClient, {"curve_server_secret_key": secret},
         "curve_allowed_client_keys and curve_zap_handler"),
        (EngineClient, {"curve_server_secret_key": secret,
                        "curve_allowed_client_keys": [public[:39]]},
         r"curve_allowed_client_keys\[0\]"),
    ]
    before = threading.active_count()
    for factory, options, option in cases:
        with pytest.raises(ValueError, match=option) as info:
            factory("tcp", **options)
        assert secret.decode() not in str(info.value)
    with pytest.raises(ValueError, match="curve_server_key"):
        EngineCore(["tcp://127.0.0.1:1"], engine_index=0, model=FakeModel(),
                   curve_client_secret_key=secret, curve_server_key=b"x" * 7)
    with pytest.raises(ValueError, match="go together"):
        EngineCore(["tcp://127.0.0.1:1"], engine_index=0, model=FakeModel(),
                   curve_client_secret_key=secret)
    assert threading.active_count() == before, "a refused configuration left a thread"


def test_curve_pipeline_serves_and_close_leaves_no_thread() -> None:
    import zmq

    server_pub, server_sec = zmq.curve_keypair()
    engine_pub, engine_sec = zmq.curve_keypair()
    before = {t.name for t in threading.enumerate()}
    client = EngineClient("tcp", curve_server_secret_key=server_sec,
                          curve_allowed_client_keys=[engine_pub])
    engine = EngineCore([client.handshake_address], engine_index=0, model=FakeModel(),
                        curve_client_secret_key=engine_sec, curve_server_key=server_pub)
    thread = threading.Thread(target=engine.serve, daemon=True)
    thread.start()
    try:
        client.wait_ready(10_000)
        client.add("c", [1], 3)
        assert [t for o in _collect(client, "c") for t in o.token_ids] == \
            [token_of("c", p) for p in range(3)]
    finally:
        engine.shutdown()
        thread.join(5)
        client.close()
    left = {t.name for t in threading.enumerate()} - before
    assert not left, f"threads left after close(): {sorted(left)}"
