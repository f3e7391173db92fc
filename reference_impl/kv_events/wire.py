"""Wire profiles of the KV-event stream: replay layouts, schema versions, encodings.

The stream's framing and payload have changed release by release in the
field, and producers and consumers of different releases meet. A *wire
profile* names one documented variant; an implementation declares the one
it speaks with three capabilities, and the suite both checks it (on the
implementation under test) and plays it (with its raw peers). Each axis is
versioned here, in one module the references and the suite both import.

Replay layout (capability ``wire``):

- ``seq-payload`` (the default: vLLM up to 0.25, SGLang today): a replay
  answer is ``[b"", seq, payload]``, the end marker ``[b"", -1, b""]``.
- ``topic-seq-payload`` (vLLM 0.26 and later, vLLM PR #45177; SGLang's RFC
  #39991 describes the same): answers carry the topic like the live stream,
  ``[b"", topic, seq, payload]``, and the end marker has an empty topic,
  ``[b"", b"", -1, b""]``.

A consumer tells them apart by the frame count after the delimiter (two:
the old layout, three: the new one), see :func:`parse_replay_answer`.

Payload encoding (capability ``encoding``):

- ``map``: batch and events as MessagePack maps, default-valued optional
  fields left out (the suite's reference publisher);
- ``array``: batch and events as arrays in field order, the event's tag
  first (vLLM 0.9 to 0.23; vLLM's example subscriber decodes this);
- ``array-map``: the batch as an array ``[ts, events, rank]``, its events
  as maps (vLLM 0.24 and later).

Schema version (capability ``schema``): the fields ``BlockStored``,
``BlockRemoved`` and the batch carry (:data:`SCHEMAS`). ``base`` is the
contract's own (DESIGN.md, "KV-event stream"); ``vllm-X.Y`` is the schema
vLLM X.Y introduced, exactly as it ships. A *required* field is always on
the wire (``null`` when unset, in both encodings); an *optional* one may be
left out of a map (and is then ``None``) and, in an array, takes its place
in field order. A publisher may stamp ``data_parallel_rank`` itself.

Forward compatibility, what a consumer of an older schema owes a newer
producer (EVS-9): unknown map keys and extra trailing array elements are
ignored (:func:`decode_payload` with ``strict=False``), and an event of an
unknown type is skipped and counted, never the end of the stream.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

import msgspec

from reference_impl.kv_events.schema import KVEventBatch, SchemaError

__all__ = [
    "DEFAULT_ENCODING",
    "DEFAULT_REPLAY_LAYOUT",
    "DEFAULT_SCHEMA",
    "ENCODINGS",
    "REPLAY_LAYOUTS",
    "SCHEMAS",
    "EventField",
    "ReplayAnswer",
    "ReplayLayout",
    "SchemaVersion",
    "WireEncoding",
    "WireError",
    "WireProfile",
    "as_batch",
    "decode_payload",
    "encode_payload",
    "parse_replay_answer",
    "replay_answer_frames",
    "replay_end_frames",
    "restrict",
    "validate_payload",
]

ReplayLayout: TypeAlias = Literal["seq-payload", "topic-seq-payload"]
WireEncoding: TypeAlias = Literal["map", "array", "array-map"]

#: The replay layouts, the default (most widespread) first.
REPLAY_LAYOUTS: Final[tuple[ReplayLayout, ...]] = ("seq-payload", "topic-seq-payload")
DEFAULT_REPLAY_LAYOUT: Final[ReplayLayout] = "seq-payload"
#: The payload encodings, the default (the reference's) first.
ENCODINGS: Final[tuple[WireEncoding, ...]] = ("map", "array", "array-map")
DEFAULT_ENCODING: Final[WireEncoding] = "map"
DEFAULT_SCHEMA: Final = "base"

_SEQ_BYTES: Final = 8
_END_SEQ: Final = (-1).to_bytes(_SEQ_BYTES, "big", signed=True)
_TAGS: Final = ("BlockStored", "BlockRemoved", "AllBlocksCleared")


class WireError(ValueError):
    """Frames or a payload that do not follow the declared wire profile."""


# --- replay layouts -----------------------------------------------------------


def replay_answer_frames(layout: ReplayLayout, topic: bytes, seq_frame: bytes,
                         payload: bytes) -> list[bytes]:
    """One replay answer as the ROUTER sends it after the requester's identity."""
    if layout == "topic-seq-payload":
        return [b"", topic, seq_frame, payload]
    return [b"", seq_frame, payload]


