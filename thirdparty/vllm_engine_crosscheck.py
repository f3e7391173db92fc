"""Cross-check of an engine-pipeline wire profile against vLLM's own code.

``--profile vllm-0.33`` (the default) checks the profile with vLLM 0.33's
payload layouts (``reference_impl/engine_pipeline/vllm_wire.py``); on vLLM
0.33.0 every check is a MATCH. ``--profile vllm-v1`` repeats the original
check of the default profile, which speaks vLLM's framing with the suite's
own payloads (its mismatches are listed in ``docs/adapters.md``).

Not part of the package or the test suite (``docs/adapters.md``, "Engine
pipeline", says how to run it): it needs vLLM's ``vllm/v1/serial_utils.py``
(``MsgpackEncoder``, ``MsgpackDecoder``) and ``vllm/v1/engine/__init__.py``
(``EngineCoreRequest``, ``EngineCoreOutputs``) importable, so torch, in a
scratch environment of its own.

Each check puts bytes made by one side in front of the other side's code:

- requests: vLLM's own ``EngineCoreRequest``, ``abort_requests`` list and
  ``call_utility`` tuple, encoded by vLLM's ``MsgpackEncoder`` and framed as
  vLLM's ``MPClient._send_input`` frames them (``[type byte, *frames]``),
  are decoded by the profile's decoder, and then sent over real TCP to the
  reference ``EngineCore`` (the suite plays vLLM's client sockets with its
  raw peer): what comes back, or that the engine died, is printed;
- outputs: what the reference engine sends for its requests is decoded by
  vLLM's ``MsgpackDecoder(EngineCoreOutputs)``, as vLLM's
  ``process_outputs_socket`` does, and compared field by field;
- arrays: a numpy array in a field vLLM types as ``np.ndarray`` is encoded
  by each side and decoded by the other;
- constants: request type bytes, finish reasons, the death sentinel.

It prints one line per check, ``MATCH`` or ``MISMATCH`` and why, and exits 1
when any check is a mismatch (0 when the profile is vLLM's wire byte for byte).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from conformance.contracts.engine_pipeline.peers import RawClient
from reference_impl.engine_pipeline import profiles, vllm_wire, wire
from reference_impl.engine_pipeline.engine import EngineCore
from reference_impl.engine_pipeline.model import FakeModel

try:
    from vllm.sampling_params import SamplingParams
    from vllm.v1 import engine as vengine
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder
except ImportError as exc:  # pragma: no cover - scratch environments only
    sys.exit(f"vLLM's serial_utils and engine structs do not import here: {exc}")

_results: list[tuple[str, bool, str]] = []
#: The profile under check (``--profile``) and its codec.
PROFILE = vllm_wire.PROFILE
codec: Any = vllm_wire


def _check(name: str, ok: bool, detail: str) -> None:
    _results.append((name, ok, detail))
    print(f"{'MATCH   ' if ok else 'MISMATCH'} {name}: {detail}", flush=True)


def _attempt(name: str, action: Callable[[], str]) -> None:
    """Run one check: its return value is the MATCH detail, an exception the MISMATCH."""
    try:
        _check(name, True, action())
    except Exception as exc:
        _check(name, False, f"{type(exc).__name__}: {str(exc)[:300]}")


def _frames(parts: Any) -> list[bytes]:
    return [bytes(p) for p in parts]


def vllm_request(rid: str, prompt: list[int], max_tokens: int,
                 client_index: int = 0, extra_args: dict[str, Any] | None = None) -> Any:
    """An ``EngineCoreRequest`` as vLLM's ``InputProcessor`` would hand it to the client."""
    return vengine.EngineCoreRequest(
        request_id=rid, prompt_token_ids=prompt, mm_features=None,
        sampling_params=SamplingParams(max_tokens=max_tokens, extra_args=extra_args),
        pooling_params=None,
        arrival_time=time.time(), lora_request=None, cache_salt=None,
        data_parallel_rank=None, client_index=client_index)


# -- constants ---------------------------------------------------------------------------


