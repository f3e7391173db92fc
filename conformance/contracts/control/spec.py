"""The control-channel implementation under test: its two factories and what they declare.

A target ``MODULE:ATTR`` names an object with a ``server`` and/or a
``client`` attribute, each a factory (``reference_impl.control:REFERENCE``
has both). A side that is missing (or ``None``) is not under test: its
clauses are skipped with the reason, and the suite plays that side with the
reference. Capabilities come from ``zmq_conformance_capabilities`` on the
server factory, or on the client factory when there is no server (see
``reference_impl.control.interface``); ``--capability`` wins over both.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import pytest

from conformance.config.loading import implementation_sides
from conformance.errors import ConfigError

if TYPE_CHECKING:
    from conformance.contracts.control.wire import WireProfile

DEFAULT_TARGET = "reference_impl.control:REFERENCE"
CAPABILITIES_ATTRIBUTE = "zmq_conformance_capabilities"
HEAD_OF_LINE = ("serial", "concurrent")

Side = Literal["server", "client"]


@dataclass(frozen=True)
class ControlCapabilities:
    """What an implementation declares.

    ``request_types``: its own request types, each with a body that must
    succeed (under ``lmcache-mq`` the body's values are the positional
    arguments); ``head_of_line``: ``serial`` or ``concurrent``; ``wire``: the
    wire profile it speaks (:mod:`conformance.contracts.control.wire`);
    ``request_codes``: the code of each request type on a positional wire
    (lmcache-mq: an int, default the reference's table; lmcache-0.5: an
    operation name or a legacy int, default the type's name in lower case);
    ``results``: the type each declared request's
    success result has (``any``, ``map``, ``bool``, ``int``, ``str``,
    ``none``; default ``map`` under rep-envelope, ``any`` otherwise);
    ``added_handlers``: whether the handlers the suite passes to the server
    factory are served (LMCache's enum of request types is closed, so its
    adapters say false and the tests that need them are skipped).
    """

    request_types: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: {"PING": {}})
    head_of_line: str = "serial"
    wire: str = "rep-envelope"
    request_codes: Mapping[str, int | str] = field(default_factory=dict)
    results: Mapping[str, str] = field(default_factory=dict)
    added_handlers: bool = True
    #: Server and client take the CURVE keywords of :mod:`conformance.testing.credentials` (CTL-8).
    authentication: bool = False

    def codes(self, wire: str | None = None) -> dict[str, int | str]:
        """The identifier table of a positional wire: the profile's defaults for PING and
        the suite's types, then (on the declared wire only: declared codes are that
        wire's numbers) the declared codes; on lmcache-0.5 a declared type without a code
        is its name in lower case. ``wire`` other than the declared one is the
        preflight asking another profile in that profile's own terms."""
        from reference_impl.control.wire import LMCACHE_05, default_codes

        wire = wire or self.wire
        declared = self.request_codes if wire == self.wire else {}
        table: dict[str, int | str] = {**default_codes(wire), **declared}
        if wire == LMCACHE_05:
            for kind in self.request_types:
                table.setdefault(kind, kind.lower())
        return table

    def result_of(self, kind: str) -> str:
        default = "map" if self.wire == "rep-envelope" else "any"
        return self.results.get(kind, default)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, origin: str) -> ControlCapabilities:
        from conformance.contracts.control.wire import RESULT_TYPES, profile

        known = {"request_types", "head_of_line", "wire", "request_codes", "results",
                 "added_handlers", "authentication"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"{origin}: unknown capability {unknown[0]!r}; known: "
                              f"{', '.join(sorted(known))}")
        from reference_impl.control.wire import LMCACHE_05, PING_BODY_05

        wire = profile(str(values.get("wire", "rep-envelope")), origin=f"{origin}: wire").name
        types = values.get("request_types",
                           {"PING": dict(PING_BODY_05) if wire == LMCACHE_05 else {}})
        if not isinstance(types, Mapping) or not all(
            isinstance(k, str) and isinstance(v, Mapping) for k, v in types.items()
        ):
            raise ConfigError(f"{origin}: request_types must map each type (str) to a body "
                              "(a mapping), e.g. {'PING': {}}")
        hol = values.get("head_of_line", "serial")
        if hol not in HEAD_OF_LINE:
            raise ConfigError(f"{origin}: head_of_line must be one of {', '.join(HEAD_OF_LINE)},"
                              f" got {hol!r}")
        codes = values.get("request_codes", {})
        if not isinstance(codes, Mapping) or not all(
            isinstance(k, str) and isinstance(v, (int, str)) and not isinstance(v, bool)
            for k, v in codes.items()
        ):
            raise ConfigError(f"{origin}: request_codes must map each type (str) to its "
                              "code: an int (lmcache-mq, e.g. {'PING': 12}) or on lmcache-0.5 "
                              "an operation name or legacy int (e.g. {'PING': 'ping'})")
        names = sorted(k for k, v in codes.items() if isinstance(v, str))
        if names and wire != LMCACHE_05:
            raise ConfigError(f"{origin}: request_codes gives {names[0]!r} the operation name "
                              f"{codes[names[0]]!r}, which only wire=lmcache-0.5 carries "
                              f"(wire={wire} codes are ints)")
        results = values.get("results", {})
        if not isinstance(results, Mapping) or not all(
            isinstance(k, str) and v in RESULT_TYPES for k, v in results.items()
        ):
            raise ConfigError(f"{origin}: results must map request types to one of "
                              f"{', '.join(RESULT_TYPES)}")
        added = values.get("added_handlers", True)
        if not isinstance(added, bool):
            raise ConfigError(f"{origin}: added_handlers must be true or false")
        authentication = values.get("authentication", False)
        if not isinstance(authentication, bool):
            raise ConfigError(f"{origin}: authentication must be true or false")
        caps = cls(request_types=dict(types), head_of_line=hol, wire=wire,
                   request_codes=dict(codes), results=dict(results), added_handlers=added,
                   authentication=authentication)
        if wire == LMCACHE_05 and "PING" in caps.request_types:
            ping = caps.request_types["PING"]
            if len(ping) > 1:
                raise ConfigError(f"{origin}: under wire=lmcache-0.5 PING takes one argument, "
                                  "the worker's instance id or nil, e.g. request_types "
                                  "{'PING': {'instance_id': None}}")
            if not ping:  # LMCache 0.5's ping always carries one: nil, an untracked prober
                caps = dataclasses.replace(caps, request_types={
                    **caps.request_types, "PING": dict(PING_BODY_05)})
        if wire == "lmcache-mq":
            missing = sorted(set(caps.request_types) - set(caps.codes()))
            if missing:
                raise ConfigError(f"{origin}: request_codes has no lmcache-mq code for "
                                  f"{', '.join(missing)}")
        return caps


