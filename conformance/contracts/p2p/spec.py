"""What the suite knows about the transport under test.

A :class:`TransportSpec` bundles the user's factory with the
:class:`Capabilities` it declares. The suite never looks past the duck-typed
interface of ``DESIGN.md``: everything it may assume beyond it is a
capability, and a clause whose capability is not declared is *skipped with a
reason*, never silently passed.

Factories are named ``MODULE:ATTR`` (``mypkg.transport:MyTransport``). The
attribute may be a class or any callable ``factory(local_id, host, port)``;
it may additionally accept the keyword arguments ``heartbeat_ivl_ms``,
``heartbeat_timeout_ms`` and ``heartbeat_ttl_ms``, in which case the suite
passes its own short heartbeat values. Capabilities are declared by an
attribute ``zmq_conformance_capabilities`` on the factory (a
:class:`Capabilities` or a plain mapping of its fields), overridable by the
user's configuration.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from conformance.config.loading import load_factory
from conformance.errors import ConfigError

if TYPE_CHECKING:
    from conformance.testing.credentials import SuiteCredentials

#: Heartbeat values the suite passes to configurable transports: short enough
#: that the heartbeat clauses run in seconds, long enough that a loaded CI
#: machine does not trip them.
SUITE_HEARTBEAT_IVL_MS = 100
SUITE_HEARTBEAT_TIMEOUT_MS = 500
SUITE_HEARTBEAT_TTL_MS = 500
#: A host stall this long lets a correct transport declare a heartbeated connection dead:
#: the stall plus one interval plus 100 ms of slack (the meter is not the starved I/O
#: thread; the chaos machine's rule for an overrunning proxy) reaches the timeout. A test
#: that needs a connection to stay alive cannot judge across it
#: (:func:`conformance.supervision.host_stall.excused`).
HEARTBEAT_STALL_MS = SUITE_HEARTBEAT_TIMEOUT_MS - SUITE_HEARTBEAT_IVL_MS - 100
HEARTBEAT_STALL_WHY = ("heartbeat timeout - interval - 100 ms slack, after which a correct "
                       "transport may declare a starved connection dead")

HEARTBEAT_KWARGS = ("heartbeat_ivl_ms", "heartbeat_timeout_ms", "heartbeat_ttl_ms")

#: Where a factory may declare its capabilities.
CAPABILITIES_ATTRIBUTE = "zmq_conformance_capabilities"



@dataclass(frozen=True)
class Capabilities:
    """What a transport declares about itself beyond the interface.

    Attributes:
        max_message_bytes: the documented size limit of one encoded message
            (MSG-5). ``None``: no limit is declared and MSG-5 is skipped.
        heartbeat_configurable: the factory accepts the ``heartbeat_*_ms``
            keywords. Detected from the factory's signature when not declared.
        heartbeat_ivl_ms / heartbeat_timeout_ms: the fixed heartbeat values of
            a transport that cannot be configured; the heartbeat clauses are
            skipped when these are unknown.
        authentication: the transport authenticates peers (CURVE); enables
            SEC-2. Declaring it obliges the transport to reject strangers, and
            its factory to take the CURVE keywords of
            :mod:`conformance.testing.credentials` (the suite passes fresh keys).
        detects_peer_close_ms: the bound within which a closed peer is
            marked dead (POLL-5). Defaults to a generous 5 s.
    """

    max_message_bytes: int | None = None
    heartbeat_configurable: bool | None = None
    heartbeat_ivl_ms: int | None = None
    heartbeat_timeout_ms: int | None = None
    authentication: bool = False
    detects_peer_close_ms: int = 5000

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, origin: str) -> Capabilities:
        """Build from a mapping, rejecting unknown or mistyped fields by name."""
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ConfigError(
                f"{origin}: unknown capability {unknown[0]!r}; known: {', '.join(known)}"
            )
        checked: dict[str, Any] = {}
        for name, value in values.items():
            if name == "heartbeat_configurable" and value is None:
                pass  # "not declared": inferred from the factory's signature
            elif name in ("heartbeat_configurable", "authentication"):
                if not isinstance(value, bool):
                    raise ConfigError(f"{origin}: capability {name!r} must be true or false")
            elif value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"{origin}: capability {name!r} must be an integer")
            elif value is not None and value <= 0:
                raise ConfigError(f"{origin}: capability {name!r} must be positive")
            checked[name] = value
        return cls(**checked)

    def merged(self, overrides: Mapping[str, Any], *, origin: str) -> Capabilities:
        base = dataclasses.asdict(self)
        base.update(overrides)
        return Capabilities.from_mapping(base, origin=origin)


@dataclass(frozen=True)
class TransportSpec:
    """The transport under test: how to build one node, and what it declares."""

    name: str
    factory: Callable[..., Any]
    capabilities: Capabilities = field(default_factory=Capabilities)

    @property
    def heartbeat_configurable(self) -> bool:
        return bool(self.capabilities.heartbeat_configurable)

    @property
    def heartbeat_ivl_ms(self) -> int | None:
        if self.heartbeat_configurable:
            return SUITE_HEARTBEAT_IVL_MS
        return self.capabilities.heartbeat_ivl_ms

    @property
    def heartbeat_timeout_ms(self) -> int | None:
        if self.heartbeat_configurable:
            return SUITE_HEARTBEAT_TIMEOUT_MS
        return self.capabilities.heartbeat_timeout_ms

    def build(self, local_id: str, host: str, port: int,
              credentials: SuiteCredentials | None = None, /, **overrides: int) -> Any:
        """Build one node; configurable transports get the suite's heartbeats.

        ``overrides`` replaces individual heartbeat values (only meaningful
        for configurable transports). ``credentials`` turns CURVE on: the
        node gets the keyword arguments of :mod:`conformance.testing.credentials`
        (only for a transport that declares ``authentication``).
        """
        keys: dict[str, Any] = {}
        if credentials is not None:
            if not self.capabilities.authentication:
                raise ConfigError(f"{self.name}: credentials given to a transport that does not "
                                  "declare authentication")
            keys = credentials.node_kwargs()
        if not self.heartbeat_configurable:
            return self.factory(local_id, host, port, **keys)
        heartbeats = {
            "heartbeat_ivl_ms": SUITE_HEARTBEAT_IVL_MS,
            "heartbeat_timeout_ms": SUITE_HEARTBEAT_TIMEOUT_MS,
            "heartbeat_ttl_ms": SUITE_HEARTBEAT_TTL_MS,
        }
        heartbeats.update(overrides)
        return self.factory(local_id, host, port, **heartbeats, **keys)


def accepts_heartbeat_kwargs(factory: Callable[..., Any]) -> bool:
    """True when ``factory`` takes all three ``heartbeat_*_ms`` keywords."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return True
    return all(name in params for name in HEARTBEAT_KWARGS)


