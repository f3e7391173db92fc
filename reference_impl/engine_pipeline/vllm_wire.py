"""The ``vllm-0.33`` wire profile of the engine pipeline: vLLM 0.33's own payload layouts.

The ``vllm-v1`` profile (:mod:`.wire`) speaks vLLM V1's *framing* with the
suite's own payloads; vLLM cannot decode those (``docs/adapters.md``, "Engine
pipeline"). This profile keeps the same framing (sockets, type bytes,
``ENGINE_CORE_DEAD``, the 256 B threshold, the family's HELLO/READY
handshake) and lays every payload out as vLLM 0.33.0 does, learnt by reading
``vllm/v1/engine/__init__.py``, ``vllm/v1/serial_utils.py`` and
``vllm/sampling_params.py`` of that release (written fresh here; nothing of
vLLM's is imported or copied, so it stays torch-free).

ADD (``0x00``)
    vLLM's ``EngineCoreRequest``, an array of its 22 fields in order:
    ``request_id, prompt_token_ids, mm_features, sampling_params,
    pooling_params, arrival_time, lora_request, cache_salt,
    data_parallel_rank, prompt_embeds, prompt_is_token_ids, client_index,
    current_wave, priority, trace_headers, resumable, external_req_id,
    reasoning_ended, reasoning_parser_kwargs, abort_immediately, session_id,
    kv_hints``. ``sampling_params`` is vLLM's ``SamplingParams`` map as
    ``SamplingParams(max_tokens=N)`` encodes it (``stop``, ``stop_token_ids``,
    ``max_tokens``, ``bad_words``, ``skip_reading_prefix_cache``); a
    missing ``max_tokens`` key is vLLM's default, 16. The suite's payload
    rides in ``sampling_params.extra_args`` under :data:`PAYLOAD_KEY`:
    ``extra_args`` is the one field vLLM declares free-form (``dict[str,
    Any]``, "arbitrary additional args ... plugins") and forwards untouched,
    so a vLLM client puts it on the wire and a vLLM engine decodes it
    without error. Decoding accepts 9 fields or more (the required ones;
    later releases' trailing additions are ignored, as vLLM's decoder
    does) and refuses what the suite's fake model cannot run: multimodal
    features, pooling, LoRA, prompt embeddings, no ``sampling_params``, a
    ``max_tokens`` of None.

ABORT (``0x01``), UTILITY (``0x03``), START_DP_WAVE (``0x02``)
    As in ``vllm-v1`` (vLLM's own): a list of ids, ``(client_index,
    call_id, method, args)``, ``(wave, exclude_engine_index)``.

Outputs
    vLLM's ``EngineCoreOutputs``, 9 fields: ``engine_index, outputs,
    scheduler_stats, timestamp, utility_output, finished_requests,
    wave_complete, start_wave, weight_version``; each output vLLM's
    ``EngineCoreOutput``, 19 fields: ``request_id, new_token_ids,
    new_logprobs, new_prompt_logprobs_tensors, pooling_output,
    finish_reason, stop_reason, events, kv_transfer_params,
    ec_transfer_params, trace_headers, prefill_stats, routed_experts,
    num_nans_in_logits, mm_cache_miss_hashes, new_sampling_mask,
    spec_decode_metrics, prompt_token_id_logprobs, error``. Finish reasons
    are vLLM's (STOP 0, LENGTH 1, ABORT 2, ERROR 3; its REPETITION 4 is
    refused: the fake model never repeats). The payload echo and the
    per-output detail ride in ``kv_transfer_params`` under
    :data:`PAYLOAD_KEY` and :data:`DETAIL_KEY`: it is the one free-form map
    (``dict[str, Any]``) vLLM carries per output from the engine to its
    client and hands on to the ``RequestOutput``. ``utility_output`` is
    ``[call_id, failure_message, result]`` with ``result`` vLLM's
    ``UtilityResult`` form ``[type_info, value]``; ``type_info`` is always
    nil (vLLM imports the module it names, so it is accepted only with
    ``VLLM_ALLOW_INSECURE_SERIALIZATION``; here a non-nil one is refused as
    :class:`ForbiddenExtension`).

Arrays
    vLLM's form: the plain MessagePack array ``[dtype.str, shape, data]``,
    ``data`` extension 3 (raw bytes) when the array is 0-d or has fewer
    than :data:`INLINE_THRESHOLD` bytes, else the index of an aux frame.
    There is no array extension: vLLM's decoder knows an array by the
    field's declared type. The suite's payloads are untyped, so inside the
    free-form values (the payload, the detail, utility arguments and
    results) a 3-element array whose first element is a dtype string, its
    second a list of integers and its third an extension 3 (only arrays
    carry it), or an integer when the string is a dtype with a wire form,
    is read as an array (the suite never sends such a list otherwise).
    Bytes always travel inline (vLLM sends ``bytes`` as MessagePack bin,
    never in an aux frame).

Strict decoding
    As in ``vllm-v1``: extensions 1 (pickle) and 2 (cloudpickle) and every
    unknown extension raise :class:`ForbiddenExtension`; aux indices must be
    in range and every aux frame referenced; shapes must fit their buffers;
    object and structured dtypes have no wire form. Nothing here unpickles.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import msgspec
import numpy as np

from reference_impl.engine_pipeline import wire
from reference_impl.engine_pipeline.wire import (
    AddRequest,
    EngineOutput,
    EngineOutputs,
    ForbiddenExtension,
    MalformedPayload,
    RequestType,
    UnknownRequestType,
    UtilityOutput,
    WireError,
)

__all__ = [
    "DETAIL_KEY",
    "EXT_CLOUDPICKLE",
    "EXT_PICKLE",
    "EXT_RAW_VIEW",
    "INLINE_THRESHOLD",
    "PAYLOAD_KEY",
    "PROFILE",
    "VLLM_VERSIONS",
    "Decoders",
    "Encoder",
    "decode_abort",
    "decode_add",
    "decode_outputs",
    "decode_request",
    "decode_utility",
    "prepare",
]

PROFILE: Final = "vllm-0.33"
#: The vLLM releases whose payload layouts this profile is (read in their source).
VLLM_VERSIONS: Final = ("0.33.0",)
INLINE_THRESHOLD: Final = 256
#: Where the suite's payload rides: ``sampling_params.extra_args`` of an ADD, and
#: ``kv_transfer_params`` of a request's first output (the echo).
PAYLOAD_KEY: Final = "zmq_conformance.payload"
#: Where the fake model's per-output detail bytes ride (``kv_transfer_params``).
DETAIL_KEY: Final = "zmq_conformance.detail"

EXT_PICKLE: Final = 1
EXT_CLOUDPICKLE: Final = 2
EXT_RAW_VIEW: Final = 3

_DTYPE = re.compile(r"^[<>|=]?[biufcmMSU]\d{1,4}(\[[A-Za-z0-9]{1,4}\])?$")
_MAX_DIMS: Final = 32
_FINISH_REASONS: Final = frozenset(int(r) for r in wire.FinishReason)


# -- vLLM 0.33's structs, as their bytes lie (names and order are the wire) ---------------


class _SamplingParamsOut(msgspec.Struct, omit_defaults=True, gc=False):
    """vLLM 0.33's ``SamplingParams`` as ``SamplingParams(max_tokens=N[, extra_args=...])``
    encodes it: the fields up to the last one that call sets, in vLLM's order with vLLM's
    defaults (so exactly the non-default ones are written, and, as the struct has 16 fields
    or more, under a map16 header as vLLM's are). Its ``__post_init__`` sets ``stop``,
    ``stop_token_ids`` and ``bad_words`` to empty lists and ``skip_reading_prefix_cache``
    to False; ``max_tokens`` 16 is the default and is left out, as vLLM leaves it out."""

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    watermarking: bool | None = None
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    extra_args: dict[str, Any] | None = None
    bad_words: list[str] | None = None
    skip_reading_prefix_cache: bool | None = None


class _SamplingParamsIn(msgspec.Struct, gc=False):
    """The keys of vLLM's ``SamplingParams`` map the fake model uses (others ignored, as vLLM
    ignores keys it does not know)."""

    max_tokens: int | None = 16
    extra_args: dict[str, Any] | None = None


class _Request(msgspec.Struct, array_like=True, gc=False):
    """vLLM 0.33's ``EngineCoreRequest``; the fields typed ``None`` are ones the fake model
    cannot run (multimodal, pooling, LoRA, prompt embeddings)."""

    request_id: str
    prompt_token_ids: list[int] | None
    mm_features: None
    sampling_params: Any
    pooling_params: None
    arrival_time: float
    lora_request: None
    cache_salt: str | None
    data_parallel_rank: int | None
    prompt_embeds: None = None
    prompt_is_token_ids: list[bool] | None = None
    client_index: int = 0
    current_wave: int = 0
    priority: int = 0
    trace_headers: dict[str, str] | None = None
    resumable: bool = False
    external_req_id: str | None = None
    reasoning_ended: bool | None = None
    reasoning_parser_kwargs: dict[str, Any] | None = None
    abort_immediately: bool = False
    session_id: str | None = None
    kv_hints: Any = None


class _RequestIn(_Request, array_like=True, gc=False):
    """Decoding type of an ADD (``sampling_params`` read as the keys the model uses)."""

    sampling_params: _SamplingParamsIn | None


class _Output(msgspec.Struct, array_like=True, gc=False):
    """vLLM 0.33's ``EngineCoreOutput``."""

    request_id: str
    new_token_ids: list[int]
    # vLLM's LogprobsLists and LogprobsTensors (tuples) and a tensor: arrays on the wire.
    # Typed as lists so the vllm-v1 layout (its finish reason here) is refused, not misread.
    new_logprobs: list[Any] | None = None
    new_prompt_logprobs_tensors: list[Any] | None = None
    pooling_output: list[Any] | None = None
    finish_reason: int | None = None
    stop_reason: int | str | None = None
    events: Any = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    trace_headers: dict[str, str] | None = None
    prefill_stats: Any = None
    routed_experts: Any = None
    num_nans_in_logits: int = 0
    mm_cache_miss_hashes: list[str] | None = None
    new_sampling_mask: Any = None
    spec_decode_metrics: Any = None
    prompt_token_id_logprobs: Any = None
    error: Any = None


