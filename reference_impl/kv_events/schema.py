"""The public wire schema of the KV-cache event stream.

A KV-cache event publisher (vLLM's ``ZmqEventPublisher`` and the engines that
copied it) sends each batch of events as one three-frame PUB message::

    [topic, seq (8 bytes, big-endian), payload (MessagePack)]

``seq`` is 0 for a publisher's first batch and grows by one per batch. A
replay ROUTER next to the PUB socket answers a request ``[b"", start]`` (what
a REQ socket sends) with one message ``[b"", seq, payload]`` per retained
batch with ``seq >= start``, then the end marker ``[b"", -1, b""]`` where -1
is a *signed* 8-byte big-endian integer (``ff`` x 8).

The payload is a :class:`KVEventBatch`. Its events are tagged unions, the tag
being the class name (``"BlockStored"``, ``"BlockRemoved"``,
``"AllBlocksCleared"``). Three encodings of the same structs exist in the
field, and an implementation declares which one it speaks:

- ``"map"``: structs as MessagePack maps with default-valued fields left out
  (the reference publisher);
- ``"array"``: structs as MessagePack arrays in field order (the tag first
  for events); vLLM 0.9 to 0.23, and what vLLM's example subscriber decodes;
- ``"array-map"``: the batch as an array, its events as maps (vLLM 0.24 and
  later).

The replay layouts and the schema versions of other releases are in
:mod:`reference_impl.kv_events.wire`; this module's structs are the ``base``
schema plus, as optional fields, what later vLLM releases added.

The classes here are the suite's public types: a publisher under test is
handed :class:`KVEventBatch` instances, and a subscriber's decoded batches
are compared with them through :func:`normalize` and :func:`first_difference`.
"""

from __future__ import annotations

from typing import Any, Final, Literal, TypeAlias

import msgspec

__all__ = [
    "ENCODINGS",
    "END_MARKER_SEQ",
    "SEQ_BYTES",
    "AllBlocksCleared",
    "BlockHash",
    "BlockRemoved",
    "BlockStored",
    "Encoding",
    "KVEvent",
    "KVEventBatch",
    "SchemaError",
    "decode_batch",
    "decode_seq",
    "encode_batch",
    "encode_seq",
    "end_marker",
    "first_difference",
    "is_end_marker",
    "normalize",
    "replay_request",
]

Encoding: TypeAlias = Literal["map", "array", "array-map"]
#: The encodings an implementation may declare (its ``encoding`` capability).
ENCODINGS: Final[tuple[Encoding, ...]] = ("map", "array", "array-map")

#: Width of a sequence-number frame.
SEQ_BYTES: Final = 8
#: The seq frame of a replay's end marker: -1 as a signed 8-byte integer.
END_MARKER_SEQ: Final = (-1).to_bytes(SEQ_BYTES, "big", signed=True)

#: A block hash: vLLM sends an int (older releases) or raw bytes (newer ones).
BlockHash: TypeAlias = int | bytes


class SchemaError(ValueError):
    """A frame or payload that does not follow the wire schema."""


# --- the public structs ("map" encoding) ------------------------------------


