"""The engine-pipeline implementation under test: its two factories and what they declare.

A target ``MODULE:ATTR`` names an object with an ``engine`` and/or a
``client`` attribute, each a factory, and optionally ``capabilities`` (a
mapping; ``reference_impl.engine_pipeline:REFERENCE`` has all three). A
side that is missing (or ``None``) is not under test: its clauses are
skipped with the reason and the suite plays that side with the reference.
The engine factory must be importable by name (a module-level class or
function): the suite builds engines in processes of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

import pytest

from conformance.config.loading import implementation_sides
from conformance.errors import ConfigError

DEFAULT_TARGET = "reference_impl.engine_pipeline:REFERENCE"
WIRE_PROFILES = ("vllm-v1", "vllm-0.33")
MALFORMED_INPUT = ("tolerate", "fatal")
RESTART = ("none", "adopt")

Side = Literal["engine", "client"]


@dataclass(frozen=True)
class PipelineCapabilities:
    """What an implementation declares (``--capability NAME=VALUE`` overrides each).

    Attributes:
        wire: the wire profile it speaks (``vllm-v1``, the default, or ``vllm-0.33``,
            vLLM 0.33's own payload layouts; ``docs/engine_pipeline.md``).
        detects_hang: it has a liveness heartbeat, so a paused (SIGSTOP) engine is
            seen as dead; without it the pause test is skipped with the reason.
        death_bound_ms: an engine's death is seen within this bound.
        shutdown_bound_ms: shutdown of either side completes within this bound.
        malformed_input: ``tolerate`` (hostile frames are dropped, the loop goes
            on) or ``fatal`` (the side dies visibly within the death bound).
        restart: ``none`` (after a death the client stays dead, with typed errors)
            or ``adopt`` (it takes a replacement engine), or both as ``none,adopt``:
            then the client factory takes the keyword option ``restart=POLICY``
            (its default is the first) and the restart clause runs once per policy.
        max_message_bytes: the largest request ``add()`` accepts (encoded).
        authentication: CURVE, off by default and on when the suite passes keys: the
            client factory takes ``curve_server_secret_key`` and
            ``curve_allowed_client_keys`` (it binds: the CURVE server), the engine
            factory ``curve_client_secret_key`` and ``curve_server_key`` (PIPE-13);
            without it PIPE-13 is skipped and PIPE-14 runs its plain variant only.
    """

    wire: str = "vllm-v1"
    detects_hang: bool = False
    death_bound_ms: int = 2000
    shutdown_bound_ms: int = 3000
    malformed_input: str = "tolerate"
    restart: str = "none"
    max_message_bytes: int = 64 << 20
    authentication: bool = False

    @property
    def restart_policies(self) -> tuple[str, ...]:
        """The declared restart policies, the client's default first."""
        return tuple(self.restart.split(","))

    def restart_option(self, policy: str, clause: str) -> dict[str, Any]:
        """The client options that select ``policy`` (skip ``clause`` if not declared):
        nothing when it is the only one declared, else ``restart=policy``."""
        if policy not in self.restart_policies:
            pytest.skip(f"{clause}: restart={policy} not declared (restart: {self.restart})")
        return {} if len(self.restart_policies) == 1 else {"restart": policy}

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, origin: str) -> PipelineCapabilities:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"{origin}: unknown capability {unknown[0]!r}; known: "
                              f"{', '.join(sorted(known))}")
        merged: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in values:
                continue
            value = values[f.name]
            merged[f.name] = _coerce(f.name, value, f.default, origin)
        caps = cls(**merged)
        for name, allowed in (("wire", WIRE_PROFILES), ("malformed_input", MALFORMED_INPUT)):
            if getattr(caps, name) not in allowed:
                raise ConfigError(f"{origin}: {name} must be one of {', '.join(allowed)}, got "
                                  f"{getattr(caps, name)!r}")
        policies = caps.restart.split(",")
        if not policies or any(p not in RESTART for p in policies) \
                or len(set(policies)) != len(policies):
            raise ConfigError(f"{origin}: restart must be one of {', '.join(RESTART)}, or both "
                              f"comma-separated (the first is the client's default), got "
                              f"{caps.restart!r}")
        for name in ("death_bound_ms", "shutdown_bound_ms", "max_message_bytes"):
            if getattr(caps, name) <= 0:
                raise ConfigError(f"{origin}: {name} must be positive")
        return caps