def replay_end_frames(layout: ReplayLayout) -> list[bytes]:
    """The end marker of a replay in ``layout`` (after the requester's identity)."""
    if layout == "topic-seq-payload":
        return [b"", b"", _END_SEQ, b""]
    return [b"", _END_SEQ, b""]


@dataclass(frozen=True)
class ReplayAnswer:
    """One replay answer as a DEALER receives it, read in either layout.

    ``seq`` is signed (the end marker is -1); ``topic`` is ``None`` in the
    ``seq-payload`` layout.
    """

    layout: ReplayLayout
    topic: bytes | None
    seq_frame: bytes
    payload: bytes

    @property
    def seq(self) -> int:
        return int.from_bytes(self.seq_frame, "big", signed=True)

    @property
    def is_end(self) -> bool:
        return self.seq_frame == _END_SEQ


def parse_replay_answer(frames: Sequence[bytes]) -> ReplayAnswer:
    """Read ``[b"", seq, payload]`` or ``[b"", topic, seq, payload]`` by its frame count.

    Raises:
        WireError: no empty delimiter first, another frame count, or a seq
            frame that is not 8 bytes (naming which).
    """
    if not frames or frames[0] != b"":
        raise WireError(f"a replay answer starts with an empty delimiter frame; got "
                        f"{[bytes(f[:16]) for f in frames]}")
    if len(frames) == 3:
        answer = ReplayAnswer("seq-payload", None, bytes(frames[1]), bytes(frames[2]))
    elif len(frames) == 4:
        answer = ReplayAnswer("topic-seq-payload", bytes(frames[1]), bytes(frames[2]),
                              bytes(frames[3]))
    else:
        raise WireError(f"a replay answer has 2 frames after the delimiter (seq-payload) or "
                        f"3 (topic-seq-payload); got {len(frames) - 1}")
    if len(answer.seq_frame) != _SEQ_BYTES:
        raise WireError(f"replay seq frame has {len(answer.seq_frame)} bytes, not {_SEQ_BYTES}")
    return answer


# --- schema versions -------------------------------------------------------------

#: Type checks by field kind: (description, predicate).
_KINDS: Final[dict[str, tuple[str, Callable[[Any], bool]]]] = {}


