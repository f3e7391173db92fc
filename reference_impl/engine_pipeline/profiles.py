"""The engine pipeline's wire profiles by name, for the sides that can speak more than one.

A codec is a module with the profile's ``PROFILE`` name, ``Encoder``,
``Decoders``, ``prepare``, ``decode_request``, ``decode_add`` and
``decode_outputs``; each decodes to and encodes from the suite's message
types (:mod:`.wire`'s ``AddRequest``, ``EngineOutputs``...), so the reference
and the raw peers are written once and the profile only changes the bytes.
The framing (type bytes, identities, the death sentinel, the handshake) is
the same in every profile and stays in :mod:`.wire`.
"""

from __future__ import annotations

from types import ModuleType
from typing import Final

from reference_impl.engine_pipeline import vllm_wire, wire

__all__ = ["CODECS", "DEFAULT", "codec"]

DEFAULT: Final = wire.PROFILE
CODECS: Final[dict[str, ModuleType]] = {wire.PROFILE: wire, vllm_wire.PROFILE: vllm_wire}


def codec(name: str) -> ModuleType:
    """The codec of profile ``name``; ``ValueError`` naming the known ones otherwise."""
    try:
        return CODECS[name]
    except KeyError:
        raise ValueError(f"unknown engine-pipeline wire profile {name!r:.40}; known: "
                         f"{', '.join(CODECS)}") from None