class BlockStored(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    """Blocks entered the KV cache, chained after ``parent_block_hash``.

    ``token_ids`` holds the tokens of all the blocks, ``block_size`` per
    block; ``lora_id`` (deprecated upstream in favour of ``lora_name``) and
    ``medium`` (``"GPU"``, ``"CPU"``, ...) say which cache holds them. The
    fields after ``lora_name`` are what later vLLM releases added (see
    :data:`reference_impl.kv_events.wire.SCHEMAS`); left ``None`` they are
    not on the wire of the ``map`` encoding.
    """

    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None
    extra_keys: list[list[Any] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class BlockRemoved(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    """Blocks left the KV cache of ``medium`` (later fields: later vLLM releases)."""

    block_hashes: list[BlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    """The whole KV cache was dropped (a reset); consumers forget this worker."""


KVEvent: TypeAlias = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, omit_defaults=True, gc=False):
    """One published message: events of one engine step, in order.

    ``ts`` is the publisher's wall-clock time in seconds; a publisher stamps
    ``data_parallel_rank`` with its rank when the caller left it ``None``.
    """

    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None = None


# --- the same structs as arrays ("array" encoding, the base schema's fields) ----


class _ArrayBlockStored(
    msgspec.Struct, tag="BlockStored", array_like=True, omit_defaults=True, gc=False
):
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None


class _ArrayBlockRemoved(
    msgspec.Struct, tag="BlockRemoved", array_like=True, omit_defaults=True, gc=False
):
    block_hashes: list[BlockHash]
    medium: str | None


class _ArrayAllBlocksCleared(
    msgspec.Struct, tag="AllBlocksCleared", array_like=True, omit_defaults=True, gc=False
):
    pass


class _ArrayKVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[_ArrayBlockStored | _ArrayBlockRemoved | _ArrayAllBlocksCleared]
    data_parallel_rank: int | None = None


_TO_ARRAY: Final[dict[type[Any], type[Any]]] = {
    BlockStored: _ArrayBlockStored,
    BlockRemoved: _ArrayBlockRemoved,
    AllBlocksCleared: _ArrayAllBlocksCleared,
}
_FROM_ARRAY: Final[dict[type[Any], type[Any]]] = {v: k for k, v in _TO_ARRAY.items()}


class _ArrayMapKVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None = None


def _fields(obj: msgspec.Struct, names: tuple[str, ...] | None = None) -> tuple[Any, ...]:
    return tuple(getattr(obj, name) for name in (names or obj.__struct_fields__))


def _to_array(batch: KVEventBatch) -> _ArrayKVEventBatch:
    events = [_TO_ARRAY[type(ev)](*_fields(ev, _TO_ARRAY[type(ev)].__struct_fields__))
              for ev in batch.events]
    return _ArrayKVEventBatch(batch.ts, events, batch.data_parallel_rank)


def _from_array(batch: _ArrayKVEventBatch) -> KVEventBatch:
    events = [_FROM_ARRAY[type(ev)](*_fields(ev)) for ev in batch.events]
    return KVEventBatch(batch.ts, events, batch.data_parallel_rank)


# --- payloads ----------------------------------------------------------------

_ENCODER: Final = msgspec.msgpack.Encoder()
_DECODERS: Final[dict[Encoding, msgspec.msgpack.Decoder[Any]]] = {
    "map": msgspec.msgpack.Decoder(KVEventBatch),
    "array": msgspec.msgpack.Decoder(_ArrayKVEventBatch),
    "array-map": msgspec.msgpack.Decoder(_ArrayMapKVEventBatch),
}


def _check_encoding(encoding: str) -> Encoding:
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {ENCODINGS}, not {encoding!r}")
    return encoding


def encode_batch(batch: KVEventBatch, encoding: Encoding = "map") -> bytes:
    """The MessagePack payload of ``batch`` in ``encoding``."""
    encoding = _check_encoding(encoding)
    if encoding == "map":
        return _ENCODER.encode(batch)
    if encoding == "array-map":
        return _ENCODER.encode(_ArrayMapKVEventBatch(batch.ts, batch.events,
                                                     batch.data_parallel_rank))
    return _ENCODER.encode(_to_array(batch))


def decode_batch(payload: bytes, encoding: Encoding = "map", *,
                 unknown: list[str] | None = None) -> KVEventBatch:
    """Decode a payload written in ``encoding``; :class:`SchemaError` if it is not one.

    Forward compatible (what a consumer owes a newer producer): unknown map
    keys and extra trailing array elements are ignored, and events of an
    unknown type are left out of the batch, their tags appended to
    ``unknown``.
    """
    decoder = _DECODERS[_check_encoding(encoding)]
    try:
        decoded = decoder.decode(payload)
    except msgspec.DecodeError as exc:
        return _decode_skipping_unknown(payload, encoding, unknown, exc)
    if encoding == "array":
        return _from_array(decoded)
    if encoding == "array-map":
        return KVEventBatch(decoded.ts, decoded.events, decoded.data_parallel_rank)
    assert isinstance(decoded, KVEventBatch)
    return decoded


_KNOWN_TAGS: Final = frozenset(("BlockStored", "BlockRemoved", "AllBlocksCleared"))
_STRUCTS: Final[dict[Encoding, type[Any]]] = {
    "map": KVEventBatch, "array": _ArrayKVEventBatch, "array-map": _ArrayMapKVEventBatch,
}


def _decode_skipping_unknown(payload: bytes, encoding: Encoding, unknown: list[str] | None,
                             error: msgspec.DecodeError) -> KVEventBatch:
    """The slow path: drop the events of unknown types, then decode what is left."""
    failed = SchemaError(f"payload is not a {encoding}-encoded KVEventBatch: {error}")
    try:
        data = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError:
        raise failed from error
    events = (data.get("events") if isinstance(data, dict)
              else data[1] if isinstance(data, list) and len(data) > 1 else None)
    if not isinstance(events, list):
        raise failed from error
    tags = [_event_tag(event, encoding) for event in events]
    dropped = [t for t in tags if isinstance(t, str) and t not in _KNOWN_TAGS]
    if not dropped:  # the fast path failed for another reason than an unknown type
        raise failed from error
    kept = [event for event, tag in zip(events, tags, strict=True) if tag in _KNOWN_TAGS]
    if isinstance(data, dict):
        data["events"] = kept
    else:
        data[1] = kept
    try:
        decoded = msgspec.convert(data, _STRUCTS[encoding])
    except msgspec.ValidationError:
        raise failed from error
    if unknown is not None:
        unknown.extend(dropped)
    return normalize(decoded)


def _event_tag(event: Any, encoding: Encoding) -> Any:
    if encoding == "array":
        return event[0] if isinstance(event, list) and event else None
    return event.get("type") if isinstance(event, dict) else None


def normalize(batch: Any) -> KVEventBatch:
    """Convert a batch in anyone's types to a :class:`KVEventBatch`.

    Accepts this module's structs, other msgspec structs (map- or
    array-like, as vLLM's own classes), dicts and lists: anything whose
    :func:`msgspec.to_builtins` form is one of the encodings' shapes (events
    of an array batch may be arrays or maps). Raises :class:`SchemaError`
    naming what does not fit.
    """
    if isinstance(batch, KVEventBatch):
        return batch
    if isinstance(batch, _ArrayKVEventBatch):
        return _from_array(batch)
    builtins = msgspec.to_builtins(batch)
    try:
        if isinstance(builtins, list | tuple):
            events = builtins[1] if len(builtins) > 1 else None
            if isinstance(events, list) and events and isinstance(events[0], dict):
                mixed = msgspec.convert(list(builtins), _ArrayMapKVEventBatch)
                return KVEventBatch(mixed.ts, mixed.events, mixed.data_parallel_rank)
            return _from_array(msgspec.convert(list(builtins), _ArrayKVEventBatch))
        return msgspec.convert(builtins, KVEventBatch)
    except msgspec.ValidationError as exc:
        raise SchemaError(f"not a KVEventBatch: {exc}") from exc


def first_difference(expected: Any, actual: Any) -> str | None:
    """The path of the first field where two batches differ, or ``None``.

    Both sides are compared in :func:`msgspec.to_builtins` form after
    :func:`normalize`, so an answer reads like ``batch.events[2].block_size:
    expected 16, got 32``. Floats are compared exactly: the wire carries them
    as IEEE doubles, bit for bit.
    """
    return _diff(
        msgspec.to_builtins(normalize(expected)), msgspec.to_builtins(normalize(actual)), "batch"
    )


def _diff(left: Any, right: Any, path: str) -> str | None:
    if isinstance(left, dict) and isinstance(right, dict):
        for key in list(left) + [k for k in right if k not in left]:
            if key not in right:
                return f"{path}.{key}: expected {left[key]!r}, missing"
            if key not in left:
                return f"{path}.{key}: unexpected {right[key]!r}"
            found = _diff(left[key], right[key], f"{path}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(left, list) and isinstance(right, list):
        for index, (a, b) in enumerate(zip(left, right, strict=False)):
            found = _diff(a, b, f"{path}[{index}]")
            if found is not None:
                return found
        if len(left) != len(right):
            return f"{path}: expected {len(left)} items, got {len(right)}"
        return None
    if type(left) is not type(right) or left != right:
        return f"{path}: expected {left!r}, got {right!r}"
    return None


# --- frames ------------------------------------------------------------------


def encode_seq(seq: int) -> bytes:
    """The 8-byte big-endian frame of a sequence number (0 <= seq < 2**63)."""
    if not 0 <= seq < 2**63:
        raise ValueError(f"seq {seq} is outside 0 .. 2**63-1")
    return seq.to_bytes(SEQ_BYTES, "big")


def decode_seq(frame: bytes, *, signed: bool = True) -> int:
    """Read a sequence frame; :class:`SchemaError` unless it is 8 bytes.

    Signed by default, so a replay's end marker reads as -1 (never as
    2**64-1); a PUB frame's seq is below 2**63 and reads the same either way.
    """
    if len(frame) != SEQ_BYTES:
        raise SchemaError(f"seq frame has {len(frame)} bytes, not {SEQ_BYTES}")
    return int.from_bytes(frame, "big", signed=signed)


def replay_request(start: int) -> list[bytes]:
    """The frames a DEALER sends to ask for a replay from ``start`` (as REQ would)."""
    return [b"", encode_seq(start)]


def end_marker() -> list[bytes]:
    """The frames that end a replay answer (after the ROUTER's identity frame)."""
    return [b"", END_MARKER_SEQ, b""]


def is_end_marker(seq_frame: bytes) -> bool:
    """Whether a replay answer's seq frame is the end marker."""
    return seq_frame == END_MARKER_SEQ
