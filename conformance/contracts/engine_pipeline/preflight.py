"""Before any clause is judged: does each side under test speak its declared wire profile?

An engine declared on ``vllm-v1`` that speaks ``vllm-0.33`` (or the other way
round) would fail PIPE-1, PIPE-2, PIPE-12... with "no output" or dropped
frames, which reads like a broken engine. So once per session (in the xdist
controller) the suite plays the other side on the declared profile and
looks at what comes back:

- engine under test: a raw client sends one ADD (2 tokens) on the declared
  profile. Outputs that decode under it to that request's two tokens and
  its LENGTH finish: go on. Otherwise the same output frames are read under
  every other profile, and, if the engine sent nothing, a fresh engine is
  asked on each other profile (a fresh one: an engine may die of a request
  it cannot parse);
- client under test: a raw engine joins it and reads the ADD of one
  ``add()``; an ADD that decodes under the declared profile to that request:
  go on, else it is read under every other profile.

Only positive evidence is a mismatch: the side's bytes decode, as the probe
request, under another profile and not under the declared one. Then the run
ends as a usage error (:class:`ConfigError`) with one line naming both
profiles. Silence, or bytes no profile reads, are left to the clauses: a
verdict of "wrong profile" on a side that is merely broken would be a false
one.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from conformance.contracts.engine_pipeline.harness import Rig
from conformance.contracts.engine_pipeline.peers import RawClient, RawEngine
from conformance.contracts.engine_pipeline.spec import PipelineSpec
from conformance.errors import ConfigError
from reference_impl.engine_pipeline import profiles
from reference_impl.engine_pipeline.model import token_of
from reference_impl.engine_pipeline.wire import (
    ENGINE_CORE_DEAD,
    FinishReason,
    RequestType,
    WireError,
)

__all__ = ["check_profile", "engine_speaks", "read_add_as", "read_outputs_as"]

_RID: Final = "preflight-probe"
_TOKENS: Final = 2
#: How long a probe waits for the engine's outputs (an idle engine answers in milliseconds).
_LISTEN_S: Final = 2.0
_READY_S: Final = 20.0


def check_profile(spec: PipelineSpec) -> None:
    """Raise :class:`ConfigError` when a side under test speaks another profile than it
    declares (see the module docstring)."""
    declared = spec.capabilities.wire
    with tempfile.TemporaryDirectory(prefix="pipe-preflight-") as tmp:
        if spec.engine is not None:
            speaks = engine_speaks(spec, Path(tmp))
            if speaks is not None and speaks != declared:
                raise ConfigError(_mismatch(spec, "engine", declared, speaks))
        if spec.client is not None:
            speaks = _client_speaks(spec, Path(tmp))
            if speaks is not None and speaks != declared:
                raise ConfigError(_mismatch(spec, "client", declared, speaks))


def _mismatch(spec: PipelineSpec, side: str, declared: str, speaks: str) -> str:
    return (f"engine-pipeline: profile mismatch: nothing the {side} of {spec.name} sent "
            f"decodes under wire profile {declared} (declared), and it decodes under "
            f"{speaks}; no clause is judged: declare --capability wire={speaks}")


def read_outputs_as(profile: str, messages: list[list[Any]]) -> bool:
    """Whether ``messages`` hold, decoded under ``profile``, the probe request's two tokens
    and its LENGTH finish."""
    codec = profiles.codec(profile)
    decoders = codec.Decoders()
    tokens: list[int] = []
    finished = False
    for frames in messages:
        if len(frames) == 1 and bytes(frames[0]) == ENGINE_CORE_DEAD:
            continue
        try:
            message = codec.decode_outputs(frames, decoders)
        except WireError:
            continue
        for out in message.outputs:
            if out.request_id == _RID:
                tokens.extend(out.new_token_ids)
                finished = finished or out.finish_reason == int(FinishReason.LENGTH)
    return finished and tokens == [token_of(_RID, n) for n in range(_TOKENS)]


def read_add_as(profile: str, frames: list[Any]) -> bool:
    """Whether request ``frames`` (type byte first) are, under ``profile``, the probe's ADD."""
    if not frames or bytes(frames[0]) != RequestType.ADD.value:
        return False
    codec = profiles.codec(profile)
    try:
        request = codec.decode_add(frames[1:], codec.Decoders())
    except WireError:
        return False
    return bool(request.request_id == _RID and request.max_tokens == _TOKENS)


def _probe_engine(spec: PipelineSpec, tmp: Path, profile: str) -> list[list[Any]] | None:
    """The output messages an engine under test sent for one ADD on ``profile`` (None when
    it could not be started or never became ready)."""
    raw = RawClient(wire=profile)
    with Rig(spec, tmp) as rig:
        rig.closers.append(raw.close)
        try:
            rig.engine([raw.handshake_address], clause="preflight")
            raw.wait_ready(1, timeout_s=_READY_S)
        except Exception:
            return None
        raw.add(_RID, _TOKENS)
        messages: list[list[Any]] = []
        deadline = time.monotonic() + _LISTEN_S
        while time.monotonic() < deadline:
            batch = raw.messages(0.2)
            messages.extend([f.bytes for f in m] for m in batch)
            if any(len(m) == 1 and m[0] == ENGINE_CORE_DEAD for m in messages):
                break
            if read_outputs_as(profile, messages):
                break
        return messages


def engine_speaks(spec: PipelineSpec, tmp: Path) -> str | None:
    """The profile the engine under test answers the probe in: the declared one when it
    does, another when only that one reads it, None when no profile does."""
    declared = spec.capabilities.wire
    others = [p for p in profiles.CODECS if p != declared]
    answered = _probe_engine(spec, tmp, declared)
    if answered is None:
        return None
    if read_outputs_as(declared, answered):
        return declared
    for other in others:
        if answered and read_outputs_as(other, answered):
            return other
    for other in others:  # it sent nothing decodable: ask a fresh one in each other profile
        replies = _probe_engine(spec, tmp, other) or []
        if read_outputs_as(other, replies):
            return other
    return None


def _client_speaks(spec: PipelineSpec, tmp: Path) -> str | None:
    declared = spec.capabilities.wire
    with Rig(spec, tmp) as rig:
        try:
            client = rig.client(clause="preflight")
            engine = RawEngine(client.handshake_address, wire=declared)
        except Exception:
            return None
        rig.closers.append(engine.close)
        try:
            ready = rig.ready_in_background(client, clause="preflight", may_fail=True)
            engine.join(_READY_S)
            if not ready():
                return None
            client.add(_RID, [1], _TOKENS)
        except Exception:
            return None
        got = engine.requests(_LISTEN_S)
        with contextlib.suppress(Exception):
            engine.send_dead()  # the probe is over: the client need not wait for tokens
    for frames in got:
        if read_add_as(declared, frames):
            return declared
    for other in (p for p in profiles.CODECS if p != declared):
        if any(read_add_as(other, frames) for frames in got):
            return other
    return None
