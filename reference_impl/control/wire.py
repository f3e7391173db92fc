"""The reference's codec for the control wire profiles (see ``docs/control.md``).

``rep-envelope`` (version 1): a request is ``[envelope..., b"", payload]`` as a
REQ or DEALER socket sends it, ``payload`` a MessagePack map with a str
``"type"``; the reply echoes the envelope, ``[envelope..., b"", reply]``, and
an error reply is a map with a str ``"error"``.

``lmcache-mq`` (version 1, LMCache 0.4.x's multiprocess message queue): a
DEALER sends ``[request id, request code, *arguments]`` with no delimiter:
the id a MessagePack int, the code the request type's enum value as a
MessagePack int, each positional argument its own MessagePack frame. The
server echoes the id and code frames and appends the typed result
(``[id, code, result]``, or ``[id, code]`` when the result is ``None``).
LMCache ships no error reply; this profile's is ``[id, code]`` with no
result frame (the only answer LMCache's own client survives: it resolves the
waiting future with ``None``), so a request type whose result is ``None``
cannot be told from an error on this wire.

Request codes come from a table (type name -> int). LMCache numbers its
``RequestType`` enum by declaration order, and the numbers move between
releases (``PING`` is 11 in 0.4.2 and 12 in 0.4.3), so a server declares its
own table; :data:`SUITE_CODES` are the codes the profile reserves for the
conformance suite's request types.

``lmcache-0.5`` (version 1, LMCache 0.5.x's ZMQ transport): the same frames,
but the operation frame is a MessagePack str, the operation's snake_case
name (``"ping"``), or, for an operation that existed before name routing,
its frozen legacy int (``ping`` 22, ``noop`` 24, ``get_chunk_size`` 21). A
server accepts either form and echoes the operation frame byte for byte.
``ping`` takes one argument, the worker's instance id or nil. An empty
operation frame is stream control (``ack``/``cancel``), never answered. The
error reply is again the echo with no result frame. :data:`SUITE_OPERATIONS`
names the suite's own types on this wire (their names in lower case).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, TypeAlias

import msgspec

REP_ENVELOPE: Final = "rep-envelope"
LMCACHE_MQ: Final = "lmcache-mq"
LMCACHE_05: Final = "lmcache-0.5"
PROFILES: Final = (REP_ENVELOPE, LMCACHE_MQ, LMCACHE_05)
#: The profiles whose frames are ``[id, operation, *arguments]`` (no delimiter).
POSITIONAL: Final = (LMCACHE_MQ, LMCACHE_05)

#: A request type's identifier on a positional wire: an int code (lmcache-mq, or a
#: legacy id on lmcache-0.5) or an operation name (lmcache-0.5).
Code: TypeAlias = int | str

#: Codes the lmcache-mq profile reserves for the suite's own request types (above
#: LMCache 0.4.x's enum, which ends near 22).
SUITE_CODES: Final[Mapping[str, int]] = {
    "ZMQC_ECHO": 240, "ZMQC_SLOW": 241, "ZMQC_FAIL": 242, "ZMQC_BAD": 243, "ZMQC_REGISTER": 244,
}
#: The reference's own lmcache-mq table: LMCache 0.4.3's code for PING, and the suite's.
REFERENCE_CODES: Final[Mapping[str, int]] = {"PING": 12, **SUITE_CODES}
#: The lmcache-0.5 identifiers of PING and the suite's types: their names in lower case.
SUITE_OPERATIONS: Final[Mapping[str, str]] = {
    name: name.lower() for name in ("PING", *SUITE_CODES)}
#: PING's arguments on lmcache-0.5: one, the worker's instance id (nil: an untracked prober).
PING_BODY_05: Final[Mapping[str, Any]] = {"instance_id": None}


def default_codes(wire: str) -> Mapping[str, Code]:
    """The identifier table a positional profile uses unless told otherwise."""
    return SUITE_OPERATIONS if wire == LMCACHE_05 else REFERENCE_CODES


def operation_names(codes: Mapping[str, Code], wire: str) -> dict[Code, str]:
    """Identifier -> type name as a server reads it. On lmcache-0.5 every type also
    answers to its name in lower case (LMCache 0.5 routes a legacy int and a name alike);
    a bool is never an identifier (``True == 1`` in Python)."""
    names: dict[Code, str] = {}
    if wire == LMCACHE_05:
        names.update({name.lower(): name for name in codes})
    names.update({code: name for name, code in codes.items()})
    return names


def lookup(names: Mapping[Code, str], code: Any, wire: str) -> str | None:
    """The type name a decoded operation frame ``code`` selects, or None."""
    if isinstance(code, bool):
        return None
    if isinstance(code, int) or (wire == LMCACHE_05 and isinstance(code, str)):
        return names.get(code)
    return None

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder()


def check_profile(wire: str) -> str:
    """``wire`` if it names a profile, else ``ValueError`` naming the known ones."""
    if wire not in PROFILES:
        raise ValueError(f"unknown control wire profile {wire!r}; known: {', '.join(PROFILES)}")
    return wire


def encode(value: Any) -> bytes:
    return _ENCODER.encode(value)


def decode(payload: bytes) -> Any:
    """Decode one MessagePack frame; ``ValueError`` when it is not MessagePack."""
    try:
        return _DECODER.decode(payload)
    except (msgspec.DecodeError, ValueError) as exc:
        raise ValueError(str(exc)) from None


def mq_request(kind: str, body: Mapping[str, Any], codes: Mapping[str, Code]) -> list[bytes]:
    """The frames after the request id of a positional request (``KeyError``: no code)."""
    code = codes.get(kind)
    if code is None:
        raise KeyError(f"no lmcache-mq code for request type {kind!r}; known: "
                       f"{', '.join(sorted(codes))}")
    return [encode(code), *(encode(value) for value in body.values())]


def mq_id(frame: bytes) -> int | None:
    """The request id an lmcache-mq id frame carries, or None when it is not an int."""
    try:
        value = decode(frame)
    except ValueError:
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None
