"""The ``vllm-0.33`` engine-pipeline profile: golden bytes, strict decoding, mismatch naming.

The golden bytes below were written by hand from vLLM 0.33.0's source
(``vllm/v1/engine/__init__.py``: ``EngineCoreRequest`` 22 fields,
``EngineCoreOutput`` 19, ``EngineCoreOutputs`` 9, ``UtilityOutput`` 3, all
``array_like``, and msgspec writes every field of an array-like struct;
``vllm/sampling_params.py``: ``SamplingParams(max_tokens=4)`` is the map
``stop, stop_token_ids, max_tokens, bad_words, skip_reading_prefix_cache``
after its ``__post_init__``, under a map16 header; ``vllm/v1/serial_utils.py``: an ndarray is
``[dtype.str, shape, ext 3 | aux index]``, a ``UtilityResult`` ``[None,
value]``). Nothing of vLLM is imported (it needs torch):
``thirdparty/vllm_engine_crosscheck.py --profile vllm-0.33`` checks the same
layouts against vLLM's own encoder and decoder where vLLM is installed.
"""

from __future__ import annotations

import pickle
import struct
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from _cli_run import run_contract

from conformance.contracts.engine_pipeline import preflight
from conformance.contracts.engine_pipeline.hostile_values import (
    aux_index_out_of_range,
    shape_not_buffer,
)
from conformance.contracts.engine_pipeline.spec import PipelineCapabilities, make_spec
from conformance.errors import ConfigError
from reference_impl.engine_pipeline import (
    REFERENCE,
    REFERENCE_VLLM,
    PipelineImplementation,
    VllmWireClient,
    profiles,
    reference_for,
    vllm_wire,
    wire,
)
from reference_impl.engine_pipeline.wire import (
    AddRequest,
    AuxIndexError,
    EngineOutput,
    EngineOutputs,
    ForbiddenExtension,
    MalformedPayload,
    RequestType,
    ShapeMismatch,
    UnusedAuxFrame,
    UtilityOutput,
)

NIL, FALSE = b"\xc0", b"\xc2"


def _f64(value: float) -> bytes:
    return b"\xcb" + struct.pack(">d", value)


def _str(text: str) -> bytes:
    raw = text.encode()
    assert len(raw) < 32
    return bytes([0xA0 | len(raw)]) + raw


#: SamplingParams(max_tokens=4) as vLLM 0.33 encodes it: a map of 5 keys, under a map16
#: header (msgspec sizes a struct's map header by its field count, and SamplingParams has
#: more than 15 fields).
SAMPLING_MAX_4 = (b"\xde\x00\x05" + _str("stop") + b"\x90" + _str("stop_token_ids") + b"\x90"
                  + _str("max_tokens") + b"\x04" + _str("bad_words") + b"\x90"
                  + _str("skip_reading_prefix_cache") + FALSE)

#: EngineCoreRequest("r", [1, 2], sampling_params=SamplingParams(max_tokens=4),
#: arrival_time=1.5, client_index=1), the other fields at their defaults: 22 fields.
GOLDEN_ADD = (b"\xdc\x00\x16" + _str("r") + b"\x92\x01\x02" + NIL + SAMPLING_MAX_4 + NIL
              + _f64(1.5) + NIL * 3            # lora_request, cache_salt, data_parallel_rank
              + NIL * 2 + b"\x01"              # prompt_embeds, prompt_is_token_ids, client_index
              + b"\x00\x00" + NIL + FALSE      # current_wave, priority, trace_headers, resumable
              + NIL * 3 + FALSE + NIL * 2)     # external_req_id .. abort_immediately .. kv_hints

#: EngineCoreOutput("a", [7], finish_reason=LENGTH): 19 fields.
_FINAL_OUTPUT = (b"\xdc\x00\x13" + _str("a") + b"\x91\x07" + NIL * 3 + b"\x01" + NIL * 7
                 + b"\x00" + NIL * 5)
