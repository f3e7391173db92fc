"""Process faults on p2p nodes: pause (SIGSTOP), resume (SIGCONT), kill (SIGKILL) and restart.

The faults a proxy cannot make. A paused node's kernel keeps its TCP
connections open and ACKs what arrives, so only an application-level (ZMTP)
heartbeat can tell it from a slow one; a killed node's kernel closes its
connections at once. Both need the node in its own process: see
:mod:`conformance.contracts.p2p.process_nodes`.

:class:`ProcessCluster` builds *observer* nodes in the test process and
*target* nodes in their own processes from the same transport spec, so the
observers measure detection with nothing but their own ``poll()`` in the
loop. :class:`ProcessFaults` makes and undoes the faults on targets and
records each as a :class:`chaos.process_faults.ProcessFault`.
"""

from __future__ import annotations

import time
from typing import cast

from chaos.process_faults import ProcessFault
from conformance.contracts.p2p.harness import WINDOW_PAUSE_S, Cluster, Node
from conformance.contracts.p2p.process_nodes import ProcessTransport, is_process_spec, process_spec
from conformance.contracts.p2p.spec import TransportSpec
from conformance.testing.net import HOST

__all__ = ["ProcessCluster", "ProcessFaults"]


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
    # A process node, or a driver's transport (conformance.drivers), which has the same
    # faults.
    if not isinstance(transport, ProcessTransport) and not callable(
            getattr(transport, "pause", None)):
        raise TypeError(f"{node.name} is not a process node; build it with "
                        "ProcessCluster.add_target()")
    return cast(ProcessTransport, transport)  # or a driver's, duck-typed


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
            time.sleep(WINDOW_PAUSE_S)

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
