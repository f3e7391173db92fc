"""The control channel's wire profiles, as the suite checks and plays them.

A profile is a named, versioned frame layout (``docs/control.md``, "Wire
profiles"). The suite reads every reply of a server under test through the
declared profile, and its raw and hostile peers write requests through it;
the reference (:mod:`reference_impl.control.wire`) implements the same
profiles independently, so each side checks the other.

- ``rep-envelope`` v1 (the default): ``[envelope..., b"", payload]`` with a
  MessagePack map ``{"type": str, ...}``; replies echo the envelope; an
  error reply is a map with a str ``"error"``.
- ``lmcache-mq`` v1 (LMCache 0.4.x's multiprocess message queue): a DEALER
  sends ``[request id, request code, *arguments]``, no delimiter, each a
  MessagePack frame (id and code ints, one frame per positional argument);
  the server echoes id and code and appends the typed result, or nothing
  for ``None``. The profile's error reply is the echo with no result frame.
- ``lmcache-0.5`` v1 (LMCache 0.5.x's ZMQ transport): the same frames, but the
  operation frame is a MessagePack str, the operation's snake_case name, or
  the frozen legacy int of an operation older than name routing; the server
  echoes the operation frame as it came. PING (``ping``) takes one
  argument, an instance id or nil. Error reply: the echo, no result frame.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import msgspec
from hypothesis import strategies as st

from conformance.errors import ConfigError
from conformance.testing.values import msgpack_values, text

__all__ = ["PROFILES", "RESULT_TYPES", "Reply", "WireProfile", "profile"]

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder()

#: What a declared request type's success result may be (capability ``results``).
RESULT_TYPES: Final = ("any", "map", "bool", "int", "str", "none")


@dataclass(frozen=True)
class Reply:
    """One reply as a profile reads it.

    ``correlation`` is the first frame (the request id the server echoed);
    ``error`` the error text of an error reply (``None`` for a success);
    ``value`` the decoded reply or result; ``empty`` an lmcache-mq reply
    without a result frame.
    """

    correlation: bytes
    error: str | None
    value: Any
    empty: bool = False


def encode(value: Any) -> bytes:
    return _ENCODER.encode(value)


def decode(payload: bytes) -> tuple[bool, Any]:
    """``(True, value)`` for MessagePack, ``(False, None)`` otherwise."""
    try:
        return True, _DECODER.decode(payload)
    except (msgspec.DecodeError, ValueError):
        return False, None


def _result_problem(value: Any, result: str) -> str | None:
    checks: dict[str, tuple[type, ...]] = {"map": (dict,), "bool": (bool,), "str": (str,),
                                           "int": (int,)}
    if result in checks:
        ok = isinstance(value, checks[result]) and not (result == "int"
                                                        and isinstance(value, bool))
        if not ok:
            return f"the result {value!r:.80} is not a {result}"
    return None


class WireProfile(ABC):
    """One control wire format: how requests are framed and replies read."""

    name: ClassVar[str]
    version: ClassVar[int]
    summary: ClassVar[str]
    #: Whether a REQ socket can speak it (libzmq adds an empty delimiter).
    req_compatible: ClassVar[bool]

    @abstractmethod
    def correlation(self, rid: int) -> bytes:
        """The first frame of request ``rid``, which its reply echoes."""

    @abstractmethod
    def request(self, rid: int, kind: str, body: Mapping[str, Any],
                codes: Mapping[str, Any]) -> list[bytes]:
        """The frames a DEALER sends for one well-formed request."""

    @abstractmethod
    def read(self, frames: list[bytes]) -> Reply | None:
        """The reply ``frames`` (as a DEALER receives them) hold, or None when they do not
        decode under this profile."""

    @abstractmethod
    def malformed(self, codes: Mapping[str, Any]
                  ) -> st.SearchStrategy[tuple[str, list[bytes]]]:
        """(description, frames after the correlation frame) of unknown or malformed requests."""

    def success_problem(self, reply: Reply, result: str = "any") -> str | None:
        """Why ``reply`` is not a success reply with a ``result``-typed value, or None."""
        if result == "none" and reply.empty:
            return None
        if reply.error is not None:
            return f"error reply {reply.error!r}, expected success"
        return _result_problem(reply.value, result)


class RepEnvelope(WireProfile):
    name = "rep-envelope"
    version = 1
    summary = ("REQ/REP envelopes: [envelope..., b'', MessagePack map with 'type']; error "
               "replies are maps with a str 'error'")
    req_compatible = True

    def correlation(self, rid: int) -> bytes:
        return rid.to_bytes(8, "big")

    def request(self, rid: int, kind: str, body: Mapping[str, Any],
                codes: Mapping[str, Any]) -> list[bytes]:
        return [self.correlation(rid), b"", encode({"type": kind, **body})]

    def read(self, frames: list[bytes]) -> Reply | None:
        if len(frames) < 2 or b"" not in frames[:-1]:
            return None
        ok, value = decode(frames[-1])
        if not ok or not isinstance(value, dict):
            return None
        error = value.get("error")
        return Reply(frames[0], error if isinstance(error, str) else None, value)

    def malformed(self, codes: Mapping[str, Any]
                  ) -> st.SearchStrategy[tuple[str, list[bytes]]]:
        unknown = text(min_size=1, max_size=12).filter(
            lambda t: not t.startswith("ZMQC_") and t not in codes and t != "PING")
        return st.one_of(
            unknown.map(lambda t: (f"unknown type {t!r}", [b"", encode({"type": t})])),
            st.binary(min_size=1, max_size=24).filter(lambda b: not decode(b)[0])
            .map(lambda b: (f"undecodable payload {b!r}", [b"", b])),
            msgpack_values(max_leaves=4).filter(lambda v: not isinstance(v, dict))
            .map(lambda v: (f"payload {v!r:.40} is not a map", [b"", encode(v)])),
            st.just(("a map without 'type'", [b"", encode({"nonce": 1})])),
            st.sampled_from([1, None, b"PING", ["PING"]])
            .map(lambda t: (f"type {t!r} is not a str", [b"", encode({"type": t})])),
            st.just(("no payload frame after the delimiter", [b""])),
            st.integers(2, 4).map(lambda n: (f"{n} payload frames",
                                             [b"", *[encode({"type": "PING"})] * n])),
        )


class LmcacheMq(WireProfile):
    name = "lmcache-mq"
    version = 1
    summary = ("LMCache 0.4.x message queue: DEALER [id, code, *positional MessagePack "
               "arguments], no delimiter; replies [id, code, typed result] or [id, code]")
    req_compatible = False

    def correlation(self, rid: int) -> bytes:
        return encode(rid)

    def request(self, rid: int, kind: str, body: Mapping[str, Any],
                codes: Mapping[str, Any]) -> list[bytes]:
        if kind not in codes:
            raise ConfigError(f"{self.name}: no request code for {kind!r}; declare it in the "
                              "capability request_codes")
        return [self.correlation(rid), encode(codes[kind]), *(encode(v) for v in body.values())]

    def read(self, frames: list[bytes]) -> Reply | None:
        if len(frames) not in (2, 3):
            return None
        ok, rid = decode(frames[0])
        if not ok or not isinstance(rid, int) or isinstance(rid, bool):
            return None
        if len(frames) == 2:
            return Reply(frames[0], "no result frame (the lmcache-mq error reply)", None,
                         empty=True)
        ok, value = decode(frames[2])
        if not ok:
            return None
        return Reply(frames[0], None, value)

    def malformed(self, codes: Mapping[str, Any]
                  ) -> st.SearchStrategy[tuple[str, list[bytes]]]:
        known = set(codes.values())
        unknown = st.integers(0, 2**16).filter(lambda c: c not in known)
        ping = codes.get("PING")
        cases = [
            unknown.map(lambda c: (f"unknown request code {c}", [encode(c)])),
            st.sampled_from(["PING", b"\x01", None, 1.5, [1]])
            .map(lambda c: (f"request code {c!r} is not an int", [encode(c)])),
            st.binary(min_size=1, max_size=12).filter(lambda b: not decode(b)[0])
            .map(lambda b: (f"undecodable request code frame {b!r}", [b])),
        ]
        if ping is not None:
            cases.append(_undecodable_argument("PING", ping))
        return st.one_of(*cases)


class LmcacheOperations(LmcacheMq):
    """LMCache 0.5's wire: ``LmcacheMq``'s frames with operation names (or legacy ints).

    Replies read exactly as under lmcache-mq (the operation frame is echoed, not
    interpreted). The hostile inputs are the operation frames this wire can carry
    that name nothing: unknown names, unknown ints, identifiers of another type,
    undecodable frames (never an empty one: that is LMCache's stream control,
    which it never answers), and a declared operation with an undecodable
    argument.
    """

    name = "lmcache-0.5"
    version = 1
    summary = ("LMCache 0.5.x ZMQ transport: DEALER [id, operation name (str) or legacy int, "
               "*positional MessagePack arguments], no delimiter; replies [id, operation, typed "
               "result] or [id, operation]")

    def malformed(self, codes: Mapping[str, Any]
                  ) -> st.SearchStrategy[tuple[str, list[bytes]]]:
        taken = {*codes.values(), *(kind.lower() for kind in codes)}
        unknown_name = text(min_size=1, max_size=16).filter(lambda t: t not in taken)
        unknown_id = st.integers(0, 2**16).filter(lambda c: c not in taken)
        ping = codes.get("PING")
        cases = [
            unknown_name.map(lambda t: (f"unknown operation {t!r}", [encode(t)])),
            unknown_id.map(lambda c: (f"unknown legacy operation id {c}", [encode(c)])),
            st.sampled_from([None, 1.5, [1], b"ping", {"op": "ping"}, True])
            .map(lambda c: (f"operation {c!r} is neither a name nor an int", [encode(c)])),
            st.binary(min_size=1, max_size=12).filter(lambda b: not decode(b)[0])
            .map(lambda b: (f"undecodable operation frame {b!r}", [b])),
        ]
        if ping is not None:
            cases.append(_undecodable_argument("ping", ping))
        return st.one_of(*cases)


def _undecodable_argument(label: str, code: Any) -> st.SearchStrategy[tuple[str, list[bytes]]]:
    """A declared operation ``code`` followed by an argument frame that does not decode."""
    return (st.binary(min_size=1, max_size=12).filter(lambda b: not decode(b)[0])
            .map(lambda b: (f"{label} with an undecodable argument frame {b!r}",
                            [encode(code), b])))


PROFILES: Final[dict[str, WireProfile]] = {
    p.name: p for p in (RepEnvelope(), LmcacheMq(), LmcacheOperations())}


def profile(name: str, *, origin: str = "capability wire") -> WireProfile:
    """The profile called ``name``; :class:`ConfigError` naming the known ones otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ConfigError(f"{origin}={name!r}: unknown control wire profile; known: "
                          f"{', '.join(PROFILES)}") from None
