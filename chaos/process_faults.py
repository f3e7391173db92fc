"""Process faults on a PID: what was done to a process, when, and for how long.

A :class:`ProcessFault` records, like the proxy faults of a family's chaos
topology, when a fault was asked for (``started_at``) and when it was in
place (``in_place_at``: the process is stopped, or gone), in
``time.monotonic()`` seconds; :func:`draw_pause_ms` draws a pause length.
A family that runs its implementation in a process of its own (p2p:
:mod:`conformance.contracts.p2p.process_faults`) makes the faults and
records them here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["ProcessFault", "ProcessFaultKind", "draw_pause_ms"]

ProcessFaultKind = Literal["pause", "kill"]


@dataclass
class ProcessFault:
    """One process fault on one node (times are ``time.monotonic()`` seconds)."""

    kind: ProcessFaultKind
    node: str
    pid: int
    started_at: float
    in_place_at: float
    ended_at: float | None = None
    #: For a pause: how long it was meant to last (``None``: until resumed).
    planned_ms: float | None = None
    notes: dict[str, float] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.ended_at is None

    @property
    def duration_ms(self) -> float | None:
        if self.ended_at is None:
            return None
        return (self.ended_at - self.in_place_at) * 1000

    def describe(self) -> str:
        planned = f" for {self.planned_ms:.0f} ms" if self.planned_ms is not None else ""
        return f"{self.kind}{planned} of {self.node} (pid {self.pid})"


def draw_pause_ms(rng: random.Random, low_ms: float, high_ms: float) -> float:
    """A pause length drawn uniformly from ``[low_ms, high_ms]``."""
    if not 0 <= low_ms <= high_ms:
        raise ValueError(f"pause range [{low_ms}, {high_ms}] ms is empty or negative")
    return rng.uniform(low_ms, high_ms)
