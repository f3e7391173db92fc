"""The reference's codec for the two control wire profiles (see ``docs/control.md``).

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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec

REP_ENVELOPE: Final = "rep-envelope"
LMCACHE_MQ: Final = "lmcache-mq"
PROFILES: Final = (REP_ENVELOPE, LMCACHE_MQ)

#: Codes the lmcache-mq profile reserves for the suite's own request types (above
#: LMCache 0.4.x's enum, which ends near 22).
SUITE_CODES: Final[Mapping[str, int]] = {
    "ZMQC_ECHO": 240, "ZMQC_SLOW": 241, "ZMQC_FAIL": 242, "ZMQC_BAD": 243, "ZMQC_REGISTER": 244,
}
#: The reference's own lmcache-mq table: LMCache 0.4.3's code for PING, and the suite's.
REFERENCE_CODES: Final[Mapping[str, int]] = {"PING": 12, **SUITE_CODES}

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


def mq_request(kind: str, body: Mapping[str, Any], codes: Mapping[str, int]) -> list[bytes]:
    """The frames after the request id of an lmcache-mq request (``KeyError``: no code)."""
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