def _kind(name: str, description: str) -> Callable[[Callable[[Any], bool]],
                                                   Callable[[Any], bool]]:
    def register(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
        _KINDS[name] = (description, check)
        return check
    return register


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_hash(value: Any) -> bool:
    return (_is_int(value) and 0 <= value < 2**64) or isinstance(value, bytes)


@_kind("hashes", "a list of block hashes (int or bytes)")
def _hashes(value: Any) -> bool:
    return isinstance(value, list) and all(_is_hash(v) for v in value)


@_kind("int_hashes", "a list of int block hashes")
def _int_hashes(value: Any) -> bool:
    return isinstance(value, list) and all(_is_int(v) for v in value)


@_kind("hash?", "a block hash (int or bytes) or nil")
def _opt_hash(value: Any) -> bool:
    return value is None or _is_hash(value)


@_kind("int_hash?", "an int block hash or nil")
def _opt_int_hash(value: Any) -> bool:
    return value is None or _is_int(value)


@_kind("ints", "a list of ints")
def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(_is_int(v) for v in value)


@_kind("int", "an int")
def _int(value: Any) -> bool:
    return _is_int(value)


@_kind("int?", "an int or nil")
def _opt_int(value: Any) -> bool:
    return value is None or _is_int(value)


@_kind("str?", "a string or nil")
def _opt_str(value: Any) -> bool:
    return value is None or isinstance(value, str)


@_kind("keys?", "a list of per-block key arrays (or nils), or nil")
def _opt_keys(value: Any) -> bool:
    return value is None or (isinstance(value, list)
                             and all(v is None or isinstance(v, list) for v in value))


@_kind("int_lists?", "a list of int lists, or nil")
def _opt_int_lists(value: Any) -> bool:
    return value is None or (isinstance(value, list) and all(_ints(v) for v in value))


@dataclass(frozen=True)
class EventField:
    """One field of an event struct: its name, kind (type) and whether it is required."""

    name: str
    kind: str
    required: bool = True

    def describe(self) -> str:
        return _KINDS[self.kind][0]

    def accepts(self, value: Any) -> bool:
        return _KINDS[self.kind][1](value)


@dataclass(frozen=True)
class SchemaVersion:
    """The fields of ``BlockStored`` and ``BlockRemoved`` (in wire order) and whether
    the batch carries ``data_parallel_rank``, in one release of the stream."""

    name: str
    description: str
    stored: tuple[EventField, ...]
    removed: tuple[EventField, ...]
    batch_rank: bool = True

    def fields(self, tag: str) -> tuple[EventField, ...]:
        if tag == "BlockStored":
            return self.stored
        if tag == "BlockRemoved":
            return self.removed
        return ()

    def extended(self, name: str, description: str, *, stored: Sequence[EventField] = (),
                 removed: Sequence[EventField] = (),
                 replace: Mapping[str, str] | None = None) -> SchemaVersion:
        """A newer version: these fields appended, kinds of some fields replaced."""
        kinds = dict(replace or {})

        def renew(old: tuple[EventField, ...], new: Sequence[EventField]
                  ) -> tuple[EventField, ...]:
            kept = tuple(EventField(f.name, kinds.get(f.name, f.kind), f.required) for f in old)
            return kept + tuple(new)

        return SchemaVersion(name, description, renew(self.stored, stored),
                             renew(self.removed, removed), True)


def _opt(name: str, kind: str) -> EventField:
    return EventField(name, kind, required=False)


_BASE: Final = SchemaVersion(
    "base",
    "the contract's schema: BlockStored(block_hashes, parent_block_hash, token_ids, "
    "block_size, lora_id, medium, lora_name optional), BlockRemoved(block_hashes, medium)",
    stored=(EventField("block_hashes", "hashes"), EventField("parent_block_hash", "hash?"),
            EventField("token_ids", "ints"), EventField("block_size", "int"),
            EventField("lora_id", "int?"), EventField("medium", "str?"),
            _opt("lora_name", "str?")),
    removed=(EventField("block_hashes", "hashes"), EventField("medium", "str?")),
)
_V09: Final = SchemaVersion(
    "vllm-0.9", "vLLM 0.9: int hashes, no medium, no data_parallel_rank",
    stored=(EventField("block_hashes", "int_hashes"),
            EventField("parent_block_hash", "int_hash?"),
            EventField("token_ids", "ints"), EventField("block_size", "int"),
            EventField("lora_id", "int?")),
    removed=(EventField("block_hashes", "int_hashes"),),
    batch_rank=False,
)
_V10: Final = _V09.extended("vllm-0.10", "vLLM 0.10: the batch's data_parallel_rank")
_V11: Final = _V10.extended(
    "vllm-0.11", "vLLM 0.11: medium; hashes int or bytes",
    stored=(EventField("medium", "str?"),), removed=(EventField("medium", "str?"),),
    replace={"block_hashes": "hashes", "parent_block_hash": "hash?"},
)
_V14: Final = _V11.extended("vllm-0.14", "vLLM 0.14: lora_name",
                            stored=(EventField("lora_name", "str?"),))
_V17: Final = _V14.extended("vllm-0.17", "vLLM 0.17: extra_keys",
                            stored=(_opt("extra_keys", "keys?"),))
_V20: Final = _V17.extended("vllm-0.20", "vLLM 0.20: group_idx",
                            stored=(_opt("group_idx", "int?"),),
                            removed=(_opt("group_idx", "int?"),))
_V22: Final = _V20.extended("vllm-0.22", "vLLM 0.22: kv_cache_spec_kind and _sliding_window",
                            stored=(_opt("kv_cache_spec_kind", "str?"),
                                    _opt("kv_cache_spec_sliding_window", "int?")))
_V26: Final = _V22.extended("vllm-0.26", "vLLM 0.26: locality",
                            stored=(_opt("locality", "str?"),),
                            removed=(_opt("locality", "str?"),))
_V29: Final = _V26.extended("vllm-0.29", "vLLM 0.29: ownership",
                            stored=(_opt("ownership", "str?"),),
                            removed=(_opt("ownership", "str?"),))
_V30: Final = _V29.extended("vllm-0.30", "vLLM 0.30: session_id",
                            stored=(_opt("session_id", "str?"),))
_V33: Final = _V30.extended("vllm-0.33", "vLLM 0.33: lookahead_token_ids",
                            stored=(_opt("lookahead_token_ids", "int_lists?"),))

#: Every schema version by name (capability ``schema``), oldest vLLM first after ``base``.
SCHEMAS: Final[dict[str, SchemaVersion]] = {
    s.name: s for s in (_BASE, _V09, _V10, _V11, _V14, _V17, _V20, _V22, _V26, _V29, _V30,
                        _V33)
}


# --- profiles ----------------------------------------------------------------------


@dataclass(frozen=True)
class WireProfile:
    """One wire variant: replay layout, payload encoding and schema version."""

    replay_layout: ReplayLayout = DEFAULT_REPLAY_LAYOUT
    encoding: WireEncoding = DEFAULT_ENCODING
    schema: str = DEFAULT_SCHEMA

    def __post_init__(self) -> None:
        if self.replay_layout not in REPLAY_LAYOUTS:
            raise ValueError(f"wire must be one of {', '.join(REPLAY_LAYOUTS)}, "
                             f"not {self.replay_layout!r}")
        if self.encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {', '.join(ENCODINGS)}, "
                             f"not {self.encoding!r}")
        if self.schema not in SCHEMAS:
            raise ValueError(f"schema must be one of {', '.join(SCHEMAS)}, not {self.schema!r}")

    @property
    def version(self) -> SchemaVersion:
        return SCHEMAS[self.schema]

    def describe(self) -> str:
        return f"wire={self.replay_layout} encoding={self.encoding} schema={self.schema}"


