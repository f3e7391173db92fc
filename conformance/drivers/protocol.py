"""The driver protocol's wire: frames, the hello, requests, replies and error kinds.

``docs/drivers.md`` is the specification; this module is its executable
half, shared by the suite's side (:mod:`conformance.drivers.process`) and
the Python driver (:mod:`conformance.drivers.python`). A frame is a 4-byte
big-endian length and one MessagePack map. Nothing here does I/O: the
:class:`FrameReader` is fed bytes and hands back whole bodies, so each side
can read with whatever timeout and signal handling it needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec

__all__ = [
    "ERROR_KINDS",
    "MAX_FRAME_BYTES",
    "VERSION",
    "FrameReader",
    "Hello",
    "ProtocolError",
    "decode_body",
    "encode_frame",
]

#: The protocol version this suite speaks.
VERSION: Final = 1
#: Largest body either side may send.
MAX_FRAME_BYTES: Final = 256 * 1024 * 1024
_HEADER: Final = 4

#: The error kinds of version 1 (``docs/drivers.md``, section 4).
ERROR_KINDS: Final = frozenset({
    "duplicate", "dead", "closed", "too_large", "queue_full", "timeout", "rejected",
    "address_in_use", "invalid", "unsupported", "dead_engine", "error",
})

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder()


class ProtocolError(Exception):
    """Bytes that are not a frame of this protocol; the message says what was wrong."""


def encode_frame(body: Mapping[str, Any]) -> bytes:
    """One frame: the length header and ``body`` as MessagePack.

    Raises ``TypeError``/``OverflowError`` (from msgspec) when ``body`` holds
    something MessagePack cannot carry, such as an int beyond 64 bits: the
    caller reports that before anything is written.
    """
    payload = _ENCODER.encode(body)
    if len(payload) > MAX_FRAME_BYTES:
        raise ValueError(f"a protocol frame of {len(payload)} bytes exceeds the "
                         f"{MAX_FRAME_BYTES}-byte limit")
    return len(payload).to_bytes(_HEADER, "big") + payload


def decode_body(payload: bytes) -> dict[str, Any]:
    """The map in one frame's body; :class:`ProtocolError` if it is not one."""
    try:
        value = _DECODER.decode(payload)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"a frame's body is not MessagePack ({exc}); first bytes "
                            f"{payload[:32]!r}") from None
    if not isinstance(value, dict):
        raise ProtocolError(f"a frame's body is a {type(value).__name__}, not a map")
    return value


class FrameReader:
    """Cuts a byte stream into frame bodies; keeps partial frames between feeds."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        #: Bytes received so far, for error messages about a stream that is junk.
        self.received = 0

    def feed(self, data: bytes) -> list[bytes]:
        """Add ``data``; return every body now complete. :class:`ProtocolError` on junk."""
        self._buffer += data
        self.received += len(data)
        bodies: list[bytes] = []
        while len(self._buffer) >= _HEADER:
            length = int.from_bytes(self._buffer[:_HEADER], "big")
            if length > MAX_FRAME_BYTES:
                raise ProtocolError(
                    f"a frame header announces {length} bytes (limit {MAX_FRAME_BYTES}): the "
                    f"stream is not this protocol; it starts {bytes(self._buffer[:40])!r}")
            if len(self._buffer) < _HEADER + length:
                break
            bodies.append(bytes(self._buffer[_HEADER:_HEADER + length]))
            del self._buffer[:_HEADER + length]
        return bodies

    def read_size(self, minimum: int = 1 << 16) -> int:
        """How much to read next: ``minimum``, or all of the frame in progress if larger.

        One big read per big frame, and small reads otherwise: allocating a
        large buffer for every small read costs more than the read itself.
        """
        if len(self._buffer) < _HEADER:
            return minimum
        length = int.from_bytes(self._buffer[:_HEADER], "big")
        return max(minimum, _HEADER + length - len(self._buffer))

    @property
    def pending(self) -> bytes:
        """The bytes of an incomplete frame (what a stream ended in the middle of)."""
        return bytes(self._buffer)


@dataclass(frozen=True)
class Hello:
    """What a driver declared in its hello (``docs/drivers.md``, section 3)."""

    contract: str
    protocol: int
    implementation: str
    capabilities: Mapping[str, Any]
    options: tuple[str, ...]
    sides: tuple[str, ...]
    reuse: bool
    #: The optional calls the driver declared (``calls``; section 3). A *declared* optional
    #: call is sent only to a driver that lists it; ``()`` when the hello has no ``calls``.
    calls: tuple[str, ...] = ()

    def offers(self, call: str) -> bool:
        """True when the driver declared the optional call ``call`` in its hello."""
        return call in self.calls

    @classmethod
    def parse(cls, body: Mapping[str, Any], *, contract: str) -> Hello:
        """Check a driver's hello answer; :class:`ProtocolError` naming what is wrong."""
        kind = body.get("type")
        if kind == "error":
            error = body.get("kind", "error")
            raise ProtocolError(f"refused the hello ({error}): {body.get('message', '')}")
        if kind != "hello":
            raise ProtocolError(f"answered the hello with a map of type {kind!r}, not 'hello'")
        protocol = body.get("protocol")
        if protocol != VERSION:
            raise ProtocolError(f"speaks protocol version {protocol!r}; this suite speaks "
                                f"version {VERSION}")
        if body.get("contract") != contract:
            raise ProtocolError(f"answered for contract {body.get('contract')!r}, but the "
                                f"suite asked for {contract!r}")
        capabilities = body.get("capabilities") or {}
        if not isinstance(capabilities, dict):
            raise ProtocolError("hello: 'capabilities' must be a map")
        options = _strings(body.get("options"), "options")
        sides = _strings(body.get("sides"), "sides")
        reuse = body.get("reuse", True)
        if not isinstance(reuse, bool):
            raise ProtocolError("hello: 'reuse' must be true or false")
        implementation = body.get("implementation", "")
        calls = _strings(body.get("calls"), "calls")
        return cls(contract=contract, protocol=VERSION, implementation=str(implementation),
                   capabilities=capabilities, options=options, sides=sides, reuse=reuse,
                   calls=calls)


def _strings(value: Any, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ProtocolError(f"hello: {name!r} must be an array of strings")
    return tuple(value)


def hello_request(contract: str) -> dict[str, Any]:
    """The suite's hello."""
    return {"type": "hello", "protocol": VERSION, "contract": contract}
