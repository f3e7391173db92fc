"""What the KV-event suites know about the implementation under test.

Both KV contracts take a factory ``factory(endpoint, replay_endpoint, *,
topic)``; what else the suite may assume is a *capability*, declared by the
attribute ``zmq_conformance_capabilities`` on the factory (a mapping) and
overridable with ``--capability NAME=VALUE``. A clause whose capability is
not declared is skipped with the reason, never passed.

Keyword arguments the factory accepts are detected from its signature, and
the suite passes its own values to make the clauses fast: ``buffer_steps``
(a short retention, so EVT-4 reaches past it; a long one for EVT-5),
``max_queue`` (a small queue, so EVT-3 fills it; only in that test),
``shutdown_timeout_ms`` (EVT-7's bound), ``replay_stall_timeout_ms`` and
``data_parallel_rank`` (EVT-8), and the declared wire profile as
``replay_layout`` and ``encoding`` (so a reference that speaks several
profiles speaks the declared one).

Wire profiles (:mod:`reference_impl.kv_events.wire`) are three
capabilities: ``wire`` (the replay layout, ``seq-payload`` by default or
``topic-seq-payload``; a subscriber may also declare ``both``, its
default), ``encoding`` (``map``, ``array`` or ``array-map``) and ``schema``
(``base`` or a ``vllm-X.Y`` version).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, cast

from conformance.config.loading import accepts, takes
from conformance.errors import ConfigError
from reference_impl.kv_events.wire import (
    ENCODINGS,
    REPLAY_LAYOUTS,
    SCHEMAS,
    ReplayLayout,
    WireEncoding,
    WireProfile,
)

__all__ = [
    "CAPABILITIES_ATTRIBUTE",
    "PublisherCapabilities",
    "PublisherSpec",
    "SubscriberCapabilities",
    "accepts",
    "make_spec",
    "make_subscriber_spec",
]

CAPABILITIES_ATTRIBUTE: Final = "zmq_conformance_capabilities"
#: What a subscriber may declare as ``wire``: a layout it reads, or both (the default).
SUBSCRIBER_WIRES: Final[tuple[str, ...]] = ("both", *REPLAY_LAYOUTS)
_CHOICES: Final[dict[str, tuple[str, ...]]] = {
    "encoding": ENCODINGS,
    "schema": tuple(SCHEMAS),
}

#: Retention the suite asks of a publisher that takes ``buffer_steps``.
SUITE_BUFFER_STEPS: Final = 64
#: Shutdown bound the suite asks of a publisher that takes ``shutdown_timeout_ms``.
SUITE_SHUTDOWN_TIMEOUT_MS: Final = 1000
#: Stall bound for replays the suite asks of a publisher that takes it.
SUITE_REPLAY_STALL_TIMEOUT_MS: Final = 1000


def _check(cls: type[Any], values: Mapping[str, Any], origin: str) -> dict[str, Any]:
    """Reject unknown or mistyped fields of capability dataclass ``cls`` by name."""
    choices = dict(_CHOICES, wire=getattr(cls, "WIRES", REPLAY_LAYOUTS))
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(
            f"{origin}: unknown capability {unknown[0]!r}; known: {', '.join(fields)}"
        )
    checked: dict[str, Any] = {}
    for name, value in values.items():
        kind = str(fields[name].type)
        if value is None:
            pass
        elif kind.startswith("bool"):
            if not isinstance(value, bool):
                raise ConfigError(f"{origin}: capability {name!r} must be true or false")
        elif kind.startswith("int"):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{origin}: capability {name!r} must be a positive integer")
        elif name in choices and value not in choices[name]:
            raise ConfigError(
                f"{origin}: capability {name!r} must be one of {', '.join(choices[name])}, "
                f"not {value!r}"
            )
        checked[name] = value
    return checked


@dataclass(frozen=True)
class PublisherCapabilities:
    """What a KV-event publisher declares beyond ``publish()`` and ``shutdown()``.

    Attributes:
        encoding: ``map``, ``array`` (vLLM 0.9 to 0.23) or ``array-map``
            (vLLM 0.24 and later) payloads. A publisher none of whose
            batches decodes under it is reported as a profile mismatch.
        wire: the replay layout, ``seq-payload`` (vLLM before 0.26) or
            ``topic-seq-payload`` (vLLM 0.26 and later); EVT-9 checks it.
        schema: the schema version (``base``, ``vllm-0.9`` ... ``vllm-0.33``);
            EVT-9 checks every batch has exactly its fields.
        buffer_steps: how many batches it retains for replay. Needed for the
            retention edge of EVT-4 unless the factory takes ``buffer_steps``
            (the suite then passes its own). ``None``: that part is skipped and
            the other replay tests assume it retains every batch they publish
            (at most a few hundred).
        data_parallel: the factory takes ``data_parallel_rank`` and derives
            the rank's endpoints from the configured ones; the object then
            exposes the endpoints it bound as ``endpoint`` and
            ``replay_endpoint``. Detected from the signature when not declared;
            EVT-8 is skipped without it.
        heartbeat_configurable: accepted for symmetry with the other contracts
            (the publisher clauses inject no faults).
        shutdown_timeout_ms: the bound EVT-7 allows ``shutdown()`` (the suite
            passes its own when the factory takes ``shutdown_timeout_ms``);
            default 5000 ms.
        authentication: the factory takes the CURVE server keywords of
            :mod:`conformance.testing.credentials` and lets in no other client (EVT-10).
    """

    WIRES: ClassVar[tuple[str, ...]] = REPLAY_LAYOUTS

    encoding: str = "map"
    wire: str = "seq-payload"
    schema: str = "base"
    buffer_steps: int | None = None
    data_parallel: bool | None = None
    heartbeat_configurable: bool | None = None
    shutdown_timeout_ms: int | None = None
    authentication: bool | None = None

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, origin: str) -> PublisherCapabilities:
        return cls(**_check(cls, values, origin))


@dataclass(frozen=True)
class SubscriberCapabilities:
    """What a KV-event consumer declares (see :mod:`.subscriber.peer`): its
    ``encoding`` and ``schema`` (what the suite's publisher sends it), and the
    replay layout it reads (``wire``: ``both``, the default, or one of them)."""

    WIRES: ClassVar[tuple[str, ...]] = SUBSCRIBER_WIRES

    encoding: str = "map"
    wire: str = "both"
    schema: str = "base"
    replay_timeout_ms: int | None = None
    heartbeat_configurable: bool | None = None
    #: The factory takes the CURVE client keywords and refuses other publishers (EVS-10).
    authentication: bool | None = None

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, origin: str) -> SubscriberCapabilities:
        return cls(**_check(cls, values, origin))


@dataclass(frozen=True)
class PublisherSpec:
    """The publisher under test: its factory and what it declares."""

    name: str
    factory: Callable[..., Any]
    capabilities: PublisherCapabilities = field(default_factory=PublisherCapabilities)

    @property
    def encoding(self) -> WireEncoding:
        return cast(WireEncoding, self.capabilities.encoding)

    @property
    def profile(self) -> WireProfile:
        """The declared wire profile (replay layout, encoding, schema version)."""
        caps = self.capabilities
        return WireProfile(cast(ReplayLayout, caps.wire), self.encoding, caps.schema)

    @property
    def buffer_steps(self) -> int | None:
        """The retention in force when the suite builds the publisher (``None``: unknown)."""
        if accepts(self.factory, "buffer_steps"):
            return SUITE_BUFFER_STEPS
        return self.capabilities.buffer_steps

    @property
    def data_parallel(self) -> bool:
        return bool(self.capabilities.data_parallel)

    @property
    def shutdown_timeout_ms(self) -> int:
        if accepts(self.factory, "shutdown_timeout_ms"):
            return SUITE_SHUTDOWN_TIMEOUT_MS
        return self.capabilities.shutdown_timeout_ms or 5000

    def build(self, endpoint: str, replay_endpoint: str, *, topic: str,
              rank: int | None = None, **overrides: Any) -> Any:
        """Build one publisher with the suite's short settings where the factory takes them.

        ``overrides`` replaces individual settings (only those the factory takes).
        """
        kwargs: dict[str, Any] = {}
        for name, value in (
            ("buffer_steps", SUITE_BUFFER_STEPS),
            ("shutdown_timeout_ms", SUITE_SHUTDOWN_TIMEOUT_MS),
            ("replay_stall_timeout_ms", SUITE_REPLAY_STALL_TIMEOUT_MS),
        ):
            if accepts(self.factory, name):
                kwargs[name] = value
        for keyword, declared in (("replay_layout", self.capabilities.wire),
                                  ("encoding", self.capabilities.encoding)):
            if takes(self.factory, keyword):
                kwargs[keyword] = declared
        kwargs.update({k: v for k, v in overrides.items() if accepts(self.factory, k)})
        if rank is not None:
            kwargs["data_parallel_rank"] = rank
        return self.factory(endpoint, replay_endpoint, topic=topic, **kwargs)


def _declared(factory: Callable[..., Any], name: str) -> Mapping[str, Any]:
    declared: Any = getattr(factory, CAPABILITIES_ATTRIBUTE, None)
    if declared is None:
        return {}
    if dataclasses.is_dataclass(declared) and not isinstance(declared, type):
        return dataclasses.asdict(declared)
    if isinstance(declared, Mapping):
        return declared
    raise ConfigError(
        f"{CAPABILITIES_ATTRIBUTE} of {name} must be a mapping, not {type(declared).__name__}"
    )


def _label(factory: Callable[..., Any], name: str | None) -> str:
    return name or f"{getattr(factory, '__module__', '?')}:{getattr(factory, '__qualname__', '?')}"


def make_spec(
    factory: Callable[..., Any],
    *,
    name: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    origin: str = "capabilities",
) -> PublisherSpec:
    """A :class:`PublisherSpec`: declared capabilities, then the user's overrides."""
    label = _label(factory, name)
    values = dict(_declared(factory, label))
    caps = PublisherCapabilities.from_mapping(values, origin=f"{CAPABILITIES_ATTRIBUTE} of {label}")
    if overrides:
        values.update(overrides)
        caps = PublisherCapabilities.from_mapping(values, origin=origin)
    if caps.data_parallel is None:
        caps = dataclasses.replace(caps, data_parallel=accepts(factory, "data_parallel_rank"))
    return PublisherSpec(name=label, factory=factory, capabilities=caps)


def make_subscriber_spec(
    factory: Callable[..., Any],
    *,
    name: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    origin: str = "capabilities",
) -> Any:
    """The subscriber suite's spec (:class:`.subscriber.peer.SubscriberSpec`)."""
    from conformance.contracts.kv_events.subscriber.peer import SubscriberSpec

    label = _label(factory, name)
    values = dict(_declared(factory, label))
    SubscriberCapabilities.from_mapping(values, origin=f"{CAPABILITIES_ATTRIBUTE} of {label}")
    values.update(overrides or {})
    SubscriberCapabilities.from_mapping(values, origin=origin)
    return SubscriberSpec(label, factory, values)