def make_spec(
    factory: Callable[..., Any],
    *,
    name: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    origin: str = "capabilities",
) -> TransportSpec:
    """Build a :class:`TransportSpec`: declared capabilities, then user overrides.

    ``heartbeat_configurable`` is inferred from the factory's signature when
    neither the factory nor the user declares it.
    """
    declared: Any = getattr(factory, CAPABILITIES_ATTRIBUTE, None)
    if declared is None:
        caps = Capabilities()
    elif isinstance(declared, Capabilities):
        caps = declared
    elif isinstance(declared, Mapping):
        caps = Capabilities.from_mapping(declared, origin=f"{CAPABILITIES_ATTRIBUTE} of {name}")
    else:
        raise ConfigError(
            f"{CAPABILITIES_ATTRIBUTE} of {name} must be a Capabilities or a mapping, "
            f"not {type(declared).__name__}"
        )
    if overrides:
        caps = caps.merged(overrides, origin=origin)
    if caps.heartbeat_configurable is None:
        caps = dataclasses.replace(caps, heartbeat_configurable=accepts_heartbeat_kwargs(factory))
    label = name or f"{getattr(factory, '__module__', '?')}:{getattr(factory, '__qualname__', '?')}"
    return TransportSpec(name=label, factory=factory, capabilities=caps)


def spec_from_path(path: str, *, overrides: Mapping[str, Any] | None = None,
                   option: str = "--zmq-transport") -> TransportSpec:
    """Load ``MODULE:ATTR`` and build its spec."""
    return make_spec(load_factory(path, option=option), name=path, overrides=overrides)
