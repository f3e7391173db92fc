"""The ``vllm-v1`` wire profile of the engine pipeline: frames, MessagePack, arrays.

This module is the profile, written down once for both sides (the reference
client and engine, and the conformance suite's raw peers).

Sockets
    Each client (an API server) binds a ROUTER (requests in), a PULL
    (outputs in) and a ROUTER for the startup handshake. Each engine connects
    a DEALER whose routing identity is its engine index as 2 bytes little
    endian, and a PUSH, to every client.

Requests (client ROUTER -> engine DEALER)
    ``[type byte, blob, aux frames...]`` with the type bytes of
    :class:`RequestType` (ADD 0x00, ABORT 0x01, START_DP_WAVE 0x02,
    UTILITY 0x03). The blob is MessagePack: ADD an array-like
    :class:`AddRequest`, ABORT a list of request ids, UTILITY
    ``(client_index, call_id, method, args)``, START_DP_WAVE ``(wave,
    exclude_engine_index)``. The ROUTER prefixes the engine's identity frame.

Outputs (engine PUSH -> client PULL)
    ``[blob, aux frames...]``, the blob an array-like :class:`EngineOutputs`.
    A fatal engine error is the single frame :data:`ENGINE_CORE_DEAD`.

Arrays and large bytes
    A numpy array is the extension :data:`EXT_NDARRAY` holding MessagePack
    ``[dtype.str, shape, data]``; ``data`` is the raw bytes inline when the
    array has fewer than :data:`INLINE_THRESHOLD` bytes, else the index of
    the aux frame that carries them (frame 0 is the blob, so indices start at
    1). Bytes of :data:`INLINE_THRESHOLD` or more are the extension
    :data:`EXT_AUX_BYTES` holding the aux index. Non-contiguous arrays are
    sent as their C-contiguous copy; object and structured dtypes have no
    wire form (they would need pickle) and are refused when encoding.

Strict decoding
    Nothing here ever unpickles. The extensions vLLM reserves for pickle
    (:data:`EXT_PICKLE`) and cloudpickle (:data:`EXT_CLOUDPICKLE`) and every
    unknown extension raise :class:`ForbiddenExtension`; an aux index out of
    range raises :class:`AuxIndexError`, an aux frame nothing refers to
    :class:`UnusedAuxFrame`, a shape that does not match its buffer
    :class:`ShapeMismatch`, undecodable MessagePack :class:`MalformedPayload`,
    an unknown type byte :class:`UnknownRequestType`. All are
    :class:`WireError`, so a receive loop guards one exception type.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from typing import Any, Final

import msgspec
import numpy as np
import zmq

__all__ = [
    "ENGINE_CORE_DEAD",
    "EXT_AUX_BYTES",
    "EXT_CLOUDPICKLE",
    "EXT_NDARRAY",
    "EXT_PICKLE",
    "INLINE_THRESHOLD",
    "PROFILE",
    "AddRequest",
    "AuxBytes",
    "AuxIndexError",
    "Decoders",
    "Encoder",
    "EngineOutput",
    "EngineOutputs",
    "FinishReason",
    "ForbiddenExtension",
    "MalformedPayload",
    "RequestType",
    "ShapeMismatch",
    "UnencodableValue",
    "UnknownRequestType",
    "UnusedAuxFrame",
    "UtilityOutput",
    "WireError",
    "decode_abort",
    "decode_add",
    "decode_handshake",
    "decode_outputs",
    "decode_request",
    "decode_utility",
    "encode_handshake",
    "engine_identity",
    "identity_index",
    "prepare",
    "recv_frames",
]

PROFILE: Final = "vllm-v1"
#: Arrays and bytes with this many bytes or more travel in aux frames.
INLINE_THRESHOLD: Final = 256
#: The one-frame message a dying engine sends on every output socket.
ENGINE_CORE_DEAD: Final = b"ENGINE_CORE_DEAD"

EXT_PICKLE: Final = 1
EXT_CLOUDPICKLE: Final = 2
EXT_RAW_VIEW: Final = 3
EXT_NDARRAY: Final = 16
EXT_AUX_BYTES: Final = 17

# dtype strings with a wire form: byte order, kind, item size, optional unit.
_DTYPE = re.compile(r"^[<>|=]?[biufcmMSU]\d{1,4}(\[[A-Za-z0-9]{1,4}\])?$")
_MAX_DIMS: Final = 32


class RequestType(bytes, enum.Enum):
    """The first frame of every request."""

    ADD = b"\x00"
    ABORT = b"\x01"
    START_DP_WAVE = b"\x02"
    UTILITY = b"\x03"


class FinishReason(enum.IntEnum):
    """Why a request finished (vLLM's values; ERROR: rejected or failed by the engine)."""

    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3


# -- errors --------------------------------------------------------------------


class WireError(ValueError):
    """Frames that are not a valid message of the profile."""


class UnknownRequestType(WireError):
    """The first frame is not one of :class:`RequestType`."""


class MalformedPayload(WireError):
    """The blob is not MessagePack of the expected shape (or frames are missing)."""


class ForbiddenExtension(WireError):
    """A MessagePack extension that is refused: pickle, cloudpickle, or unknown."""


class AuxIndexError(WireError):
    """An aux frame index that is out of range."""


class UnusedAuxFrame(WireError):
    """An aux frame no value refers to."""


class ShapeMismatch(WireError):
    """An array whose dtype and shape do not match its buffer, or a refused dtype."""


class UnencodableValue(TypeError):
    """A value the profile cannot carry (object arrays, arbitrary objects)."""


# -- messages ------------------------------------------------------------------

# ``gc=False``: the cyclic garbage collector does not track these structs. A
# pipeline makes one per request and per output token, and each tracked one
# counted toward the next collection (1,000 requests x 16 tokens: 52
# young-generation collections in the client, 14 without them, and a full
# collection of the whole heap about every other round). It is
# safe because no reference cycle runs through them: they are built from
# decoded MessagePack (a tree) or by the engine from its request, and hold
# values, never themselves; the lists and dicts inside are still tracked.


class AddRequest(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """ADD: a request, the suite's subset of vLLM's ``EngineCoreRequest``."""

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    client_index: int
    payload: Any = None


class EngineOutput(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One request's progress in one step (``payload`` only on its first output)."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: int | None = None
    payload: Any = None
    detail: Any = None


class UtilityOutput(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """The result of a utility call (``failure_message`` set when it raised)."""

    call_id: int
    failure_message: str | None = None
    result: Any = None


class EngineOutputs(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One output message: an engine's outputs for one client, and/or one utility result."""

    engine_index: int
    outputs: list[EngineOutput] = []
    utility_output: UtilityOutput | None = None


def engine_identity(engine_index: int) -> bytes:
    """The DEALER routing identity of engine ``engine_index`` (2 bytes little endian)."""
    return engine_index.to_bytes(2, "little")


def identity_index(identity: bytes) -> int | None:
    """The engine index an identity names, ``None`` if it is not 2 bytes."""
    return int.from_bytes(identity, "little") if len(identity) == 2 else None


# -- encoding ------------------------------------------------------------------


class Encoder:
    """MessagePack with aux frames; one instance per thread (it keeps a buffer list).

    :meth:`encode` returns ``[blob, aux...]``. The blob is a fresh
    ``bytearray`` unless ``into`` is given, in which case it is written into
    that buffer (reused: the caller must only pass a buffer no frame in
    flight still uses).
    """

    #: The profile named in "has no ... wire form" errors.
    profile: str = PROFILE

    def __init__(self) -> None:
        self._aux: list[Any] = []
        self._encoder = msgspec.msgpack.Encoder(enc_hook=self._enc_hook)

    def encode(self, value: Any, *, into: bytearray | None = None) -> list[Any]:
        self._aux = [None]
        try:
            blob = bytearray() if into is None else into
            self._encoder.encode_into(value, blob)
            frames: list[Any] = self._aux
            frames[0] = blob
            return frames
        finally:
            self._aux = []

    def _aux_index(self, data: Any) -> int:
        self._aux.append(data)
        return len(self._aux) - 1

    def _enc_hook(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            return self._encode_array(obj)
        if isinstance(obj, np.generic):
            return self._encode_array(np.asarray(obj))
        if isinstance(obj, AuxBytes):
            return msgspec.msgpack.Ext(EXT_AUX_BYTES, _pack_int(self._aux_index(obj.data)))
        raise UnencodableValue(f"{type(obj).__name__} has no {self.profile} wire form")

    def _encode_array(self, array: np.ndarray[Any, Any]) -> msgspec.msgpack.Ext:
        dtype_str, shape, raw = array_layout(array, self.profile)
        data = bytes(raw) if len(raw) < INLINE_THRESHOLD else self._aux_index(raw)
        return msgspec.msgpack.Ext(EXT_NDARRAY, msgspec.msgpack.encode([dtype_str, shape, data]))


def array_layout(array: np.ndarray[Any, Any], profile: str) -> tuple[str, list[int], Any]:
    """``(dtype string, shape, bytes)`` of ``array`` as every profile sends one: the
    bytes C-ordered (a memoryview of them, ``b""`` when empty). Object and
    structured dtypes are refused (they would need pickle)."""
    dtype = array.dtype
    if dtype.kind in "OV" or dtype.fields is not None or not _DTYPE.match(dtype.str):
        raise UnencodableValue(f"arrays of dtype {dtype} have no {profile} wire form "
                               "(object and structured dtypes would need pickle)")
    contiguous = array if array.flags.c_contiguous else array.copy(order="C")
    flat: Any = contiguous.reshape(-1).view(np.uint8)
    raw: Any = memoryview(flat) if contiguous.nbytes else b""
    return dtype.str, list(contiguous.shape), raw


class AuxBytes:
    """Bytes the encoder sends in an aux frame (see :func:`prepare`)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self.data = data


def _pack_int(value: int) -> bytes:
    return msgspec.msgpack.encode(value)


def prepare(value: Any) -> Any:
    """``value`` with every bytes-like of :data:`INLINE_THRESHOLD` or more as :class:`AuxBytes`.

    msgspec writes bytes-likes inline without asking the encoder's hook, so
    large ones are wrapped first; the hook moves them to aux frames. Lists,
    tuples and dicts are rebuilt (tuples as lists, as MessagePack has one
    array type); anything else is returned as it is.
    """
    if isinstance(value, bytes | bytearray | memoryview):
        return AuxBytes(value) if memoryview(value).nbytes >= INLINE_THRESHOLD else value
    if isinstance(value, dict):
        return {k: prepare(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [prepare(v) for v in value]
    return value


# -- decoding ------------------------------------------------------------------


class AuxFrames:
    """The aux frames of one message and which of them were referenced (every profile's)."""

    def __init__(self, frames: Sequence[Any]) -> None:
        self.frames = frames
        self.used: set[int] = set()

    def take(self, index: Any) -> memoryview:
        if not isinstance(index, int) or isinstance(index, bool):
            raise MalformedPayload(f"aux reference {index!r:.40} is not an integer")
        if not 1 <= index < len(self.frames):
            raise AuxIndexError(f"aux frame index {index} out of range: the message has "
                                f"{len(self.frames) - 1} aux frame(s)")
        self.used.add(index)
        return frame_buffer(self.frames[index])

    def check_all_used(self) -> None:
        if len(self.used) == len(self.frames) - 1:  # ``used`` holds indices 1.. only
            return
        unused = sorted(set(range(1, len(self.frames))) - self.used)
        if unused:
            raise UnusedAuxFrame(f"aux frame(s) {unused} referenced by nothing")


def frame_buffer(frame: Any) -> memoryview:
    """A frame's bytes (a ``zmq.Frame``'s buffer, or any bytes-like) as a byte view."""
    buf = getattr(frame, "buffer", None)
    return memoryview(buf if buf is not None else frame).cast("B")


def _decode_array(body: memoryview, aux: AuxFrames) -> np.ndarray[Any, Any]:
    try:
        parts = msgspec.msgpack.decode(body)
    except msgspec.DecodeError as exc:
        raise MalformedPayload(f"array header is not MessagePack: {exc}") from None
    if not (isinstance(parts, list) and len(parts) == 3):
        raise MalformedPayload("an array is [dtype, shape, data]")
    dtype_str, shape, data = parts
    if not isinstance(dtype_str, str):
        raise ShapeMismatch(f"dtype {dtype_str!r:.40} has no {PROFILE} wire form")
    dtype = checked_dtype(dtype_str, shape, PROFILE)
    buf = aux.take(data) if isinstance(data, int) else data
    if not isinstance(buf, bytes | memoryview):
        raise MalformedPayload(f"array data is a {type(data).__name__}, not bytes or an index")
    return array_from(buf, dtype, dtype_str, shape)


def checked_dtype(dtype_str: str, shape: Any, profile: str) -> np.dtype[Any]:
    """The dtype an array header names, once its dtype string has a wire form and its
    shape is a list of at most ``_MAX_DIMS`` non-negative integers (every profile's rule)."""
    if not _DTYPE.match(dtype_str):
        raise ShapeMismatch(f"dtype {dtype_str!r:.40} has no {profile} wire form")
    if not (isinstance(shape, list) and len(shape) <= _MAX_DIMS
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise ShapeMismatch(f"shape {shape!r:.60} is not a list of non-negative integers")
    try:
        return np.dtype(dtype_str)
    except TypeError as exc:
        raise ShapeMismatch(f"dtype {dtype_str!r}: {exc}") from None


def array_from(buf: Any, dtype: np.dtype[Any], dtype_str: str,
               shape: list[int]) -> np.ndarray[Any, Any]:
    """The array over ``buf`` (no copy), once its size is exactly what the shape needs."""
    count = 1
    for d in shape:
        count *= d
    if count * dtype.itemsize != len(buf):
        raise ShapeMismatch(f"shape {shape} of {dtype_str} needs {count * dtype.itemsize} "
                            f"bytes, the buffer has {len(buf)}")
    return np.frombuffer(buf, dtype=dtype, count=count).reshape(tuple(shape))


def _decoder(type_: Any, aux_holder: list[AuxFrames]) -> msgspec.msgpack.Decoder[Any]:
    def ext_hook(code: int, data: memoryview) -> Any:
        aux = aux_holder[0]
        if code == EXT_NDARRAY:
            return _decode_array(data, aux)
        if code == EXT_AUX_BYTES:
            index = msgspec.msgpack.decode(data)
            return bytes(aux.take(index))
        if code == EXT_RAW_VIEW:
            return bytes(data)
        if code in (EXT_PICKLE, EXT_CLOUDPICKLE):
            raise ForbiddenExtension(f"MessagePack extension {code} (pickle) refused: "
                                     "unpickling untrusted frames runs code (CVE-2025-30165)")
        raise ForbiddenExtension(f"unknown MessagePack extension {code}")

    return msgspec.msgpack.Decoder(type_, ext_hook=ext_hook)


#: A message of one frame has no aux frames: every aux reference in it is out of range,
#: and :meth:`AuxFrames.take` raises before it records anything, so one instance serves
#: every such message (no bookkeeping to allocate or check per message).
_NO_AUX: Final = AuxFrames((None,))
#: Blobs below this size are decoded from a ``bytes`` copy: cheaper than a memoryview
#: of the frame (and msgspec parses ``bytes`` faster); larger ones are decoded in place.
_SMALL_BLOB: Final = 64 << 10


def _blob(frame: Any) -> Any:
    """The buffer the blob frame is decoded from (nothing decoded refers to it)."""
    if isinstance(frame, zmq.Frame):
        return frame.bytes if len(frame) < _SMALL_BLOB else frame_buffer(frame)
    return frame if isinstance(frame, bytes) else frame_buffer(frame)


class _Decoding:
    """A decoder of one message type with aux-frame bookkeeping (one per thread)."""

    def __init__(self, type_: Any) -> None:
        self._holder: list[AuxFrames] = [_NO_AUX]
        self._decoder = _decoder(type_, self._holder)

    def decode(self, frames: Sequence[Any], what: str) -> Any:
        if not frames:
            raise MalformedPayload(f"{what}: no blob frame")
        aux = _NO_AUX if len(frames) == 1 else AuxFrames(frames)
        self._holder[0] = aux
        try:
            value = self._decoder.decode(_blob(frames[0]))
        except WireError:
            raise
        except msgspec.ValidationError as exc:
            raise MalformedPayload(f"{what}: {exc}") from None
        except msgspec.DecodeError as exc:
            raise MalformedPayload(f"{what}: not MessagePack ({exc})") from None
        except (ValueError, TypeError, OverflowError, RecursionError) as exc:
            raise MalformedPayload(f"{what}: {type(exc).__name__}: {exc}") from None
        if aux is not _NO_AUX:
            aux.check_all_used()
        return value


class Decoders:
    """Every decoder of the profile; each thread that decodes owns one instance.

    ``outputs_type`` (default :class:`EngineOutputs`) is what output messages decode
    into: a struct with the same fields, types and defaults, in the same order (the
    reference client decodes straight into its delivered type).
    """

    def __init__(self, outputs_type: Any = EngineOutputs) -> None:
        self.add = _Decoding(AddRequest)
        self.abort = _Decoding(list[str])
        self.utility = _Decoding(tuple[int, int, str, list[Any]])
        self.wave = _Decoding(tuple[int, int | None])
        self.outputs = _Decoding(outputs_type)
        self.any = _Decoding(Any)
        #: Each request type byte's kind and decoder (one dict lookup per request).
        self.requests: dict[bytes, tuple[RequestType, _Decoding, str]] = {
            kind.value: (kind, decoding, kind.name) for kind, decoding in (
                (RequestType.ADD, self.add), (RequestType.ABORT, self.abort),
                (RequestType.UTILITY, self.utility), (RequestType.START_DP_WAVE, self.wave))
        }


def decode_request(frames: Sequence[Any], decoders: Decoders) -> tuple[RequestType, Any]:
    """``[type byte, blob, aux...]`` (identity frame already removed) to a typed request."""
    if len(frames) < 2:
        raise MalformedPayload(f"a request has a type frame and a blob, got {len(frames)} "
                               "frame(s)")
    frame = frames[0]
    head = frame.bytes if isinstance(frame, zmq.Frame) else bytes(frame_buffer(frame))
    entry = decoders.requests.get(head)
    if entry is None:
        raise UnknownRequestType(f"unknown request type byte {head!r:.20}")
    kind, decoding, name = entry
    return kind, decoding.decode(frames[1:], name)


def decode_add(frames: Sequence[Any], decoders: Decoders) -> AddRequest:
    value: AddRequest = decoders.add.decode(frames, "ADD")
    return value


def decode_abort(frames: Sequence[Any], decoders: Decoders) -> list[str]:
    value: list[str] = decoders.abort.decode(frames, "ABORT")
    return value


def decode_utility(frames: Sequence[Any], decoders: Decoders) -> tuple[int, int, str, list[Any]]:
    value: tuple[int, int, str, list[Any]] = decoders.utility.decode(frames, "UTILITY")
    return value


def decode_outputs(frames: Sequence[Any], decoders: Decoders) -> EngineOutputs:
    """``[blob, aux...]`` to :class:`EngineOutputs` (check for ENGINE_CORE_DEAD first)."""
    value: EngineOutputs = decoders.outputs.decode(frames, "outputs")
    return value


def recv_frames(sock: zmq.Socket[bytes], flags: int = 0) -> list[zmq.Frame]:
    """One whole message from ``sock`` as frames (``recv_multipart(copy=False)``'s result).

    Cheaper than ``recv_multipart``: whether more parts follow is read from
    each frame (pyzmq sets ``Frame.more`` on receipt) instead of one more
    ``getsockopt(RCVMORE)`` per part. libzmq delivers a message's parts
    together, so once the first is in, the rest are there (``flags`` such as
    ``NOBLOCK`` apply to the first).
    """
    frame = sock.recv(flags, copy=False)
    if not frame.more:
        return [frame]
    frames = [frame]
    while frame.more:
        frame = sock.recv(0, copy=False)
        frames.append(frame)
    return frames


# -- handshake -----------------------------------------------------------------

_HANDSHAKE_ENCODER = msgspec.msgpack.Encoder()
_HANDSHAKE_DECODER = msgspec.msgpack.Decoder(dict[str, Any])


def encode_handshake(message: dict[str, Any]) -> bytes:
    """A handshake message: a MessagePack map with a str ``status``."""
    return _HANDSHAKE_ENCODER.encode(message)


def decode_handshake(frame: Any) -> dict[str, Any]:
    """The map of one handshake frame; :class:`MalformedPayload` otherwise."""
    try:
        message = _HANDSHAKE_DECODER.decode(frame_buffer(frame))
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise MalformedPayload(f"handshake: {exc}") from None
    if not isinstance(message.get("status"), str):
        raise MalformedPayload("handshake: no str 'status'")
    return message
