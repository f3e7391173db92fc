"""Faults on a p2p chaos topology (:class:`~conformance.contracts.p2p.topology.ChaosCluster`):
put in place, timed, always healed.

Each helper puts one kind of fault on the proxies of the given nodes, on
*both* streams of each proxy, and returns a :class:`Fault` recording when
it was in place. With the proxies of two nodes given, every connection
between them is affected whatever the transport's TCP layout (see
:mod:`conformance.contracts.p2p.topology`); with one node given, everything addressed to that
node is.

Timing: ``started_at`` is taken just before the first API call and
``in_place_at`` just after the last one returned, both on
``time.monotonic()``. Detection bounds measure from ``in_place_at`` (the
fault is complete) and lower bounds from ``started_at`` (part of it may
already act), so the few milliseconds the API calls take never make a
correct transport fail.

Every fault is remembered until :meth:`Faults.heal` removes it;
:meth:`Faults.heal_all` (called by ``ChaosCluster.close``) heals whatever is
left, so a fault never leaks out of the test that made it.

What the toxics do (toxiproxy 2.x semantics, the embedded server follows
them): ``timeout`` with ``timeout=0`` lets no byte through and never closes
(a silent partition); removing it closes the connections it held, as a real
partition that heals leaves broken TCP streams behind. ``reset_peer`` cuts
a connection as soon as data flows: with a TCP RST when the connection was
opened while the toxic existed (toxiproxy sets SO_LINGER 0 when a
connection starts), with a plain close when it is older. A disabled proxy closes its
connections and refuses new ones. ``latency``, ``slicer`` and ``bandwidth``
delay, fragment and throttle without losing bytes; ``slow_close`` with a
long delay (:meth:`Faults.hold_close`) holds a close back.

Heals take toxics off a proxy only from the end of its chain, so that any
heal order is safe on toxiproxy-server 2.12.0 (see :meth:`Faults.heal`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from chaos.proxy import Proxy, StreamName, ToxicType, ToxiproxyError
from conformance.contracts.p2p.harness import Node

__all__ = ["DESTRUCTIVE", "Fault", "FaultKind", "Faults", "ProxiedNodes"]

FaultKind = Literal[
    "partition", "latency", "reset", "slice", "bandwidth", "disable", "hold_close"
]

#: Faults that break connections (bytes lost, streams closed or reset).
#: The others only delay, fragment or throttle.
DESTRUCTIVE: frozenset[FaultKind] = frozenset({"partition", "reset", "disable"})

_STREAMS: tuple[StreamName, ...] = ("upstream", "downstream")
#: How long a partition holds back a close: far longer than any test runs.
_HOLD_CLOSE_MS = 600_000
_serial = itertools.count(1)


class ProxiedNodes(Protocol):
    """What :class:`Faults` needs of its topology: the proxy in front of a node.

    :class:`~conformance.contracts.p2p.topology.ChaosCluster` is one; naming
    the protocol instead of the class keeps this module from importing the
    topology, which imports this module.
    """

    def proxy(self, node: Node) -> Proxy: ...


@dataclass
class Fault:
    """One fault in place on some proxies (see the module docstring for the times)."""

    kind: FaultKind
    nodes: tuple[str, ...]
    started_at: float
    in_place_at: float = 0.0
    healed_at: float | None = None
    toxics: list[tuple[Proxy, str]] = field(default_factory=list)
    disabled: list[Proxy] = field(default_factory=list)
    attributes: dict[str, int] = field(default_factory=dict)

    @property
    def destructive(self) -> bool:
        return self.kind in DESTRUCTIVE

    @property
    def active(self) -> bool:
        return self.healed_at is None

    def describe(self) -> str:
        attrs = ", ".join(f"{k}={v}" for k, v in self.attributes.items())
        on = "+".join(self.nodes)
        return f"{self.kind}({attrs}) on {on}" if attrs else f"{self.kind} on {on}"

    def __repr__(self) -> str:
        state = "active" if self.active else "healed"
        return f"<Fault {self.describe()} {state}>"


@dataclass(eq=False)
class _Placed:
    """One toxic on a proxy, as added (to add it again), and whether its fault was healed."""

    fault: Fault
    name: str
    type: ToxicType
    stream: StreamName
    attributes: dict[str, int]
    released: bool = False


class Faults:
    """Makes and heals faults on one chaos cluster's proxies."""

    def __init__(self, cluster: ProxiedNodes) -> None:
        self._cluster = cluster
        self.active: list[Fault] = []
        self.history: list[Fault] = []
        #: Every toxic still on a proxy, by proxy name, in the order added
        #: (toxiproxy's chain order), healed or not (see :meth:`heal`).
        self._placed: dict[str, list[_Placed]] = {}

    # -- making faults ------------------------------------------------------

    def partition(self, *nodes: Node) -> Fault:
        """A silent partition: no byte in either direction, connections stay open.

        A ``timeout`` toxic (``timeout=0``) swallows the data; a ``slow_close``
        toxic with a delay far beyond any test holds back a close, so a node
        that closes behind the partition leaves its peer's end half-open, as
        a cut cable would (a proxy that passed the FIN on would tell the peer).
        Healing removes both; the ``timeout`` toxic's removal closes the
        connections it held.
        """
        fault = self._toxic("partition", nodes, "timeout", {"timeout": 0})
        self._add_toxics(fault, nodes, "slow_close", {"delay": _HOLD_CLOSE_MS}, "hold")
        fault.in_place_at = time.monotonic()
        return fault

    def latency(self, *nodes: Node, latency_ms: int, jitter_ms: int = 0) -> Fault:
        """Delay every byte by ``latency_ms`` +- ``jitter_ms`` (per proxy and direction)."""
        return self._toxic("latency", nodes, "latency",
                           {"latency": latency_ms, "jitter": jitter_ms})

    def reset(self, *nodes: Node, after_ms: int = 0) -> Fault:
        """Cut every connection ``after_ms`` after data flows on it (a TCP RST on
        connections opened while the fault lasts, a close on older ones)."""
        return self._toxic("reset", nodes, "reset_peer", {"timeout": after_ms})

    def slice(
        self, *nodes: Node, average_size: int, size_variation: int = 0, delay_us: int = 0
    ) -> Fault:
        """Cut the stream into ``average_size`` +- ``size_variation`` byte writes."""
        return self._toxic("slice", nodes, "slicer", {
            "average_size": average_size, "size_variation": size_variation, "delay": delay_us,
        })

    def bandwidth(self, *nodes: Node, rate_kbps: int) -> Fault:
        """Throttle every direction to ``rate_kbps`` KB/s (1 KB = 1000 bytes)."""
        return self._toxic("bandwidth", nodes, "bandwidth", {"rate": rate_kbps})

    def hold_close(self, *nodes: Node) -> Fault:
        """Hold back every close (FIN) while data still flows.

        A node that closes (or restarts) then leaves the far end of its old
        connections half-open, as a crashed host does, until the far end
        writes to it (and gets a reset) or its heartbeat expires.
        """
        return self._toxic("hold_close", nodes, "slow_close", {"delay": _HOLD_CLOSE_MS})

    def disable(self, *nodes: Node) -> Fault:
        """Disable the proxies: live connections are closed, new ones refused."""
        fault = Fault("disable", _names(nodes), started_at=time.monotonic())
        self._register(fault)
        for proxy in self._proxies(nodes):
            proxy.disable()
            fault.disabled.append(proxy)
        fault.in_place_at = time.monotonic()
        return fault

    # -- healing ------------------------------------------------------------

    def heal(self, fault: Fault) -> float:
        """Remove ``fault`` (idempotent); returns the ``time.monotonic()`` it was healed.

        Every toxic and proxy of the fault is attempted even if one call
        fails; the first error is raised afterwards.

        Toxics only ever leave a proxy from the end of its chain, newest
        first, because toxiproxy-server 2.12.0 crashes otherwise: a toxic
        removed from in front of one whose stub is still busy (a close held
        by ``slow_close``, data held by ``latency`` or ``slicer``) while the
        connection closes leaves that link's stubs out of step with the
        chain, and its next ``AddToxic`` on the proxy panics (docs/chaos.md,
        "toxiproxy-server 2.12.0's AddToxic panic"). So to take out a toxic
        with newer ones behind it:

        - newer toxics of faults still in place are taken out with it and
          put back at once, in their order (the fault lapses for the few
          milliseconds of those API calls: a latency, slicer or reset that
          lets some bytes through undelayed, whole or uncut, which no clause
          forbids);
        - except when one of them belongs to a partition still in place:
          then the healed toxic stays until that partition is healed (it
          acts only on what the partition's ``timeout`` drops, and a close
          it passes on is held by the partition's ``slow_close`` either way;
          a ``reset_peer`` kept so gives connections opened meanwhile
          SO_LINGER 0, so the partition's heal resets rather than closes
          them, and they are fault-touched connections either way).
        """
        if fault.healed_at is not None:
            return fault.healed_at
        errors: list[ToxiproxyError] = []
        for placed in self._placed.values():
            for entry in placed:
                if entry.fault is fault:
                    entry.released = True
        # The newest proxy first, as the toxics were added.
        for proxy in reversed(dict.fromkeys(proxy for proxy, _ in fault.toxics)):
            self._unwind(proxy, errors)
        for proxy in fault.disabled:
            try:
                proxy.enable()
            except ToxiproxyError as exc:
                errors.append(exc)
        fault.healed_at = time.monotonic()
        if fault in self.active:
            self.active.remove(fault)
        if errors:
            raise errors[0]
        return fault.healed_at

    def heal_all(self) -> float | None:
        """Heal every active fault, newest first; the time of the last heal, or None."""
        healed: float | None = None
        errors: list[ToxiproxyError] = []
        for fault in reversed(list(self.active)):
            try:
                healed = self.heal(fault)
            except ToxiproxyError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]
        return healed

    def affecting(self, node: Node) -> list[Fault]:
        """The active faults on ``node``'s proxy."""
        return [f for f in self.active if node.name in f.nodes]

    # -- internals ----------------------------------------------------------

    def _toxic(
        self, kind: FaultKind, nodes: Iterable[Node], toxic: ToxicType, attributes: dict[str, int]
    ) -> Fault:
        node_list = list(nodes)
        fault = Fault(kind, _names(node_list), started_at=time.monotonic(),
                      attributes=dict(attributes))
        self._register(fault)
        self._add_toxics(fault, node_list, toxic, attributes, kind)
        fault.in_place_at = time.monotonic()
        return fault

    def _add_toxics(
        self,
        fault: Fault,
        nodes: Iterable[Node],
        toxic: ToxicType,
        attributes: dict[str, int],
        stem: str,
    ) -> None:
        number = next(_serial)
        for proxy in self._proxies(nodes):
            for stream in _STREAMS:
                name = f"{stem}_{stream}_{number}"
                proxy.add_toxic(toxic, stream=stream, name=name, **attributes)
                fault.toxics.append((proxy, name))
                self._placed.setdefault(proxy.name, []).append(
                    _Placed(fault, name, toxic, stream, dict(attributes)))

    def _unwind(self, proxy: Proxy, errors: list[ToxiproxyError]) -> None:
        """Take the healed toxics off ``proxy`` from the end of its chain (see :meth:`heal`).

        The toxics from the oldest healed one that may go now (none in front of a
        partition still in place) to the end are removed newest first; those of
        faults still in place among them are added again, oldest first.
        """
        placed = self._placed.get(proxy.name, [])
        shield = max((i for i, entry in enumerate(placed)
                      if entry.fault.kind == "partition" and not entry.released), default=-1)
        going = [i for i, entry in enumerate(placed) if i > shield and entry.released]
        if not going:
            return
        first = going[0]
        taken = placed[first:]
        for entry in reversed(taken):
            try:
                proxy.remove_toxic(entry.name)
            except ToxiproxyError as exc:
                errors.append(exc)
        kept = [entry for entry in taken if not entry.released]
        self._placed[proxy.name] = placed[:first] + kept
        for entry in kept:
            try:
                proxy.add_toxic(entry.type, stream=entry.stream, name=entry.name,
                                **entry.attributes)
            except ToxiproxyError as exc:
                errors.append(exc)

    def _register(self, fault: Fault) -> None:
        # Registered before the first API call, so a call failing half-way
        # still leaves the fault to heal_all().
        if not fault.nodes:
            raise ValueError(f"a {fault.kind} fault needs at least one node")
        self.active.append(fault)
        self.history.append(fault)

    def _proxies(self, nodes: Iterable[Node]) -> list[Proxy]:
        return [self._cluster.proxy(node) for node in nodes]


def _names(nodes: Iterable[Node]) -> tuple[str, ...]:
    return tuple(node.name for node in nodes)
