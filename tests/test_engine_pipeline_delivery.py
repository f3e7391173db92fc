"""The reference client decodes outputs straight into RequestOutput: the same frames as the
wire's EngineOutputs decode, to the same values, and the same frames are refused."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pytest
import zmq

from reference_impl.engine_pipeline import wire
from reference_impl.engine_pipeline.client import _DeliveredOutputs
from reference_impl.engine_pipeline.wire import EngineOutput, EngineOutputs, UtilityOutput

_WIRE = wire.Decoders()
_CLIENT = wire.Decoders(outputs_type=_DeliveredOutputs)


def _frames(message: Any) -> list[zmq.Frame]:
    return [zmq.Frame(bytes(memoryview(f).cast("B"))) for f in wire.Encoder().encode(message)]


def _fields(out: Any) -> tuple[Any, ...]:
    tokens = getattr(out, "new_token_ids", None)
    tokens = out.token_ids if tokens is None else tokens
    payload = out.payload["x"].tolist() if isinstance(out.payload, dict) else out.payload
    return out.request_id, tokens, out.finish_reason, payload, out.detail


def test_the_same_frames_decode_to_the_same_values() -> None:
    message = EngineOutputs(3, [
        EngineOutput("a", [1, 2]),
        EngineOutput("b", [], 1),
        EngineOutput("c", [7], None, wire.prepare({"x": np.arange(70_000, dtype=np.int32)}),
                     b"detail"),
    ], UtilityOutput(9, None, [1, "two"]))
    ours = _CLIENT.outputs.decode(_frames(message), "outputs")
    theirs = wire.decode_outputs(_frames(message), _WIRE)
    assert ours.engine_index == theirs.engine_index == 3
    assert ours.utility_output == theirs.utility_output
    assert [_fields(o) for o in ours.outputs] == [_fields(o) for o in theirs.outputs]


@pytest.mark.parametrize("output", [
    ["rid"],  # no token list: EngineOutput requires one
    ["rid", ["x"]],  # tokens that are not integers
    [5, [1]],  # a request id that is not a string
    ["rid", [1], "LENGTH"],  # a finish reason that is not an integer
])
def test_the_same_frames_are_refused(output: list[Any]) -> None:
    frames = [zmq.Frame(msgspec.msgpack.encode([0, [output]]))]
    with pytest.raises(wire.MalformedPayload):
        wire.decode_outputs(frames, _WIRE)
    with pytest.raises(wire.MalformedPayload):
        _CLIENT.outputs.decode(frames, "outputs")
