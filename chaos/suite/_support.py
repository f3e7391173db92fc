"""Shared pieces of the chaos clause tests: heartbeat values, bounds, observation.

Bounds (DESIGN.md, "Bounds"): detection is measured from the moment a fault
is in place; a heartbeat already in flight can make it up to one interval
early, so the window is ``[timeout - interval, timeout + interval + slack]``.
The slack is :data:`SLACK_MS` plus the observation granularity (the longest
gap between two observation rounds, each of which polls every node once):
a loaded 2-core CI machine delays libzmq's timers, the monitor event and
the ``poll()`` that reads it.

Recovery after a heal is bounded by the reconnect interval plus the
handshake timeout. The suite cannot read a transport's reconnect settings
through the interface, so it uses the reference transport's documented
values (:data:`RECONNECT_IVL_MAX_MS`, :data:`HANDSHAKE_IVL_MS`) plus the
slack; a transport that recovers more slowly than the reference's settings
allow fails with the measured time in the message.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from conformance.harness import Connection, Node
from conformance.spec import TransportSpec

__all__ = [
    "HANDSHAKE_IVL_MS",
    "RECONNECT_IVL_MAX_MS",
    "SLACK_MS",
    "Deaths",
    "Heartbeat",
    "Mailbox",
    "heartbeat_for",
    "watch_deaths",
]

#: Scheduling slack on top of the detection window (see the module docstring).
SLACK_MS = 250
#: The reference transport's reconnect backoff ceiling and handshake limit.
RECONNECT_IVL_MAX_MS = 1000
HANDSHAKE_IVL_MS = 3000
#: Pause between observation rounds: the only sleep in these tests.
_ROUND_PAUSE_S = 0.001


@dataclass(frozen=True)
class Heartbeat:
    """The heartbeat values in force for the transport under test."""

    ivl_ms: int
    timeout_ms: int
    configured: bool

    @property
    def earliest_ms(self) -> int:
        """Earliest correct detection after a fault: ``timeout - interval``."""
        return max(self.timeout_ms - self.ivl_ms, 0)

    def latest_ms(self, granularity_ms: float = 0.0) -> float:
        """Latest correct detection: ``timeout + interval + slack + granularity``."""
        return self.timeout_ms + self.ivl_ms + SLACK_MS + granularity_ms

    @property
    def recovery_bound_ms(self) -> int:
        """Bound on recovery after a heal (reconnect interval + handshake + slack)."""
        return RECONNECT_IVL_MAX_MS + HANDSHAKE_IVL_MS + SLACK_MS

    def describe(self) -> str:
        origin = "suite values" if self.configured else "declared by the transport"
        return f"interval {self.ivl_ms} ms, timeout {self.timeout_ms} ms ({origin})"


def heartbeat_for(spec: TransportSpec, clause: str) -> Heartbeat:
    """The heartbeat values for ``spec``, or skip ``clause`` naming the missing capability.

    Configurable transports get the suite's short values; others must declare
    ``heartbeat_ivl_ms`` and ``heartbeat_timeout_ms``.
    """
    ivl, timeout = spec.heartbeat_ivl_ms, spec.heartbeat_timeout_ms
    if ivl is None or timeout is None:
        missing = [name for name, value in
                   (("heartbeat_ivl_ms", ivl), ("heartbeat_timeout_ms", timeout))
                   if value is None]
        pytest.skip(
            f"{clause}: the transport is not heartbeat_configurable and does not declare "
            f"{' and '.join(missing)} (capabilities: heartbeat_configurable, heartbeat_ivl_ms, "
            "heartbeat_timeout_ms)"
        )
    return Heartbeat(ivl_ms=ivl, timeout_ms=timeout, configured=spec.heartbeat_configurable)


@dataclass
class Deaths:
    """When each watched connection was first seen dead (``time.monotonic()``)."""

    at: dict[str, float] = field(default_factory=dict)
    #: Longest gap between two observation rounds, in milliseconds.
    granularity_ms: float = 0.0
    #: Rounds in which every watched connection was seen alive.
    alive_rounds: int = 0

    def after(self, origin: float) -> dict[str, float]:
        """Death times in milliseconds after ``origin``."""
        return {side: (t - origin) * 1000 for side, t in self.at.items()}


def watch_deaths(
    conns: Mapping[str, Connection],
    *,
    nodes: Iterable[Node],
    until: float,
    stop_when_all_dead: bool = True,
    on_round: Callable[[], object] | None = None,
    done: Callable[[], bool] | None = None,
) -> Deaths:
    """Poll ``nodes`` round after round and note when each connection turns dead.

    Observation: one round polls every open node once, then reads ``alive``
    of every watched connection; the time of the first round that sees a
    connection dead is its detection time. Stops at ``until``
    (``time.monotonic()``) or, with ``stop_when_all_dead``, once all are dead.
    ``on_round()`` (if given) runs once per round, e.g. to keep traffic going;
    ``done()`` (if given) ends the observation early when it returns True.
    """
    node_list = list(nodes)
    deaths = Deaths()
    last = time.monotonic()
    while True:
        for node in node_list:
            if not node.closed:
                node.poll()
        now = time.monotonic()
        deaths.granularity_ms = max(deaths.granularity_ms, (now - last) * 1000)
        last = now
        all_alive = True
        for side, conn in conns.items():
            if side not in deaths.at and not conn.alive:
                deaths.at[side] = now
            if side in deaths.at:
                all_alive = False
        if all_alive:
            deaths.alive_rounds += 1
        if stop_when_all_dead and len(deaths.at) == len(conns):
            return deaths
        if now >= until:
            return deaths
        if on_round is not None:
            on_round()
        if done is not None and done():
            return deaths
        time.sleep(_ROUND_PAUSE_S)


class Mailbox:
    """Everything one node received from one peer, over all its connections to it.

    A node may hold several connection objects for a peer over time (an
    outbound one, the inbound ones ``poll()`` returned after reconnects);
    messages from the peer may land in any of them. :meth:`collect` drains
    every known one (CONN-4: a dead connection's buffered messages stay
    readable) and keeps the messages in arrival order per connection.
    """

    def __init__(self, node: Node, peer_id: str) -> None:
        self.node = node
        self.peer_id = peer_id
        self.messages: list[dict[str, Any]] = []
        self._conns: list[Connection] = []

    def track(self, conn: Connection) -> None:
        if all(c is not conn for c in self._conns):
            self._conns.append(conn)

    def collect(self) -> list[dict[str, Any]]:
        """Pick up new inbound connections from the peer, drain all; return what is new."""
        for conn in self.node.inbound:
            if conn.peer_id == self.peer_id:
                self.track(conn)
        new: list[dict[str, Any]] = []
        for conn in self._conns:
            new.extend(conn.recv())
        self.messages.extend(new)
        return new

    def values(self, key: str) -> list[Any]:
        """``msg[key]`` of every collected message that has ``key``, in order."""
        return [m[key] for m in self.messages if key in m]