def _coerce(name: str, value: Any, default: Any, origin: str) -> Any:
    if isinstance(default, bool):
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
            return value.lower() in ("true", "1")
        if not isinstance(value, bool):
            raise ConfigError(f"{origin}: {name} must be true or false, got {value!r}")
        return value
    if isinstance(default, int):
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{origin}: {name} must be an integer, got {value!r}") from None
    return str(value)


@dataclass(frozen=True)
class PipelineSpec:
    """The implementation under test. ``engine``/``client`` are ``None`` when not provided."""

    name: str
    engine: Callable[..., Any] | None
    client: Callable[..., Any] | None
    capabilities: PipelineCapabilities

    def require(self, side: Side, clause: str) -> Callable[..., Any]:
        """The factory of ``side``, or skip ``clause`` naming the missing side."""
        factory = self.engine if side == "engine" else self.client
        if factory is None:
            pytest.skip(f"{clause}: {self.name} provides no {side} (attribute {side!r})")
        return factory

    def engine_or_reference(self) -> Callable[..., Any]:
        from reference_impl.engine_pipeline import reference_for

        return self.engine if self.engine is not None \
            else reference_for(self.capabilities.wire).engine

    def client_or_reference(self) -> Callable[..., Any]:
        from reference_impl.engine_pipeline import reference_for

        return self.client if self.client is not None \
            else reference_for(self.capabilities.wire).client

    @property
    def engine_path(self) -> str:
        """``MODULE:ATTR`` of the engine factory (what an engine process imports)."""
        return factory_path(self.engine_or_reference())


def factory_path(factory: Any) -> str:
    module = getattr(factory, "__module__", None)
    qualname = getattr(factory, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        raise ConfigError(f"the engine factory {factory!r} is not importable by name; the suite "
                          "builds engines in their own processes (use a module-level class or "
                          "function)")
    return f"{module}:{qualname}"


def make_spec(factory: Any, *, name: str | None = None,
              overrides: Mapping[str, Any] | None = None,
              origin: str = "capabilities") -> PipelineSpec:
    """Build a :class:`PipelineSpec` from an implementation object, or from a zero-argument
    callable returning one; ``overrides`` (from ``--capability``) win over its
    ``capabilities``."""
    label, target, found = implementation_sides(factory, ("engine", "client"), name=name)
    engine, client = found["engine"], found["client"]
    if engine is None and client is None:
        raise ConfigError(f"{label}: the engine-pipeline contract needs an object with an "
                          f"'engine' and/or a 'client' factory, e.g. {DEFAULT_TARGET}")
    declared = getattr(target, "capabilities", None)
    if declared is not None and not isinstance(declared, Mapping):
        raise ConfigError(f"capabilities of {label} must be a mapping")
    values = dict(declared or {})
    values.update(overrides or {})
    caps = PipelineCapabilities.from_mapping(values, origin=f"{origin} of {label}")
    if engine is not None and not hasattr(engine, "engine_process"):
        factory_path(engine)  # a driver's engine starts its own process instead
    return PipelineSpec(name=label, engine=engine, client=client, capabilities=caps)


def load(path: str, *, option: str = "--transport") -> PipelineSpec:
    """Resolve ``MODULE:ATTR`` to a :class:`PipelineSpec` (errors name ``option``)."""
    from conformance.config.loading import load_factory

    return make_spec(load_factory(path, option=option), name=path)
