"""Hostile payload values per wire profile: one deliberate deviation, in the profile's own form.

PIPE-7's tests put these in the payload slot of an otherwise valid message
(the ADD's payload, an output's payload echo) and encode it with the
profile's codec, so the strict decoder reaches the value and must refuse it
for what it is, not for a layout it does not know. The pickle and
cloudpickle extensions (1 and 2) are the same in every profile (vLLM's).
"""

from __future__ import annotations

from typing import Any

import msgspec

from reference_impl.engine_pipeline import vllm_wire, wire

__all__ = ["aux_index_out_of_range", "shape_not_buffer"]


def aux_index_out_of_range(profile: str, index: int) -> Any:
    """A value that refers to aux frame ``index`` (the message has fewer)."""
    if profile == vllm_wire.PROFILE:  # vLLM's array form with an aux index
        return ["|u1", [300], index]
    return msgspec.msgpack.Ext(wire.EXT_AUX_BYTES, msgspec.msgpack.encode(index))


def shape_not_buffer(profile: str) -> Any:
    """An array whose shape (4x4 of f8, 128 bytes) does not fit its 5-byte buffer."""
    if profile == vllm_wire.PROFILE:
        return ["<f8", [4, 4], msgspec.msgpack.Ext(vllm_wire.EXT_RAW_VIEW, b"short")]
    return msgspec.msgpack.Ext(wire.EXT_NDARRAY, msgspec.msgpack.encode(
        ["<f8", [4, 4], b"short"]))