class _Utility(msgspec.Struct, array_like=True, gc=False):
    """vLLM's ``UtilityOutput``; ``result`` is ``[type_info, value]`` or nil."""

    call_id: int
    failure_message: str | None = None
    result: tuple[Any, Any] | None = None


class _Outputs(msgspec.Struct, array_like=True, gc=False):
    """vLLM 0.33's ``EngineCoreOutputs``."""

    engine_index: int = 0
    outputs: list[_Output] = []
    scheduler_stats: Any = None
    timestamp: float = 0.0
    utility_output: _Utility | None = None
    finished_requests: list[str] | None = None
    wave_complete: int | None = None
    start_wave: int | None = None
    weight_version: str | None = None


# -- encoding ---------------------------------------------------------------------------------


class Encoder(wire.Encoder):
    """The profile's encoder: the suite's messages in vLLM 0.33's layouts, ``[blob, aux...]``.

    :class:`~.wire.AddRequest` becomes an ``EngineCoreRequest``,
    :class:`~.wire.EngineOutputs` an ``EngineCoreOutputs``; lists and tuples
    (ABORT, UTILITY, START_DP_WAVE bodies) are encoded as they are. One
    instance per thread (it keeps the message's aux list while encoding).
    ``wall_clock`` stamps an ADD's ``arrival_time`` (vLLM: ``time.time()``),
    ``monotonic_clock`` an output message's ``timestamp`` (vLLM:
    ``time.monotonic()``); tests pass fixed clocks for golden bytes.
    """

    profile = PROFILE

    def __init__(self, *, wall_clock: Callable[[], float] = time.time,
                 monotonic_clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._wall_clock = wall_clock
        self._monotonic_clock = monotonic_clock

    def encode(self, value: Any, *, into: bytearray | None = None) -> list[Any]:
        if isinstance(value, EngineOutputs):
            value = _outputs_to_vllm(value, self._monotonic_clock())
        elif isinstance(value, AddRequest):
            value = _add_to_vllm(value, self._wall_clock())
        return super().encode(value, into=into)

    def _enc_hook(self, obj: Any) -> Any:
        if isinstance(obj, wire.AuxBytes):  # the vllm-v1 helper: vLLM sends bytes inline
            return bytes(obj.data)
        return super()._enc_hook(obj)

    def _encode_array(self, array: np.ndarray[Any, Any]) -> Any:
        dtype_str, shape, raw = wire.array_layout(array, PROFILE)
        data: Any
        if not shape or len(raw) < INLINE_THRESHOLD:
            data = msgspec.msgpack.Ext(EXT_RAW_VIEW, bytes(raw))
        else:
            data = self._aux_index(raw)
        return dtype_str, shape, data


def prepare(value: Any) -> Any:
    """``value`` as this profile sends it: unchanged (bytes travel inline here)."""
    return value


def _add_to_vllm(request: AddRequest, arrival_time: float) -> _Request:
    extra = None if request.payload is None else {PAYLOAD_KEY: request.payload}
    params = _SamplingParamsOut(stop=[], stop_token_ids=[], max_tokens=request.max_tokens,
                                extra_args=extra, bad_words=[], skip_reading_prefix_cache=False)
    return _Request(request.request_id, request.prompt_token_ids, None, params, None,
                    arrival_time, None, None, None, client_index=request.client_index)


def _output_to_vllm(output: EngineOutput) -> _Output:
    extra: dict[str, Any] | None = None
    if output.payload is not None or output.detail is not None:
        extra = {}
        if output.payload is not None:
            extra[PAYLOAD_KEY] = output.payload
        if output.detail is not None:
            extra[DETAIL_KEY] = output.detail
    return _Output(output.request_id, output.new_token_ids, None, None, None,
                   output.finish_reason, None, None, extra)


def _outputs_to_vllm(message: EngineOutputs, timestamp: float) -> _Outputs:
    utility = message.utility_output
    wire_utility = None
    if utility is not None:
        result = None if utility.failure_message is not None else (None, utility.result)
        wire_utility = _Utility(utility.call_id, utility.failure_message, result)
    return _Outputs(message.engine_index, [_output_to_vllm(o) for o in message.outputs],
                    None, timestamp, wire_utility)


# -- decoding ---------------------------------------------------------------------------------


class _RawView:
    """An extension-3 value while a message is decoded (an array's inline bytes)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


def _ext_hook(code: int, data: memoryview) -> Any:
    if code == EXT_RAW_VIEW:
        return _RawView(bytes(data))
    if code in (EXT_PICKLE, EXT_CLOUDPICKLE):
        raise ForbiddenExtension(f"MessagePack extension {code} (pickle) refused: "
                                 "unpickling untrusted frames runs code (CVE-2025-30165)")
    raise ForbiddenExtension(f"unknown MessagePack extension {code}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _looks_like_array(value: list[Any]) -> bool:
    if len(value) != 3:
        return False
    dtype, shape, data = value
    if not (isinstance(dtype, str) and isinstance(shape, list)
            and all(_is_int(d) for d in shape)):
        return False
    # Only arrays carry extension 3, so such a triple is an array (and a refused dtype is
    # refused); with an integer it is one only if the string is a dtype with a wire form.
    return isinstance(data, _RawView) or (_is_int(data) and _DTYPE.match(dtype) is not None)


def _array(value: list[Any], aux: wire.AuxFrames) -> np.ndarray[Any, Any]:
    dtype_str, shape, data = value
    dtype = wire.checked_dtype(dtype_str, shape, PROFILE)
    buf: Any = data.data if isinstance(data, _RawView) else aux.take(data)
    return wire.array_from(buf, dtype, dtype_str, shape)


def _restore(value: Any, aux: wire.AuxFrames, depth: int = 0) -> Any:
    """A free-form value with vLLM's array triples as arrays and raw views as bytes."""
    if depth > 64:
        raise MalformedPayload("a free-form value nested deeper than 64 levels")
    if isinstance(value, list):
        if _looks_like_array(value):
            return _array(value, aux)
        return [_restore(v, aux, depth + 1) for v in value]
    if isinstance(value, dict):
        return {k: _restore(v, aux, depth + 1) for k, v in value.items()}
    if isinstance(value, _RawView):
        return value.data
    return value


class _Decoding:
    """One message type's decoder, with aux bookkeeping (one per thread)."""

    def __init__(self, type_: Any) -> None:
        self._decoder = msgspec.msgpack.Decoder(type_, ext_hook=_ext_hook)

    def decode(self, frames: Sequence[Any], what: str) -> tuple[Any, wire.AuxFrames]:
        if not frames:
            raise MalformedPayload(f"{what}: no blob frame")
        aux = wire.AuxFrames(frames)
        frame = frames[0]
        try:
            blob = frame if isinstance(frame, bytes) else wire.frame_buffer(frame)
            value = self._decoder.decode(blob)
        except WireError:
            raise
        except msgspec.ValidationError as exc:
            raise MalformedPayload(f"{what}: {exc} (not vLLM {VLLM_VERSIONS[0]}'s layout)") \
                from None
        except msgspec.DecodeError as exc:
            raise MalformedPayload(f"{what}: not MessagePack ({exc})") from None
        except (ValueError, TypeError, OverflowError, RecursionError) as exc:
            raise MalformedPayload(f"{what}: {type(exc).__name__}: {exc}") from None
        return value, aux


class Decoders:
    """Every decoder of the profile; each thread that decodes owns one instance."""

    def __init__(self) -> None:
        self.add = _Decoding(_RequestIn)
        self.abort = _Decoding(list[str])
        self.utility = _Decoding(tuple[int, int, str, list[Any]])
        self.wave = _Decoding(tuple[int, int | None])
        self.outputs = _Decoding(_Outputs)
        self.any = _Decoding(Any)


def _guarded(what: str, convert: Any, *args: Any) -> Any:
    try:
        return convert(*args)
    except WireError:
        raise
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise MalformedPayload(f"{what}: {type(exc).__name__}: {exc}") from None


def _add_from_vllm(request: _RequestIn, aux: wire.AuxFrames) -> AddRequest:
    rid = request.request_id
    if request.prompt_token_ids is None:
        raise MalformedPayload(f"ADD {rid!r:.40}: no prompt_token_ids (prompt embeddings "
                               "alone): the fake model runs token prompts only")
    params = request.sampling_params
    if params is None:
        raise MalformedPayload(f"ADD {rid!r:.40}: no sampling_params (a pooling request)")
    if params.max_tokens is None:
        raise MalformedPayload(f"ADD {rid!r:.40}: sampling_params.max_tokens is None (vLLM's "
                               "input processor resolves it before the engine)")
    payload = None
    if params.extra_args is not None:
        payload = _restore(params.extra_args.get(PAYLOAD_KEY), aux)
    return AddRequest(rid, request.prompt_token_ids, params.max_tokens,
                      request.client_index, payload)


def _outputs_from_vllm(message: _Outputs, aux: wire.AuxFrames) -> EngineOutputs:
    outputs = []
    for out in message.outputs:
        reason = out.finish_reason
        if reason is not None and reason not in _FINISH_REASONS:
            raise MalformedPayload(f"output {out.request_id!r:.40}: finish reason {reason} "
                                   "is none of STOP, LENGTH, ABORT, ERROR")
        payload = detail = None
        extra = out.kv_transfer_params
        if extra is not None:
            payload = _restore(extra.get(PAYLOAD_KEY), aux)
            detail = _restore(extra.get(DETAIL_KEY), aux)
        if out.routed_experts is not None:
            _restore(out.routed_experts, aux)
        outputs.append(EngineOutput(out.request_id, out.new_token_ids, reason, payload,
                                    detail))
    utility = None
    if message.utility_output is not None:
        u = message.utility_output
        result = None
        if u.result is not None:
            type_info, value = u.result
            if type_info is not None:
                raise ForbiddenExtension(
                    f"utility result {u.call_id} names a type to import ({type_info!r:.60}): "
                    "refused (vLLM too accepts it only with "
                    "VLLM_ALLOW_INSECURE_SERIALIZATION)")
            result = _restore(value, aux)
        utility = UtilityOutput(u.call_id, u.failure_message, result)
    return EngineOutputs(message.engine_index, outputs, utility)


def decode_add(frames: Sequence[Any], decoders: Decoders) -> AddRequest:
    """An ADD blob and aux frames as the suite's :class:`~.wire.AddRequest`."""
    request, aux = decoders.add.decode(frames, "ADD")
    value: AddRequest = _guarded("ADD", _add_from_vllm, request, aux)
    aux.check_all_used()
    return value


def decode_abort(frames: Sequence[Any], decoders: Decoders) -> list[str]:
    ids, aux = decoders.abort.decode(frames, "ABORT")
    aux.check_all_used()
    value: list[str] = ids
    return value


def decode_utility(frames: Sequence[Any], decoders: Decoders) -> tuple[int, int, str, list[Any]]:
    (client_index, call_id, method, args), aux = decoders.utility.decode(frames, "UTILITY")
    restored = _guarded("UTILITY", _restore, args, aux)
    aux.check_all_used()
    return client_index, call_id, method, restored


def _decode_wave(frames: Sequence[Any], decoders: Decoders) -> tuple[int, int | None]:
    value, aux = decoders.wave.decode(frames, "START_DP_WAVE")
    aux.check_all_used()
    wave: tuple[int, int | None] = value
    return wave


_BY_TYPE: Final[dict[bytes, tuple[RequestType, Any]]] = {
    RequestType.ADD.value: (RequestType.ADD, decode_add),
    RequestType.ABORT.value: (RequestType.ABORT, decode_abort),
    RequestType.UTILITY.value: (RequestType.UTILITY, decode_utility),
    RequestType.START_DP_WAVE.value: (RequestType.START_DP_WAVE, _decode_wave),
}


def decode_request(frames: Sequence[Any], decoders: Decoders) -> tuple[RequestType, Any]:
    """``[type byte, blob, aux...]`` (identity frame removed) to a typed request; an ADD is
    the suite's :class:`~.wire.AddRequest`."""
    if len(frames) < 2:
        raise MalformedPayload(f"a request has a type frame and a blob, got {len(frames)} "
                               "frame(s)")
    head = bytes(wire.frame_buffer(frames[0]))
    entry = _BY_TYPE.get(head)
    if entry is None:
        raise UnknownRequestType(f"unknown request type byte {head!r:.20}")
    kind, decode = entry
    return kind, decode(frames[1:], decoders)


def decode_outputs(frames: Sequence[Any], decoders: Decoders) -> EngineOutputs:
    """``[blob, aux...]`` (an ``EngineCoreOutputs``) as the suite's :class:`~.wire.EngineOutputs`
    (check for ENGINE_CORE_DEAD first)."""
    message, aux = decoders.outputs.decode(frames, "outputs")
    value: EngineOutputs = _guarded("outputs", _outputs_from_vllm, message, aux)
    aux.check_all_used()
    return value