def check_constants() -> None:
    kinds = {t.name: t.value for t in vengine.EngineCoreRequestType
             if t.name in ("ADD", "ABORT", "START_DP_WAVE", "UTILITY")}
    ours = {t.name: t.value for t in wire.RequestType}
    _check("request type bytes", kinds == ours, f"vLLM {kinds}, profile {ours}")
    finish = {r.name: int(r) for r in vengine.FinishReason}
    mine = {r.name: int(r) for r in wire.FinishReason}
    shared = {k: v for k, v in finish.items() if k in mine}
    _check("finish reasons", shared == mine,
           f"vLLM {finish}, profile {mine}")
    # vllm.v1.engine.core imports the whole engine (tokenizers, model loaders): read the
    # constant from its source instead.
    core = Path(vengine.__file__).with_name("core.py").read_text()
    found = re.search(r"ENGINE_CORE_DEAD = (b\"[^\"]*\")", core)
    theirs = ast.literal_eval(found.group(1)) if found else None
    _check("death sentinel", theirs == wire.ENGINE_CORE_DEAD,
           f"vLLM {theirs!r}, profile {wire.ENGINE_CORE_DEAD!r}")
    from vllm import envs
    _check("inline threshold", envs.VLLM_MSGPACK_ZERO_COPY_THRESHOLD == wire.INLINE_THRESHOLD,
           f"vLLM {envs.VLLM_MSGPACK_ZERO_COPY_THRESHOLD}, profile {wire.INLINE_THRESHOLD}")


# -- requests, offline -------------------------------------------------------------------


def check_requests_offline() -> None:
    enc = MsgpackEncoder()
    decoders = codec.Decoders()
    payload = {"small": np.arange(3, dtype=np.int16), "big": np.arange(300, dtype=np.float32)}
    request = vllm_request("req-0", [1, 2, 3], 4, client_index=1,
                           extra_args={vllm_wire.PAYLOAD_KEY: payload})

    def add() -> str:
        kind, got = codec.decode_request(
            [wire.RequestType.ADD.value, *_frames(enc.encode(request))], decoders)
        assert kind is wire.RequestType.ADD, kind
        assert (got.request_id, got.prompt_token_ids, got.max_tokens, got.client_index) == (
            "req-0", [1, 2, 3], 4, 1), got
        if PROFILE == vllm_wire.PROFILE:
            for name, array in payload.items():
                assert np.array_equal(got.payload[name], array), (name, got.payload)
        return f"decoded as {got!r:.200}"

    _attempt("ADD: vLLM EngineCoreRequest -> profile decoder", add)

    def abort() -> str:
        got = codec.decode_request([wire.RequestType.ABORT.value,
                                    *_frames(enc.encode(["req-0", "req-1"]))], decoders)
        assert got[1] == ["req-0", "req-1"], got
        return f"decoded as {got!r}"

    _attempt("ABORT: vLLM list of ids -> profile decoder", abort)

    def utility() -> str:
        body = (0, 12345, "is_sleeping", ())
        got = codec.decode_request([wire.RequestType.UTILITY.value,
                                    *_frames(enc.encode(body))], decoders)
        return f"decoded as {got!r}"

    _attempt("UTILITY: vLLM (client_index, call_id, method, args) -> profile decoder",
             utility)

    def reverse_add() -> str:
        ours = wire.AddRequest("req-1", [1, 2], 3, 2, {"k": "v"})
        frames = _frames(codec.Encoder().encode(ours))
        got = MsgpackDecoder(vengine.EngineCoreRequest).decode(frames)
        assert (got.request_id, got.prompt_token_ids, got.client_index) == (
            "req-1", [1, 2], 2), got
        assert got.sampling_params.max_tokens == 3, got.sampling_params
        return f"vLLM decoded the profile's ADD as {got!r:.200}"

    _attempt("ADD: profile AddRequest -> vLLM's add_request_decoder", reverse_add)


# -- requests and outputs, live against the reference engine --------------------------------


class _Engine:
    """The reference EngineCore in a thread, shaking hands with the suite's raw client."""

    def __init__(self, client: RawClient) -> None:
        self.core = EngineCore([client.handshake_address], engine_index=0, model=FakeModel(),
                               wire=PROFILE)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            self.core.serve()
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self.core.shutdown()
        self.thread.join(10)


