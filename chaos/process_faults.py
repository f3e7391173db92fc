"""Process faults: pause (SIGSTOP), resume (SIGCONT), kill (SIGKILL) and restart.

The faults a proxy cannot make. A paused node's kernel keeps its TCP
connections open and ACKs what arrives, so only an application-level (ZMTP)
heartbeat can tell it from a slow one; a killed node's kernel closes its
connections at once. Both need the node in its own process: see
:mod:`conformance.process_nodes`.

:class:`ProcessCluster` builds *observer* nodes in the test process and
*target* nodes in their own processes from the same transport spec, so the
observers measure detection with nothing but their own ``poll()`` in the
loop. :class:`ProcessFaults` makes and undoes the faults on targets and
records, like the proxy faults of :mod:`chaos.faults`, when each was asked
for (``started_at``) and when it was in place (``in_place_at``: the process
is stopped, or gone), in ``time.monotonic()`` seconds.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Literal

from conformance.harness import HOST, Cluster, Node
from conformance.process_nodes import ProcessTransport, is_process_spec, process_spec
from conformance.spec import TransportSpec

__all__ = ["ProcessCluster", "ProcessFault", "ProcessFaults", "draw_pause_ms"]

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


class ProcessFaults:
    """Makes and ends process faults on the target nodes of one :class:`ProcessCluster`."""

    def __init__(self, cluster: ProcessCluster) -> None:
        self._cluster = cluster
        self.history: list[ProcessFault] = []

    def pause(self, node: Node, *, planned_ms: float | None = None) -> ProcessFault:
        """SIGSTOP ``node``'s process; ``in_place_at`` is when the kernel reports it stopped."""
        transport = _process_transport(node)
        started = time.monotonic()
        in_place = transport.pause()
        fault = ProcessFault("pause", node.name, transport.pid, started, in_place,
                             planned_ms=planned_ms)
        self.history.append(fault)
        return fault

    def resume(self, fault: ProcessFault) -> float:
        """SIGCONT the paused node; returns when it runs again."""
        if fault.kind != "pause" or not fault.active:
            raise ValueError(f"cannot resume {fault.describe()}: not an active pause")
        node = self._cluster.target(fault.node)
        fault.ended_at = _process_transport(node).resume()
        return fault.ended_at

    def pause_for(self, node: Node, ms: float, *, drive: list[Node]) -> ProcessFault:
        """Pause ``node`` for ``ms``, polling ``drive`` (never the paused node); then resume."""
        fault = self.pause(node, planned_ms=ms)
        self._cluster.drive_until(fault.in_place_at + ms / 1000, nodes=drive)
        self.resume(fault)
        return fault

    def kill(self, node: Node) -> ProcessFault:
        """SIGKILL ``node``'s process; ``in_place_at`` is when it is gone."""
        transport = _process_transport(node)
        started = time.monotonic()
        gone = transport.kill()
        fault = ProcessFault("kill", node.name, transport.pid, started, gone, ended_at=None)
        self.history.append(fault)
        return fault

    def restart(self, node: Node) -> float:
        """A replacement process on the same port and ``local_id``; returns when it is built.

        Works after :meth:`kill` (the dead process is reaped) and on a live
        node (closed first, as :meth:`Cluster.restart` does).
        """
        self._cluster.restart(node)
        built = time.monotonic()
        for fault in self.history:
            if fault.node == node.name and fault.active:
                fault.ended_at = built
        return built

    def end_all(self) -> None:
        """Resume every node still paused (so it can be closed)."""
        for fault in self.history:
            if fault.kind == "pause" and fault.active:
                self.resume(fault)


def _process_transport(node: Node) -> ProcessTransport:
    transport = node.transport
    # A process node, or a driver's transport (conformance.drivers.p2p), which has the
    # same faults.
    if not isinstance(transport, ProcessTransport) and not callable(
            getattr(transport, "pause", None)):
        raise TypeError(f"{node.name} is not a process node; build it with "
                        "ProcessCluster.add_target()")
    return transport


class ProcessCluster(Cluster):
    """Observers in this process, targets in their own processes, one transport spec.

    :meth:`add_node` builds an observer (in-process, unless the spec already
    builds process nodes, as under ``--nodes process``); :meth:`add_target`
    a process node that :attr:`faults` can pause and kill. Closing the
    cluster resumes paused targets first, then closes every node.
    """

    def __init__(self, spec: TransportSpec, *, host: str = HOST) -> None:
        super().__init__(spec, host=host)
        self._targets = Cluster(process_spec(spec), host=host)
        self.faults = ProcessFaults(self)

    @property
    def observers_in_process(self) -> bool:
        return not is_process_spec(self.spec)

    def add_target(self, name: str | None = None, *, port: int | None = None) -> Node:
        """A node in its own process, which :attr:`faults` can pause and kill."""
        return self._targets.add_node(name, port=port)

    def target(self, name: str) -> Node:
        for node in self._targets.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no target node named {name!r}")

    def restart(self, node: Node) -> Node:
        if any(node is t for t in self._targets.nodes):
            return self._targets.restart(node)
        return super().restart(node)

    def drive_until(self, deadline: float, *, nodes: list[Node]) -> None:
        """Poll ``nodes`` until ``time.monotonic()`` reaches ``deadline``."""
        while time.monotonic() < deadline:
            for node in nodes:
                if not node.closed:
                    node.poll()
            time.sleep(0.001)

    def close(self) -> None:
        errors: list[BaseException] = []
        try:
            self.faults.end_all()
        except Exception as exc:
            errors.append(exc)
        for close in (self._targets.close, super().close):
            try:
                close()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> ProcessCluster:
        return self