# --- payloads ----------------------------------------------------------------------


def restrict(batch: Any, version: SchemaVersion) -> Any:
    """``batch`` (a :class:`~reference_impl.kv_events.schema.KVEventBatch`) cut down to
    what ``version`` can carry: fields it lacks set to ``None``, byte hashes
    turned into ints where it has int hashes only, no rank if it has none.

    The suite publishes restricted batches, so a publisher of an older
    schema is only ever asked to carry what its schema has.
    """
    events = []
    changed = False
    for event in batch.events:
        tag = type(event).__name__
        fields = {f.name: f for f in version.fields(tag)}
        changes: dict[str, Any] = {}
        for name in event.__struct_fields__:
            value = getattr(event, name)
            field = fields.get(name)
            if field is None:
                if value is not None:
                    changes[name] = None
            elif field.kind in ("int_hashes", "int_hash?") and value is not None:
                ints = ([_as_int(v) for v in value] if isinstance(value, list)
                        else _as_int(value))
                if ints != value:
                    changes[name] = ints
        changed = changed or bool(changes)
        events.append(msgspec.structs.replace(event, **changes) if changes else event)
    rank = batch.data_parallel_rank if version.batch_rank else None
    if not changed and rank == batch.data_parallel_rank:
        return batch  # nothing to cut: the same object (publish() sees the caller's batch)
    return msgspec.structs.replace(batch, events=events, data_parallel_rank=rank)