def check_live() -> None:
    enc = MsgpackEncoder()
    dec = MsgpackDecoder(vengine.EngineCoreOutputs)
    client = RawClient(wire=PROFILE)
    engine = _Engine(client)
    try:
        client.wait_ready(1, timeout_s=20)
        # 1. the profile's own ADD: what the reference engine sends back, through vLLM's
        #    decoder (the outputs direction).
        client.add("ours-0", 3)
        ours = _collect(client, "ours-0")
        _decode_outputs(dec, ours, "ours-0", 3)
        # 2. the profile's UTILITY, answered: its UtilityOutput through vLLM's decoder.
        call_id = client.utility("echo", 7)
        replies = client.messages(3.0)

        def utility_out() -> str:
            assert replies, "no reply from the reference engine"
            got = dec.decode(replies[-1])
            assert got.utility_output is not None, (
                f"vLLM's decoder found no utility_output in {got!r:.300}")
            assert got.utility_output.call_id == call_id, got.utility_output
            return f"vLLM decoded {got.utility_output!r:.200}"

        _attempt("UTILITY output: reference engine -> vLLM MsgpackDecoder(EngineCoreOutputs)",
                 utility_out)
        # 3. vLLM's own ADD, framed as vLLM's client frames it, to the reference engine.
        request = vllm_request("vllm-0", [5, 6], 2)
        client.send_raw([wire.RequestType.ADD.value, *_frames(enc.encode(request))])
        got = client.messages(3.0)

        def vllm_add() -> str:
            dead = [m for m in got if len(m) == 1 and m[0].bytes == wire.ENGINE_CORE_DEAD]
            assert not dead, (f"the reference engine sent ENGINE_CORE_DEAD "
                              f"(serve() raised {engine.error!r:.200})")
            assert got, (f"no output for vLLM's request within 3 s (reference engine alive: "
                         f"{engine.thread.is_alive()}, frames it dropped: "
                         f"{engine.core.dropped_frames})")
            return f"outputs {[dec.decode(m) for m in got]!r:.300}"

        _attempt("ADD live: vLLM EngineCoreRequest -> reference engine", vllm_add)
    finally:
        engine.stop()
        client.close()


def _collect(client: RawClient, rid: str, timeout_s: float = 5.0) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.messages(0.5)
        got.extend(batch)
        finished = [m for m in batch
                    if any(o.request_id == rid and o.finish_reason is not None
                           for o in codec.decode_outputs(m, client.decoders).outputs)]
        if finished:
            break
    return got


def _decode_outputs(dec: MsgpackDecoder, messages: list[Any], rid: str, tokens: int) -> None:
    for n, message in enumerate(messages):
        ours = codec.decode_outputs(message, codec.Decoders())

        def one(message: Any = message, ours: Any = ours) -> str:
            theirs = dec.decode(message)
            problems = []
            if theirs.engine_index != ours.engine_index:
                problems.append(f"engine_index {theirs.engine_index} != {ours.engine_index}")
            if len(theirs.outputs) != len(ours.outputs):
                problems.append(f"{len(theirs.outputs)} outputs != {len(ours.outputs)}")
            for a, b in zip(theirs.outputs, ours.outputs, strict=False):
                if a.request_id != b.request_id or list(a.new_token_ids) != b.new_token_ids:
                    problems.append(f"output {a!r:.120} != {b!r:.120}")
                theirs_finish = None if a.finish_reason is None else int(a.finish_reason)
                if theirs_finish != b.finish_reason:
                    problems.append(f"finish_reason: vLLM reads {a.finish_reason!r}, the "
                                    f"profile sent {b.finish_reason!r}")
            assert not problems, "; ".join(problems)
            seen = [(o.request_id, list(o.new_token_ids), o.finish_reason)
                    for o in theirs.outputs]
            return f"vLLM read {seen}"

        finished = any(o.finish_reason is not None for o in ours.outputs)
        _attempt(f"output {n} ({'final' if finished else 'running'}): reference engine -> "
                 f"vLLM MsgpackDecoder(EngineCoreOutputs)", one)


# -- arrays ------------------------------------------------------------------------------