@dataclass(frozen=True)
class ControlSpec:
    """The implementation under test. ``server``/``client`` are ``None`` when not provided."""

    name: str
    server: Callable[..., Any] | None
    client: Callable[..., Any] | None
    capabilities: ControlCapabilities

    @property
    def profile(self) -> WireProfile:
        from conformance.contracts.control.wire import profile

        return profile(self.capabilities.wire)

    def require(self, side: Side, clause: str) -> Callable[..., Any]:
        """The factory of ``side``, or skip ``clause`` naming the missing side."""
        factory = self.server if side == "server" else self.client
        if factory is None:
            pytest.skip(f"{clause} is a {side} clause and {self.name} provides no {side} "
                        f"(attribute {side!r})")
        return factory

    def require_added_handlers(self, clause: str, why: str) -> None:
        """Skip ``clause`` when the server cannot serve the suite's own handlers."""
        if not self.capabilities.added_handlers:
            pytest.skip(f"{clause} needs {why}, and {self.name} serves no handlers added by "
                        "the suite (capability added_handlers=false)")

    def require_suite_types(self, clause: str) -> None:
        """Skip ``clause`` when the client under test cannot send the suite's own types."""
        if self.client is not None and not self.capabilities.added_handlers:
            pytest.skip(f"{clause} needs a client that sends the suite's own request types "
                        f"(ZMQC_ECHO with a nonce), and {self.name} declares "
                        "added_handlers=false")

    def server_or_reference(self) -> Callable[..., Any]:
        """The server under test, or the reference speaking the declared profile."""
        from reference_impl.control import ControlServer

        if self.server is not None:
            return self.server
        return functools.partial(ControlServer, wire=self.capabilities.wire,
                                 codes=self.capabilities.codes())

    def client_or_reference(self) -> Callable[..., Any]:
        """The client under test, or the reference speaking the declared profile."""
        from reference_impl.control import ControlClient

        if self.client is not None:
            return self.client
        return functools.partial(ControlClient, wire=self.capabilities.wire,
                                 codes=self.capabilities.codes())


def make_spec(factory: Any, *, name: str | None = None,
              overrides: Mapping[str, Any] | None = None,
              origin: str = "capabilities") -> ControlSpec:
    """Build a :class:`ControlSpec` from an implementation object (``server``/``client``
    factories), or from a zero-argument callable returning one; ``overrides`` (from
    ``--capability``) win over what the server factory declares."""
    label, _target, found = implementation_sides(factory, ("server", "client"), name=name)
    server, client = found["server"], found["client"]
    if server is None and client is None:
        raise ConfigError(f"{label}: the control contract needs an object with a 'server' "
                          f"and/or a 'client' factory, e.g. {DEFAULT_TARGET}")
    side = "server" if server is not None else "client"
    declared = getattr(server if server is not None else client, CAPABILITIES_ATTRIBUTE, None)
    if declared is not None and not isinstance(declared, Mapping):
        raise ConfigError(f"{CAPABILITIES_ATTRIBUTE} of {label}.{side} must be a mapping")
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

    return make_spec(load_factory(path, option=option, objects=True), name=path)