def _as_int(value: Any) -> Any:
    if isinstance(value, bytes):
        return int.from_bytes(value[:8], "big")
    return value


def encode_payload(batch: Any, profile: WireProfile) -> bytes:
    """The payload of ``batch`` (any struct or builtins of the suite's shape) in ``profile``.

    Fields the profile's schema lacks are left out; a required field the
    batch lacks is written as nil.
    """
    data = msgspec.to_builtins(batch, builtin_types=(bytes,))
    if not isinstance(data, dict):
        raise WireError("encode_payload takes a batch in map form")
    version = profile.version
    events: list[Any] = []
    for event in data.get("events", []):
        tag = event.get("type")
        fields = version.fields(tag)
        if profile.encoding == "array":
            events.append([tag, *(event.get(f.name) for f in fields)])
        else:
            body: dict[str, Any] = {"type": tag}
            for f in fields:
                value = event.get(f.name)
                if f.required or value is not None:
                    body[f.name] = value
            events.append(body)
    rank = data.get("data_parallel_rank") if version.batch_rank else None
    if profile.encoding == "map":
        out: Any = {"ts": data["ts"], "events": events}
        if rank is not None:
            out["data_parallel_rank"] = rank
    else:
        out = [data["ts"], events, rank] if version.batch_rank else [data["ts"], events]
    return msgspec.msgpack.encode(out)


def validate_payload(payload: bytes, profile: WireProfile) -> str | None:
    """The first way ``payload`` departs from ``profile`` exactly (EVT-9), or ``None``.

    Exact: the batch and every event have the encoding's shape; every field
    the schema version requires is present and typed as specified; optional
    fields, when present, are typed; nothing the version does not define is
    on the wire (an unknown map key, an extra array element, an unknown
    event type). The answer reads like ``batch.events[1] (BlockStored):
    field 'medium' missing``.
    """
    try:
        data = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        return f"not MessagePack: {exc}"
    try:
        _read_batch(data, profile, strict=True, unknown=None)
    except WireError as exc:
        return str(exc)
    return None


def decode_payload(payload: bytes, profile: WireProfile, *, strict: bool = False,
                   unknown: list[str] | None = None) -> dict[str, Any]:
    """The batch in ``payload`` as builtins of the suite's map shape.

    ``strict=False`` reads as a forward-compatible consumer must: unknown
    map keys and extra trailing array elements are ignored, events of an
    unknown type are skipped (their tags appended to ``unknown``). Fields of
    the suite's shape the version lacks are absent from the result.

    Raises:
        WireError: what cannot be read under ``profile`` even so.
    """
    try:
        data = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise WireError(f"not MessagePack: {exc}") from None
    return _read_batch(data, profile, strict=strict, unknown=unknown)


def _read_batch(data: Any, profile: WireProfile, *, strict: bool,
                unknown: list[str] | None) -> dict[str, Any]:
    version = profile.version
    names = ["ts", "events"] + (["data_parallel_rank"] if version.batch_rank else [])
    if profile.encoding == "map":
        if not isinstance(data, dict):
            raise WireError(f"batch: a map in encoding 'map', got {_shape(data)}")
        if "ts" not in data or "events" not in data:
            missing = "ts" if "ts" not in data else "events"
            raise WireError(f"batch: field {missing!r} missing")
        extra = [k for k in data if k not in names]
        if strict and extra:
            raise WireError(f"batch: field {extra[0]!r} is not in schema {version.name}")
        batch = {k: data[k] for k in names if k in data}
    else:
        if not isinstance(data, list):
            raise WireError(f"batch: an array in encoding {profile.encoding!r}, "
                            f"got {_shape(data)}")
        if len(data) < 2:
            raise WireError(f"batch: an array [ts, events{', rank' * version.batch_rank}], "
                            f"got {len(data)} elements")
        if strict and len(data) > len(names):
            raise WireError(f"batch: {len(data)} elements, schema {version.name} has "
                            f"{len(names)}")
        batch = dict(zip(names, data, strict=False))
    ts = batch["ts"]
    if not isinstance(ts, float | int) or isinstance(ts, bool):
        raise WireError(f"batch.ts: a float, got {ts!r}")
    rank = batch.get("data_parallel_rank")
    if rank is not None and not _is_int(rank):
        raise WireError(f"batch.data_parallel_rank: an int or nil, got {rank!r}")
    if not isinstance(batch["events"], list):
        raise WireError(f"batch.events: an array, got {_shape(batch['events'])}")
    events: list[dict[str, Any]] = []
    for index, event in enumerate(batch["events"]):
        read = _read_event(event, index, profile, strict=strict)
        if read is None:
            if unknown is not None:
                unknown.append(_tag_of(event, profile))
            continue
        events.append(read)
    out: dict[str, Any] = {"ts": float(ts), "events": events}
    if rank is not None:
        out["data_parallel_rank"] = rank
    return out


