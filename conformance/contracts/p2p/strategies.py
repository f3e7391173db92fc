"""Hypothesis strategies of the p2p contract: honest messages and hostile wire input.

Honest messages (:func:`messages`) are dicts with ``str`` keys of everything
MessagePack represents: nested maps and lists, unicode and binary strings,
integers over the whole signed and unsigned 64-bit range, floats including
``-0.0``, the infinities and NaN, booleans and ``None``. They stay small
(a few kilobytes), far below any sensible ``max_message_bytes``.

Large messages (:func:`large_messages`, :func:`sized_messages`) are part of
fidelity and ordering whatever a transport declares: every transport must
carry messages up to :data:`LARGE_MESSAGE_BYTES` (1 MiB), or up to its
declared ``max_message_bytes`` when that is smaller. The strategies draw only
a :class:`LargeMessage` (a size); the test builds the bytes with
:meth:`LargeMessage.build` once it knows the declared limit, so a
counterexample prints ``LargeMessage(size=1048576)``, not a megabyte.
:func:`conformance.testing.values.first_difference` compares a sent message
with a received one strictly.

Hostile input (POLL-3, SEC-1): routing identities no honest node would
present (:func:`hostile_identities`), payloads that are not an encoded dict
(:func:`hostile_payloads`) and frame lists of the wrong length
(:func:`hostile_frames`).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import Any, Final

import msgspec
from hypothesis import strategies as st

from conformance.testing.values import INT64_MIN, UINT64_MAX, budgeted_msgpack_values, text

__all__ = [
    "LARGE_MESSAGE_BYTES",
    "SMALL_MESSAGE_BYTES",
    "LargeMessage",
    "encoded_size",
    "hostile_frames",
    "hostile_identities",
    "hostile_payloads",
    "is_plausible_peer_id",
    "large_messages",
    "message_of_size",
    "messages",
    "nesting_bomb",
    "padded",
    "sized_messages",
]

_encoder = msgspec.msgpack.Encoder()


def encoded_size(msg: Any) -> int:
    """Bytes of the MessagePack encoding of ``msg``."""
    return len(_encoder.encode(msg))


#: Fields of one message, at most; characters of a field name, at most.
MAX_MESSAGE_FIELDS: Final = 6
MAX_FIELD_NAME_CHARS: Final = 16

_FIELD_COUNTS = st.integers(min_value=0, max_value=MAX_MESSAGE_FIELDS)
_FIELD_NAMES = text(max_size=MAX_FIELD_NAME_CHARS)


@st.composite
def _messages(draw: st.DrawFn, values: st.SearchStrategy[Any]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for _ in range(draw(_FIELD_COUNTS)):
        name = draw(_FIELD_NAMES)
        value = draw(values)
        # A repeated name keeps its first value: one field fewer, nothing redrawn.
        fields.setdefault(name, value)
    return fields


@functools.cache
def messages(*, max_leaves: int = 20) -> st.SearchStrategy[dict[str, Any]]:
    """A message: a dict of at most 6 fields, names of at most 16 characters, each
    value a :func:`~conformance.testing.values.budgeted_msgpack_values` of at most
    ``max_leaves`` leaves (a few KB at most). Cached: one strategy per ``max_leaves``.

    Built field by field instead of with ``st.dictionaries``, whose unique-key
    filter redraws a repeated name (the empty name comes up often).
    """
    return _messages(budgeted_msgpack_values(max_leaves=max_leaves))


def message_of_size(size: int, *, key: str = "blob") -> dict[str, Any]:
    """``{key: bytes}`` whose MessagePack encoding is exactly ``size`` bytes.

    Raises ``ValueError`` when ``size`` is smaller than the smallest such
    message.
    """
    overhead = encoded_size({key: b""})
    if size < overhead:
        raise ValueError(f"no {{{key!r}: bytes}} message encodes to {size} bytes")
    # The bin header grows (2 -> 3 -> 5 bytes) with the length; search down.
    for extra_header in (0, 1, 3):
        n = size - overhead - extra_header
        if n >= 0 and encoded_size({key: bytes(n)}) == size:
            return {key: bytes(n)}
    raise ValueError(f"no {{{key!r}: bytes}} message encodes to exactly {size} bytes")


# -- large messages --------------------------------------------------------

#: Every transport must carry messages this large (encoded), declared limit or
#: not; a declared ``max_message_bytes`` below it bounds the sizes instead.
LARGE_MESSAGE_BYTES: Final = 1 << 20
#: Above this a message counts as large: the first size a transport with a
#: 64 KiB buffer (a common hidden limit) cannot carry in one piece.
SMALL_MESSAGE_BYTES: Final = 64 * 1024


def padded(base: dict[str, Any], size: int, *, key: str = "pad") -> dict[str, Any]:
    """``base`` plus ``{key: bytes}`` so the MessagePack encoding is ``size`` bytes.

    The padding is pseudo-random (seeded by ``size``), so a transport that
    truncates, zeroes or shuffles part of a large frame is caught by the
    comparison. When ``size`` is too small for any padding, ``base`` is
    returned unchanged (the message is then as small as it can be).
    """
    if key in base:
        raise ValueError(f"padded: {key!r} is already a key of the message")
    overhead = encoded_size({**base, key: b""})
    if size <= overhead:
        return dict(base)
    # The bin header grows (2 -> 3 -> 5 bytes) with the length; try each.
    filler = random.Random(size).randbytes(size - overhead)
    for extra_header in (0, 1, 3):
        n = size - overhead - extra_header
        if n >= 0 and encoded_size({**base, key: filler[:n]}) == size:
            return {**base, key: filler[:n]}
    raise ValueError(f"padded: no padding makes {base!r:.60} encode to {size} bytes")


@dataclass(frozen=True)
class LargeMessage:
    """A large message still to be built: only its encoded size was drawn."""

    size: int

    def build(self, limit: int | None, **fields: Any) -> dict[str, Any]:
        """The message: ``fields`` padded to ``size`` bytes, at most ``limit`` (if declared)."""
        size = self.size if limit is None else min(self.size, limit)
        return padded(dict(fields), size)


def large_messages() -> st.SearchStrategy[LargeMessage]:
    """Sizes just over 64 KiB up to 1 MiB; the boundaries come up most often."""
    boundaries = [SMALL_MESSAGE_BYTES + 1, 4 * SMALL_MESSAGE_BYTES, LARGE_MESSAGE_BYTES]
    sizes = st.one_of(
        st.sampled_from(boundaries),
        st.integers(min_value=SMALL_MESSAGE_BYTES + 1, max_value=LARGE_MESSAGE_BYTES),
    )
    return sizes.map(LargeMessage)


def sized_messages(*, one_in: int = 8) -> st.SearchStrategy[dict[str, Any] | LargeMessage]:
    """Mostly :func:`messages`; about one draw in ``one_in`` a :class:`LargeMessage`.

    Large ones stay occasional so a default run does not spend its time
    copying megabytes; the tests add an explicit 1 MiB example so every run
    sends at least one.
    """
    large, small = large_messages(), messages()
    # Both built once: a strategy built inside the flatmap is built (and
    # validated) again on every draw.
    return st.integers(min_value=1, max_value=one_in).flatmap(
        lambda k: large if k == 1 else small
    )


# -- hostile input ---------------------------------------------------------


def is_plausible_peer_id(identity: bytes) -> bool:
    """Whether ``identity`` could be an honest node's ``"host:port"``.

    UTF-8, a non-empty host, and an ASCII-decimal port in 1..65535 after the
    last ``:``. Identities failing this must never become connections
    (POLL-3); ones passing it may (the host part is not checked further).
    """
    try:
        decoded = identity.decode("utf-8")
    except UnicodeDecodeError:
        return False
    host, sep, port = decoded.rpartition(":")
    if not sep or not host or not port.isascii() or not port.isdigit():
        return False
    return 0 < int(port) < 65536


def hostile_identities() -> st.SearchStrategy[bytes | None]:
    """Routing identities an honest node never presents; ``None`` means anonymous.

    libzmq accepts 1..255-byte identities and reserves a leading zero byte
    for the ids it generates itself, so those are produced only by
    anonymity (``None``).
    """
    non_utf8 = st.binary(min_size=0, max_size=30).map(lambda b: b"\xff" + b)
    no_colon = st.text(
        alphabet=st.characters(exclude_categories=["Cs"], exclude_characters=":\x00"),
        min_size=1, max_size=40,
    ).map(lambda s: s.encode())
    bad_port = st.sampled_from(
        [b"127.0.0.1:", b":", b":1", b"host:notaport", b"127.0.0.1:99999", b"127.0.0.1:-1",
         b"127.0.0.1:0", b"127.0.0.1:\xc2\xb2", b"127.0.0.1:1:2", b"[::1]", b"a\x00b:1",
         b"\x01:1", b" :1", b"127.0.0.1:65536", b"127.0.0.1: 80"]
    )
    very_long = st.integers(min_value=200, max_value=255).map(lambda n: b"h" * (n - 2) + b":1")
    return st.one_of(st.none(), non_utf8, no_colon, bad_port, very_long)


def _non_dict_values() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=INT64_MIN, max_value=UINT64_MAX),
        st.floats(allow_nan=False),
        text(max_size=20),
        st.binary(max_size=20),
        st.lists(st.integers(min_value=INT64_MIN, max_value=UINT64_MAX), max_size=4),
    )


_NAMED_BAD_PAYLOADS: Final = (
    b"",
    b"\xc1",
    b"\x81\x01\x02",  # map with an int key
    b"\x81\xc4\x01k\x01",  # map with a bytes key
    b"\x81\x90\x01",  # map with a list key (unhashable)
    b"\x81\x80\x01",  # map with a map key (unhashable)
    b"\x81\xa1k\xd4\x05\x00",  # an ext type value
    b"\x81\xa1k\xd6\xff\x00\x00\x00\x00",  # the timestamp ext type
    b"\xdf\xff\xff\xff\xff",  # map claiming 4 G entries
    b"\xdd\xff\xff\xff\xff",  # array claiming 4 G items
    b"\xc6\xff\xff\xff\xff",  # bin claiming 4 GB
)


@st.composite
def _truncated(draw: st.DrawFn, encoded: st.SearchStrategy[bytes]) -> bytes:
    whole = draw(encoded)
    return whole[:draw(st.integers(0, max(len(whole) - 1, 0)))]


@functools.cache
def _valid_payloads() -> st.SearchStrategy[bytes]:
    """Encoded small messages: the valid frames hostile input is made from."""
    return st.builds(_encoder.encode, messages(max_leaves=4))


@functools.cache
def hostile_payloads(*, bombs: bool = True) -> st.SearchStrategy[bytes]:
    """One frame that is not the MessagePack encoding of a ``str``-keyed dict.

    With ``bombs=False``, never a :func:`nesting_bomb` (100 kB and more): the
    same shapes otherwise, in the same proportions among themselves. Cached:
    one strategy per argument.
    """
    valid = _valid_payloads()
    shapes: list[st.SearchStrategy[bytes]] = [
        st.binary(max_size=64),  # garbage (sometimes accidentally valid)
        st.builds(_encoder.encode, _non_dict_values()),
        _truncated(valid),
        valid.map(lambda b: b + b"\xc1"),  # trailing byte (0xc1 is never used)
        st.sampled_from(_NAMED_BAD_PAYLOADS),
    ]
    if bombs:
        # Built on demand (and cached) so a failure report does not print 100 KB.
        shapes.append(st.sampled_from(["arrays", "maps"]).map(nesting_bomb))
    return st.one_of(shapes)


@functools.cache
def nesting_bomb(kind: str, depth: int = 100_000) -> bytes:
    """MessagePack nested ``depth`` levels deep (``"arrays"`` or ``"maps"``).

    Deeper than any decoder's recursion limit: decoding must fail cleanly.
    Cached: the same bytes every time (immutable).
    """
    if kind == "arrays":
        return b"\x91" * depth + b"\xc0"
    if kind == "maps":
        return b"\x81\xa1k" * depth + b"\xc0"
    raise ValueError(f"nesting_bomb kind must be 'arrays' or 'maps', not {kind!r}")


@functools.cache
def hostile_frames(*, bombs: bool = True) -> st.SearchStrategy[list[bytes]]:
    """Frame lists a DEALER may send: wrong counts, and bad single payloads.

    An empty list means "one empty frame" (ZeroMQ cannot send zero frames).
    ``bombs=False`` leaves the nesting bombs out of every payload (see
    :func:`hostile_payloads`). Cached: one strategy per argument.
    """
    payload = hostile_payloads(bombs=bombs)
    valid = _valid_payloads()
    return st.one_of(
        payload.map(lambda p: [p]),
        st.just([]),
        st.lists(st.one_of(payload, valid), min_size=2, max_size=4),
        valid.map(lambda v: [b"", v]),  # REQ-style delimiter
    )
