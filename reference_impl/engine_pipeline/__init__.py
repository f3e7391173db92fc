"""The engine-pipeline contract (PIPE-1..14) on the ``vllm-v1`` profile: reference sides.

vLLM V1's API servers talk to their EngineCore processes over ZeroMQ: a
ROUTER and a PULL bound by each client, a DEALER and a PUSH per client
connected by each engine, MessagePack with aux frames for arrays, a
HELLO/READY handshake and an ``ENGINE_CORE_DEAD`` sentinel. This package is
that pipeline, torch-free (pyzmq, msgspec, numpy), as the executable meaning
of the contract:

- :mod:`.wire`: the profile (type bytes, framing, encoding, strict decoding);
- :mod:`.engine`: :class:`EngineCore`, the engine side;
- :mod:`.client`: :class:`EngineClient`, the client side;
- :mod:`.model`: :class:`FakeModel`, the deterministic engine core the suite
  drives engines with;
- :mod:`.errors`: the typed errors.

``REFERENCE`` is what ``zmq-conformance run --contract engine-pipeline``
tests by default: an implementation object with an ``engine`` and a
``client`` factory and its declared ``capabilities``. Its client takes both
restart policies as the keyword option ``restart`` (``none`` by default,
``adopt``), so it declares ``restart: "none,adopt"`` and the suite runs the
restart clause once per policy; ``REFERENCE_ADOPT`` is the same pipeline
declaring ``adopt`` alone (the whole suite with adopting clients).

CURVE is off by default. The client binds, so it is the CURVE server
(``curve_server_secret_key`` with ``curve_allowed_client_keys`` or
``curve_zap_handler``); each engine is a CURVE client of it
(``curve_client_secret_key``, ``curve_server_key``), on every socket, the
handshake one included (``docs/security.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from reference_impl.engine_pipeline import vllm_wire, wire
from reference_impl.engine_pipeline.client import EngineClient, RequestOutput
from reference_impl.engine_pipeline.engine import EngineCore
from reference_impl.engine_pipeline.errors import (
    AddressInUse,
    ClientClosed,
    DuplicateRequest,
    EngineDead,
    EngineFatal,
    HandshakeRefused,
    HandshakeTimeout,
    MessageTooLarge,
    PipelineError,
    ReadyTimeout,
    UtilityFailed,
    UtilityTimeout,
)
from reference_impl.engine_pipeline.model import FakeModel, token_of
from reference_impl.engine_pipeline.wire import FinishReason

#: ZMTP heartbeats of the reference client's PULL as tested: a paused engine is dead after
#: 0.8-1.0 s, inside the declared 1.5 s death bound. The timeout is also the stall either
#: process may suffer without a false death: on a loaded 2-core host (load 16-29) gaps of
#: 0.5-0.6 s between messages of live processes were measured, and a 400 ms timeout killed
#: live engines (vLLM's own ZMTP heartbeats are seconds: 2 s interval, 4 s timeout). The
#: engine side sets none: a PUSH that sends PINGs to a client that stopped reading gets no
#: PONG past the stalled bytes, and libzmq would drop that connection with every output
#: queued on it.
HEARTBEAT_IVL_MS = 200
HEARTBEAT_TIMEOUT_MS = 800


@dataclass(frozen=True)
class PipelineImplementation:
    """An engine-pipeline implementation: an engine factory, a client factory, or both.

    A side left ``None`` is not under test; the suite plays it with the
    reference. ``capabilities`` are what it declares (see
    ``conformance.contracts.engine_pipeline.spec``). Calling it returns
    itself, so ``MODULE:ATTR`` may name it or a zero-argument callable.
    """

    engine: Any = None
    client: Any = None
    capabilities: Mapping[str, Any] = field(default_factory=dict)

    def __call__(self) -> PipelineImplementation:
        return self


class HeartbeatClient(EngineClient):
    """The reference client with ZMTP heartbeats on its output PULL (``detects_hang``)."""

    def __init__(self, addresses: Any = "tcp", **options: Any) -> None:
        options.setdefault("heartbeat_ivl_ms", HEARTBEAT_IVL_MS)
        options.setdefault("heartbeat_timeout_ms", HEARTBEAT_TIMEOUT_MS)
        super().__init__(addresses, **options)


class AdoptingClient(HeartbeatClient):
    """The reference client with restart policy ``adopt`` by default."""

    def __init__(self, addresses: Any = "tcp", **options: Any) -> None:
        options.setdefault("restart", "adopt")
        super().__init__(addresses, **options)


class VllmWireEngine(EngineCore):
    """The reference engine on the ``vllm-0.33`` profile (vLLM 0.33's payload layouts)."""

    def __init__(self, addresses: Any, **options: Any) -> None:
        options.setdefault("wire", vllm_wire.PROFILE)
        super().__init__(addresses, **options)


class VllmWireClient(HeartbeatClient):
    """The reference client (heartbeats on) on the ``vllm-0.33`` profile."""

    def __init__(self, addresses: Any = "tcp", **options: Any) -> None:
        options.setdefault("wire", vllm_wire.PROFILE)
        super().__init__(addresses, **options)


class VllmWireAdoptingClient(AdoptingClient):
    """The reference client with restart ``adopt`` on the ``vllm-0.33`` profile."""

    def __init__(self, addresses: Any = "tcp", **options: Any) -> None:
        options.setdefault("wire", vllm_wire.PROFILE)
        super().__init__(addresses, **options)


REFERENCE_CAPABILITIES: Mapping[str, Any] = {
    "wire": "vllm-v1",
    "detects_hang": True,
    "death_bound_ms": 1500,
    "shutdown_bound_ms": 2000,
    "malformed_input": "tolerate",
    "restart": "none,adopt",
    "max_message_bytes": 64 << 20,
    "authentication": True,
}

REFERENCE = PipelineImplementation(engine=EngineCore, client=HeartbeatClient,
                                   capabilities=REFERENCE_CAPABILITIES)
REFERENCE_ADOPT = PipelineImplementation(
    engine=EngineCore, client=AdoptingClient,
    capabilities={**REFERENCE_CAPABILITIES, "restart": "adopt"})
#: The same pipeline on the ``vllm-0.33`` profile: ``--transport
#: reference_impl.engine_pipeline:REFERENCE_VLLM``.
REFERENCE_VLLM = PipelineImplementation(
    engine=VllmWireEngine, client=VllmWireClient,
    capabilities={**REFERENCE_CAPABILITIES, "wire": vllm_wire.PROFILE})
REFERENCE_VLLM_ADOPT = PipelineImplementation(
    engine=VllmWireEngine, client=VllmWireAdoptingClient,
    capabilities={**REFERENCE_VLLM.capabilities, "restart": "adopt"})

_BY_PROFILE: Mapping[str, PipelineImplementation] = {
    wire.PROFILE: REFERENCE, vllm_wire.PROFILE: REFERENCE_VLLM}


def reference_for(profile: str) -> PipelineImplementation:
    """The reference pipeline speaking wire profile ``profile`` (the side the suite plays
    when an implementation provides only one); ``ValueError`` for an unknown profile."""
    try:
        return _BY_PROFILE[profile]
    except KeyError:
        raise ValueError(f"no reference pipeline speaks wire profile {profile!r:.40}; known: "
                         f"{', '.join(_BY_PROFILE)}") from None


__all__ = [
    "HEARTBEAT_IVL_MS",
    "HEARTBEAT_TIMEOUT_MS",
    "REFERENCE",
    "REFERENCE_ADOPT",
    "REFERENCE_CAPABILITIES",
    "REFERENCE_VLLM",
    "REFERENCE_VLLM_ADOPT",
    "AddressInUse",
    "AdoptingClient",
    "ClientClosed",
    "DuplicateRequest",
    "EngineClient",
    "EngineCore",
    "EngineDead",
    "EngineFatal",
    "FakeModel",
    "FinishReason",
    "HandshakeRefused",
    "HandshakeTimeout",
    "HeartbeatClient",
    "MessageTooLarge",
    "PipelineError",
    "PipelineImplementation",
    "ReadyTimeout",
    "RequestOutput",
    "UtilityFailed",
    "UtilityTimeout",
    "VllmWireAdoptingClient",
    "VllmWireClient",
    "VllmWireEngine",
    "reference_for",
    "token_of",
]
