"""The control-channel implementation under test: its two factories and what they declare.

A target ``MODULE:ATTR`` names an object with a ``server`` and/or a
``client`` attribute, each a factory (``reference_impl.control:REFERENCE``
has both). A side that is missing (or ``None``) is not under test: its
clauses are skipped with the reason, and the suite plays that side with the
reference. Capabilities come from ``zmq_conformance_capabilities`` on the
server factory (see ``reference_impl.control.interface``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from conformance.errors import ConfigError

DEFAULT_TARGET = "reference_impl.control:REFERENCE"
CAPABILITIES_ATTRIBUTE = "zmq_conformance_capabilities"
HEAD_OF_LINE = ("serial", "concurrent")

Side = Literal["server", "client"]


@dataclass(frozen=True)
class ControlCapabilities:
    """What a server declares: its own request types (with a body each) and its head of line."""

    request_types: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: {"PING": {}})
    head_of_line: str = "serial"

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, origin: str) -> ControlCapabilities:
        known = {"request_types", "head_of_line"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"{origin}: unknown capability {unknown[0]!r}; known: "
                              f"{', '.join(sorted(known))}")
        types = values.get("request_types", {"PING": {}})
        if not isinstance(types, Mapping) or not all(
            isinstance(k, str) and isinstance(v, Mapping) for k, v in types.items()
        ):
            raise ConfigError(f"{origin}: request_types must map each type (str) to a body "
                              "(a mapping), e.g. {'PING': {}}")
        hol = values.get("head_of_line", "serial")
        if hol not in HEAD_OF_LINE:
            raise ConfigError(f"{origin}: head_of_line must be one of {', '.join(HEAD_OF_LINE)},"
                              f" got {hol!r}")
        return cls(request_types=dict(types), head_of_line=hol)


@dataclass(frozen=True)
class ControlSpec:
    """The implementation under test. ``server``/``client`` are ``None`` when not provided."""

    name: str
    server: Callable[..., Any] | None
    client: Callable[..., Any] | None
    capabilities: ControlCapabilities

    def require(self, side: Side, clause: str) -> Callable[..., Any]:
        """The factory of ``side``, or skip ``clause`` naming the missing side."""
        factory = self.server if side == "server" else self.client
        if factory is None:
            pytest.skip(f"{clause}: {self.name} provides no {side} (attribute {side!r})")
        return factory

    def server_or_reference(self) -> Callable[..., Any]:
        from reference_impl.control import ControlServer

        return self.server if self.server is not None else ControlServer

    def client_or_reference(self) -> Callable[..., Any]:
        from reference_impl.control import ControlClient

        return self.client if self.client is not None else ControlClient


def make_spec(factory: Any, *, name: str | None = None,
              overrides: Mapping[str, Any] | None = None,
              origin: str = "capabilities") -> ControlSpec:
    """Build a :class:`ControlSpec` from an implementation object (``server``/``client``
    factories), or from a zero-argument callable returning one; ``overrides`` (from
    ``--capability``) win over what the server factory declares."""
    label = name or f"{getattr(factory, '__module__', '?')}:{getattr(factory, '__qualname__', '?')}"
    target = factory
    if not (hasattr(target, "server") or hasattr(target, "client")) and callable(target):
        try:
            target = target()
        except Exception as exc:
            raise ConfigError(f"{label}: calling it for the implementation raised "
                              f"{type(exc).__name__}: {exc}") from None
    server = getattr(target, "server", None)
    client = getattr(target, "client", None)
    for side, side_factory in (("server", server), ("client", client)):
        if side_factory is not None and not callable(side_factory):
            raise ConfigError(f"{label}: {side} is a {type(side_factory).__name__}, "
                              "not a factory")
    if server is None and client is None:
        raise ConfigError(f"{label}: the control contract needs an object with a 'server' "
                          f"and/or a 'client' factory, e.g. {DEFAULT_TARGET}")
    declared = getattr(server, CAPABILITIES_ATTRIBUTE, None) if server is not None else None
    if declared is not None and not isinstance(declared, Mapping):
        raise ConfigError(f"{CAPABILITIES_ATTRIBUTE} of {label}.server must be a mapping")
    values = dict(declared or {})
    values.update(overrides or {})
    caps = ControlCapabilities.from_mapping(values, origin=f"{origin} of {label}")
    if "PING" not in caps.request_types:
        raise ConfigError(f"{label}.server declares request_types without PING; every control "
                          "protocol has one (CTL-1)")
    return ControlSpec(name=label, server=server, client=client, capabilities=caps)


def load(path: str, *, option: str = "--transport") -> ControlSpec:
    """Resolve ``MODULE:ATTR`` to a :class:`ControlSpec` (errors name ``option``)."""
    from conformance.config.loading import load_factory

    return make_spec(load_factory(path, option=option), name=path)