#: EngineCoreOutputs(engine_index=0, outputs=[that], timestamp=2.0): 9 fields.
GOLDEN_OUTPUTS = b"\x99\x00\x91" + _FINAL_OUTPUT + NIL + _f64(2.0) + NIL * 5
#: EngineCoreOutputs(engine_index=1, utility_output=UtilityOutput(5,
#: result=UtilityResult([1, "x"])), timestamp=2.0).
GOLDEN_UTILITY = (b"\x99\x01\x90" + NIL + _f64(2.0) + b"\x93\x05" + NIL + b"\x92" + NIL
                  + b"\x92\x01" + _str("x") + NIL * 4)


def _encoder() -> vllm_wire.Encoder:
    return vllm_wire.Encoder(wall_clock=lambda: 1.5, monotonic_clock=lambda: 2.0)


def _frames(parts: list[Any]) -> list[bytes]:
    return [bytes(p) for p in parts]


def test_add_is_vllms_engine_core_request_byte_for_byte() -> None:
    frames = _frames(_encoder().encode(AddRequest("r", [1, 2], 4, 1)))
    assert frames == [GOLDEN_ADD]
    got = vllm_wire.decode_add([GOLDEN_ADD], vllm_wire.Decoders())
    assert got == AddRequest("r", [1, 2], 4, 1, None)


def test_outputs_and_utility_results_are_vllms_byte_for_byte() -> None:
    encoder = _encoder()
    final = EngineOutputs(0, [EngineOutput("a", [7], int(wire.FinishReason.LENGTH))])
    assert _frames(encoder.encode(final)) == [GOLDEN_OUTPUTS]
    utility = EngineOutputs(1, [], UtilityOutput(5, None, [1, "x"]))
    assert _frames(encoder.encode(utility)) == [GOLDEN_UTILITY]
    decoders = vllm_wire.Decoders()
    assert vllm_wire.decode_outputs([GOLDEN_OUTPUTS], decoders) == final
    assert vllm_wire.decode_outputs([GOLDEN_UTILITY], decoders) == utility


def test_add_decoding_takes_vllms_defaults_and_ignores_later_trailing_fields() -> None:
    decoders = vllm_wire.Decoders()
    # Nine fields (the required ones), max_tokens absent from the map: vLLM's default 16.
    short = (b"\x99" + _str("q") + b"\x91\x03" + NIL + b"\x80" + NIL + _f64(0.0) + NIL * 3)
    assert vllm_wire.decode_add([short], decoders) == AddRequest("q", [3], 16, 0, None)
    # A later release's extra trailing field is ignored, as vLLM's own decoder ignores it.
    longer = b"\xdc\x00\x17" + GOLDEN_ADD[3:] + b"\x07"
    assert vllm_wire.decode_add([longer], decoders).max_tokens == 4


def test_payload_rides_in_extra_args_and_arrays_take_vllms_form() -> None:
    small = np.arange(3, dtype="<i2")
    big = np.arange(100, dtype="<f4")  # 400 bytes: an aux frame
    frames = _frames(_encoder().encode(AddRequest("r", [1], 2, 0, {
        "small": small, "big": big, "blob": b"z" * 300, "scalar": np.array(5, "<i4")})))
    assert len(frames) == 2, "bytes travel inline in vLLM's form; only the array has a frame"
    tree = msgspec.msgpack.decode(frames[0], ext_hook=lambda code, data: (code, bytes(data)))
    payload = tree[3]["extra_args"][vllm_wire.PAYLOAD_KEY]
    assert payload["small"] == ["<i2", [3], (3, small.tobytes())]
    assert payload["big"] == ["<f4", [100], 1] and frames[1] == big.tobytes()
    assert payload["scalar"] == ["<i4", [], (3, b"\x05\x00\x00\x00")]
    assert payload["blob"] == b"z" * 300
    got = vllm_wire.decode_add(frames, vllm_wire.Decoders()).payload
    assert np.array_equal(got["big"], big) and got["big"].dtype == big.dtype
    assert np.array_equal(got["small"], small) and got["scalar"].shape == ()
    assert got["blob"] == b"z" * 300
    # A plain list that only looks like a triple stays a list.
    frames = _frames(_encoder().encode(AddRequest("r", [1], 2, 0, ["name", [1, 2], 3])))
    assert vllm_wire.decode_add(frames, vllm_wire.Decoders()).payload == ["name", [1, 2], 3]


