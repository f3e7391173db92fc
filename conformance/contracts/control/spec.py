"""The control-channel implementation under test: its two factories and what they declare.

A target ``MODULE:ATTR`` names an object with a ``server`` and/or a
``client`` attribute, each a factory (``reference_impl.control:REFERENCE``
has both). A side that is missing (or ``None``) is not under test: its
clauses are skipped with the reason, and the suite plays that side with the
reference. Capabilities come from ``zmq_conformance_capabilities`` on the
server factory (see ``reference_impl.control.interface``).
"""

from __future__ import annotations

import importlib
import os
import sys
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


def make_spec(target: Any, *, name: str) -> ControlSpec:
    """Build a :class:`ControlSpec` from an object with ``server``/``client`` factories."""
    server = getattr(target, "server", None)
    client = getattr(target, "client", None)
    for side, factory in (("server", server), ("client", client)):
        if factory is not None and not callable(factory):
            raise ConfigError(f"{name}: {side} is a {type(factory).__name__}, not a factory")
    if server is None and client is None:
        raise ConfigError(f"{name}: the control contract needs an object with a 'server' "
                          "and/or a 'client' factory, e.g. reference_impl.control:REFERENCE")
    declared = getattr(server, CAPABILITIES_ATTRIBUTE, None) if server is not None else None
    if declared is None:
        caps = ControlCapabilities()
    elif isinstance(declared, Mapping):
        caps = ControlCapabilities.from_mapping(declared, origin=f"{CAPABILITIES_ATTRIBUTE} of "
                                                                 f"{name}.server")
    else:
        raise ConfigError(f"{CAPABILITIES_ATTRIBUTE} of {name}.server must be a mapping")
    if "PING" not in caps.request_types:
        raise ConfigError(f"{name}.server declares request_types without PING; every control "
                          "protocol has one (CTL-1)")
    return ControlSpec(name=name, server=server, client=client, capabilities=caps)


def load(path: str, *, option: str = "--transport") -> ControlSpec:
    """Resolve ``MODULE:ATTR`` to a :class:`ControlSpec` (errors name ``option``)."""
    module_name, sep, attr_path = path.partition(":")
    if not sep or not module_name or not attr_path:
        raise ConfigError(f"{option}={path!r}: expected MODULE:ATTR, e.g. {DEFAULT_TARGET}")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigError(f"{option}={path!r}: cannot import {module_name!r}: "
                          f"{type(exc).__name__}: {exc}") from None
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(f"{option}={path!r}: {module_name!r} has no attribute "
                              f"{attr_path!r}") from None
    return make_spec(target, name=path)