def check_arrays() -> None:
    small = np.arange(6, dtype=np.int32).reshape(2, 3)
    large = np.arange(4096, dtype=np.float32).reshape(64, 64)
    for label, array in (("inline (< 256 B)", small), ("aux frame (>= 256 B)", large)):
        # vLLM -> profile: vLLM's encoding of an ndarray (a utility argument), through the
        # profile's decoder.
        theirs = _frames(MsgpackEncoder().encode((0, 1, "echo", (array,))))

        def vllm_to_profile(theirs: list[bytes] = theirs, array: Any = array) -> str:
            _, body = codec.decode_request([wire.RequestType.UTILITY.value, *theirs],
                                           codec.Decoders())
            got = body[3][0]
            assert isinstance(got, np.ndarray) and np.array_equal(got, array), (
                f"vLLM sends an ndarray as the plain array [dtype, shape, data] (data: "
                f"extension 3 inline, else an aux index); the profile reads {got!r:.120}")
            return "equal"

        _attempt(f"array {label}: vLLM MsgpackEncoder -> profile decoder", vllm_to_profile)
        # profile -> vLLM: the profile's array encoding, through vLLM's typed decoder.
        ours = _frames(codec.Encoder().encode([array]))

        def profile_to_vllm(ours: list[bytes] = ours, array: Any = array) -> str:
            got = MsgpackDecoder(list[np.ndarray]).decode(ours)  # type: ignore[arg-type]
            assert np.array_equal(got[0], array), f"vLLM decoded {got!r:.200}"
            return "equal"

        _attempt(f"array {label}: profile encoder -> vLLM MsgpackDecoder(np.ndarray)",
                 profile_to_vllm)
        # vLLM's own round trip, as the control: its typed field gets the array back.
        output = vengine.EngineCoreOutput(request_id="a", new_token_ids=[1],
                                          routed_experts=array)
        frames = _frames(MsgpackEncoder().encode(vengine.EngineCoreOutputs(outputs=[output])))

        def vllm_round_trip(frames: list[bytes] = frames, array: Any = array) -> str:
            got = MsgpackDecoder(vengine.EngineCoreOutputs).decode(frames)
            assert np.array_equal(got.outputs[0].routed_experts, array), got
            return f"{len(frames)} frame(s), routed_experts equal"

        _attempt(f"array {label}: control, vLLM -> vLLM (EngineCoreOutput.routed_experts)",
                 vllm_round_trip)


def check_golden() -> None:
    """vLLM's encoder and the profile's, on the same messages, give the same bytes."""
    if PROFILE != vllm_wire.PROFILE:
        return
    ours = vllm_wire.Encoder(wall_clock=lambda: 1.5, monotonic_clock=lambda: 2.0)

    def add() -> str:
        theirs = _frames(MsgpackEncoder().encode(vengine.EngineCoreRequest(
            request_id="r", prompt_token_ids=[1, 2], mm_features=None,
            sampling_params=SamplingParams(max_tokens=4), pooling_params=None,
            arrival_time=1.5, lora_request=None, cache_salt=None, data_parallel_rank=None,
            client_index=1)))
        mine = _frames(ours.encode(wire.AddRequest("r", [1, 2], 4, 1)))
        assert theirs == mine, f"vLLM {theirs!r:.300}\nprofile {mine!r:.300}"
        return f"{len(mine[0])} bytes, identical"

    _attempt("bytes: EngineCoreRequest, vLLM encoder == profile encoder", add)

    def outputs() -> str:
        theirs = _frames(MsgpackEncoder().encode(vengine.EngineCoreOutputs(
            engine_index=0, timestamp=2.0, outputs=[vengine.EngineCoreOutput(
                request_id="a", new_token_ids=[7], finish_reason=vengine.FinishReason.LENGTH)])))
        mine = _frames(ours.encode(wire.EngineOutputs(0, [wire.EngineOutput("a", [7], 1)])))
        assert theirs == mine, f"vLLM {theirs!r:.300}\nprofile {mine!r:.300}"
        return f"{len(mine[0])} bytes, identical"

    _attempt("bytes: EngineCoreOutputs, vLLM encoder == profile encoder", outputs)


def main() -> int:
    global PROFILE, codec
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default=vllm_wire.PROFILE, choices=list(profiles.CODECS),
                        help="the engine-pipeline wire profile to check (default %(default)s)")
    PROFILE = parser.parse_args().profile
    codec = profiles.codec(PROFILE)
    print(f"profile {PROFILE}", flush=True)
    for step in (check_constants, check_requests_offline, check_live, check_arrays,
                 check_golden):
        try:
            step()
        except Exception:
            _check(step.__name__, False, traceback.format_exc(limit=3))
    bad = [name for name, ok, _ in _results if not ok]
    print(f"\n{len(_results) - len(bad)} match, {len(bad)} mismatch")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