@pytest.mark.parametrize("array", [
    np.arange(24, dtype=">f8").reshape(4, 6).T,      # Fortran order, big endian
    np.arange(40, dtype="<i8")[::3],                  # strided
    np.zeros((0, 3), dtype="<c16"),                   # empty
    np.array(["ab", "c"], dtype="<U2"),
    np.array([1, 2], dtype="<M8[ns]"),
], ids=["fortran", "strided", "empty", "unicode", "datetime"])
def test_awkward_arrays_round_trip_in_outputs(array: np.ndarray[Any, Any]) -> None:
    message = EngineOutputs(0, [EngineOutput("a", [1], None, {"x": array}, b"d" * 70000)])
    frames = _frames(vllm_wire.Encoder().encode(message))
    got = vllm_wire.decode_outputs(frames, vllm_wire.Decoders()).outputs[0]
    assert got.payload["x"].dtype == array.dtype and got.payload["x"].shape == array.shape
    assert np.ascontiguousarray(got.payload["x"]).tobytes() \
        == np.ascontiguousarray(array).tobytes()
    assert got.detail == b"d" * 70000


def _hostile_adds(tmp: Path) -> dict[str, tuple[list[bytes], type[Exception]]]:
    encoder = vllm_wire.Encoder()

    def add(payload: Any) -> bytes:
        return bytes(encoder.encode(AddRequest("h", [1], 1, 0, payload))[0])

    evil = pickle.dumps(_Marker(str(tmp / "unpickled")))
    profile = vllm_wire.PROFILE
    return {
        "pickle": ([add({"x": msgspec.msgpack.Ext(1, evil)})], ForbiddenExtension),
        "cloudpickle": ([add({"x": msgspec.msgpack.Ext(2, evil)})], ForbiddenExtension),
        "vllm-v1's array extension": ([add({"x": msgspec.msgpack.Ext(16, b"\x90")})],
                                      ForbiddenExtension),
        "aux index out of range": ([add(aux_index_out_of_range(profile, 5))], AuxIndexError),
        "shape vs buffer": ([add(shape_not_buffer(profile))], ShapeMismatch),
        "unused aux frame": ([add(None), b"extra" * 100], UnusedAuxFrame),
        "object dtype": ([add(["|O", [1], msgspec.msgpack.Ext(3, b"12345678")])],
                         ShapeMismatch),
        "vllm-v1 layout": ([msgspec.msgpack.encode(AddRequest("h", [1], 1, 0))],
                           MalformedPayload),
        "multimodal features": ([b"\x99" + _str("q") + b"\x91\x03\x90\x80" + NIL + _f64(0.0)
                                 + NIL * 3], MalformedPayload),
        "max_tokens None": ([b"\x99" + _str("q") + b"\x91\x03" + NIL + b"\x81"
                             + _str("max_tokens") + NIL + NIL + _f64(0.0) + NIL * 3],
                            MalformedPayload),
    }