def as_batch(data: Mapping[str, Any]) -> Any:
    """A :func:`decode_payload` result as the suite's
    :class:`~reference_impl.kv_events.schema.KVEventBatch` (fields the
    version lacks are ``None``)."""
    events = []
    for event in data.get("events", []):
        event = dict(event)
        if event.get("type") in ("BlockStored", "BlockRemoved"):
            event.setdefault("medium", None)
            if event["type"] == "BlockStored":
                event.setdefault("lora_id", None)
        events.append(event)
    try:
        return msgspec.convert({**data, "events": events}, KVEventBatch)
    except msgspec.ValidationError as exc:
        raise SchemaError(f"not a KVEventBatch: {exc}") from None


def _tag_of(event: Any, profile: WireProfile) -> str:
    if profile.encoding == "array" and isinstance(event, list) and event:
        return str(event[0])
    if isinstance(event, dict):
        return str(event.get("type"))
    return _shape(event)


def _read_event(event: Any, index: int, profile: WireProfile, *, strict: bool
                ) -> dict[str, Any] | None:
    """One event as a map; ``None`` for an unknown type when not ``strict``."""
    where = f"batch.events[{index}]"
    version = profile.version
    if profile.encoding == "array":
        if not isinstance(event, list) or not event:
            raise WireError(f"{where}: an array [tag, fields...], got {_shape(event)}")
        tag, values = event[0], event[1:]
    else:
        if not isinstance(event, dict):
            raise WireError(f"{where}: a map with 'type', got {_shape(event)}")
        tag = event.get("type")
    if tag not in _TAGS:
        if strict or not isinstance(tag, str):
            raise WireError(f"{where}: unknown event type {tag!r}")
        return None
    fields = version.fields(tag)
    where = f"{where} ({tag})"
    out: dict[str, Any] = {"type": tag}
    if profile.encoding == "array":
        if strict and len(values) > len(fields):
            raise WireError(f"{where}: {len(values)} fields, schema {version.name} has "
                            f"{len(fields)}")
        present = dict(zip((f.name for f in fields), values, strict=False))
    else:
        present = {k: v for k, v in event.items() if k != "type"}
        if strict:
            extra = [k for k in present if k not in {f.name for f in fields}]
            if extra:
                raise WireError(f"{where}: field {extra[0]!r} is not in schema {version.name}")
    for f in fields:
        if f.name not in present:
            if f.required:
                raise WireError(f"{where}: field {f.name!r} missing (schema {version.name})")
            continue
        value = present[f.name]
        if not f.accepts(value):
            raise WireError(f"{where}.{f.name}: {f.describe()}, got {value!r:.60}")
        out[f.name] = value
    return out


def _shape(value: Any) -> str:
    if isinstance(value, dict):
        return "a map"
    if isinstance(value, list):
        return f"an array of {len(value)}"
    return f"{type(value).__name__} {value!r:.40}"