class _Marker:
    """Unpickling this creates a file: the marker of code execution."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.path, "w"))


def test_strict_decoding_refuses_each_deviation_for_what_it_is(tmp_path: Path) -> None:
    decoders = vllm_wire.Decoders()
    for name, (frames, error) in _hostile_adds(tmp_path).items():
        with pytest.raises(error):
            vllm_wire.decode_request([RequestType.ADD.value, *frames], decoders)
        assert not (tmp_path / "unpickled").exists(), f"{name}: unpickled"


def test_strict_output_decoding_refuses_imports_and_unknown_finish_reasons() -> None:
    decoders = vllm_wire.Decoders()
    typed = (b"\x99\x01\x90" + NIL + _f64(2.0) + b"\x93\x05" + NIL + b"\x92"
             + b"\x92" + _str("os") + _str("system") + b"\x01" + NIL * 4)
    with pytest.raises(ForbiddenExtension, match="names a type to import"):
        vllm_wire.decode_outputs([typed], decoders)
    repetition = GOLDEN_OUTPUTS.replace(NIL * 3 + b"\x01", NIL * 3 + b"\x04", 1)
    with pytest.raises(MalformedPayload, match="finish reason 4"):
        vllm_wire.decode_outputs([repetition], decoders)
    # vllm-v1's final output: its finish reason sits where vLLM has new_logprobs. Refused,
    # never misread as a running output.
    with pytest.raises(MalformedPayload, match=r"at `\$\[1\]\[0\]\[2\]`"):
        vllm_wire.decode_outputs([msgspec.msgpack.encode(EngineOutputs(0, [EngineOutput(
            "a", [1], 1)]))], decoders)
    with pytest.raises(MalformedPayload, match=r"\$\[1\]\[0\]\[3\]"):  # its payload slot
        vllm_wire.decode_outputs([msgspec.msgpack.encode(EngineOutputs(0, [EngineOutput(
            "a", [1], None, {"big": msgspec.msgpack.Ext(17, b"\x01")})]))], decoders)


def test_profiles_registry_and_references() -> None:
    assert profiles.codec("vllm-v1") is wire and profiles.codec("vllm-0.33") is vllm_wire
    with pytest.raises(ValueError, match=r"known: vllm-v1, vllm-0\.33"):
        profiles.codec("sglang")
    assert reference_for("vllm-v1") is REFERENCE and reference_for("vllm-0.33") is REFERENCE_VLLM
    assert PipelineCapabilities.from_mapping({"wire": "vllm-0.33"}, origin="t").wire \
        == "vllm-0.33"
    with pytest.raises(ConfigError, match=r"wire must be one of vllm-v1, vllm-0\.33"):
        PipelineCapabilities.from_mapping({"wire": "vllm"}, origin="t")
    # The default profile stays vllm-v1, its bytes unchanged.
    assert PipelineCapabilities().wire == REFERENCE.capabilities["wire"] == "vllm-v1"
    assert bytes(wire.Encoder().encode(AddRequest("r", [1], 2, 0))[0]) \
        == b"\x95\xa1r\x91\x01\x02\x00\xc0"


def test_a_client_on_the_other_profile_is_a_named_mismatch() -> None:
    spec = make_spec(PipelineImplementation(client=VllmWireClient,
                                            capabilities={"wire": "vllm-v1"}), name="c")
    with pytest.raises(ConfigError) as info:
        preflight.check_profile(spec)
    message = str(info.value)
    assert "\n" not in message
    assert "client of c" in message and "under wire profile vllm-v1 (declared)" in message
    assert "declare --capability wire=vllm-0.33" in message


def test_an_engine_on_the_other_profile_is_a_named_mismatch() -> None:
    spec = make_spec(REFERENCE.__class__(engine=REFERENCE.engine,
                                         capabilities={"wire": "vllm-0.33"}), name="e")
    with pytest.raises(ConfigError, match=r"the engine of e .* decodes under vllm-v1; no "
                       r"clause is judged: declare --capability wire=vllm-v1"):
        preflight.check_profile(spec)


def test_each_reference_speaks_its_declared_profile() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        assert preflight.engine_speaks(make_spec(REFERENCE_VLLM, name="v"), Path(tmp)) \
            == "vllm-0.33"
    preflight.check_profile(make_spec(PipelineImplementation(
        client=REFERENCE_VLLM.client, capabilities={"wire": "vllm-0.33"}), name="vc"))


#: The suite's tests where the payload layouts are what is judged (PIPE-1 fidelity and
#: framing, PIPE-2 streams, PIPE-7 hostile frames both ways). The whole contract on
#: REFERENCE_VLLM: ``zmq-conformance run --contract engine-pipeline --transport
#: reference_impl.engine_pipeline:REFERENCE_VLLM`` (docs/engine_pipeline.md).
_LAYOUT_TESTS = ("test_payloads_of_every_dtype_and_size_round_trip_byte_exact or "
                 "test_client_frames_follow_the_profile or test_burst_streams or "
                 "test_hostile_frames_never_run_code or test_hostile_outputs_never_run_code")


def test_reference_on_vllm_033_passes_the_layout_clauses_through_the_cli(
        tmp_path: Path) -> None:
    run = run_contract("engine-pipeline", tmp_path, "--transport",
                       "reference_impl.engine_pipeline:REFERENCE_VLLM", "-k", _LAYOUT_TESTS)
    assert run.status == 0, run.output
    passed = {cid for cid, verdict in run.verdicts.items() if verdict == "passed"}
    assert {"PIPE-1", "PIPE-2", "PIPE-7"} <= passed, run.verdicts
