"""The chaos machine with process faults in its alphabet: pause and crash.

:class:`ProcessChaosMachine` is the chaos machine (:mod:`.chaos_machine`) with every
node in its own process (:func:`conformance.contracts.p2p.process_nodes.process_spec`) and
two more rules, so Hypothesis shrinks process faults together with the
traffic and the proxy faults:

- ``pause(node, fraction)``: SIGSTOP the node for ``fraction`` x the heartbeat
  timeout while every *other* node keeps polling, then SIGCONT. A pause no
  longer than 80 % of ``timeout - interval`` is *benign* in the model (no
  death, nothing lost; a death it causes is a PROC-1 violation); a longer one
  is *destructive* like a partition of that node, healed at the resume (its
  connections may die; connections made afterwards must carry everything).
- ``crash(node, wait)``: SIGKILL the node's process and start a replacement
  on the same port at once, which the model treats as a restart (the old
  connections must die at the peers within the POLL-5 bound; new ones work).

The whole pause happens inside one step, so no other rule ever calls into a
stopped process.
"""

from __future__ import annotations

import time
from typing import Any, cast

from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from chaos.proxy import Toxiproxy
from conformance.contracts.p2p.chaos_machine import ChaosMachine
from conformance.contracts.p2p.harness import WINDOW_PAUSE_S
from conformance.contracts.p2p.machines import ClusterMachine, NodeRef, Violation
from conformance.contracts.p2p.machines.model import ConnModel
from conformance.contracts.p2p.process_nodes import ProcessTransport, process_spec
from conformance.contracts.p2p.spec import TransportSpec

__all__ = ["ProcessChaosMachine"]

#: Short pauses stay below this fraction of ``timeout - interval``.
_BENIGN_FRACTION = 0.8


class ProcessChaosMachine(ChaosMachine):
    """:class:`ChaosMachine` on process nodes, plus the ``pause`` and ``crash`` rules."""

    def __init__(self, spec: TransportSpec, toxiproxy: Toxiproxy) -> None:
        super().__init__(process_spec(spec), toxiproxy)
        #: Node -> until when (monotonic) a death near it is blamed on its short pause.
        self._short_pause_until: dict[str, float] = {}

    @precondition(lambda self: bool(self.node))
    @rule(node=ClusterMachine.nodes, fraction=st.floats(0.05, 3.0))
    def pause(self, node: NodeRef, fraction: float) -> None:
        """SIGSTOP ``node`` for ``fraction`` x timeout, polling the others; then SIGCONT."""
        name = node.name
        ms = fraction * self._timeout_ms
        benign = ms <= _BENIGN_FRACTION * (self._timeout_ms - self._ivl_ms)
        what = f"pause of {name} for {ms:.0f} ms"
        if not benign:
            self._baseline = None  # reconnects in the background: descriptors mean nothing
        self.model.fault_on(name, destructive=not benign, what=what)
        transport = self._transport(name)
        transport.pause()
        try:
            deadline = time.monotonic() + ms / 1000
            while time.monotonic() < deadline:
                for other in self.node:
                    if other != name:
                        self._poll(other)
                time.sleep(WINDOW_PAUSE_S)
        finally:
            transport.resume()
        self.model.fault_healed(name, destructive=not benign)
        if benign:
            window_s = 2 * (self._timeout_ms + self._ivl_ms) / 1000
            self._short_pause_until[name] = time.monotonic() + window_s

    @precondition(lambda self: bool(self.node))
    @rule(node=ClusterMachine.nodes, wait=st.booleans())
    def crash(self, node: NodeRef, wait: bool) -> None:
        """SIGKILL ``node`` and start a replacement process on the same port at once;
        with ``wait``, poll the others until each has seen its old connections die."""
        name = node.name
        for conn in self.model.conns_of(name):
            if not conn.stale and not conn.closed:
                self._drain(conn)
        target = self.node[name]
        self._transport(name).kill()
        self._call("PROC-3", f"replacing the killed {name} on port {target.port}",
                   lambda: self.cluster.restart(target))
        self.model.restarted(name)
        self._known_raw[name] = set()
        if wait:
            self._await_detection()

    def _poll(self, name: str) -> list[ConnModel]:
        """As in the cluster machine, in one round trip to the node's process when the
        poll returns no new connection: the node is told beforehand which ``recv()``
        calls follow such a poll (every open connection of ``name``, in the model's
        order: the drains of :meth:`ClusterMachine._poll`) and runs them right after
        its ``poll()``. The calls, their order and every check are the cluster
        machine's; only the round trips between them go
        (:meth:`ProcessTransport.drain_after_poll`)."""
        transport = self.node[name].transport
        if isinstance(transport, ProcessTransport):
            drains = [self.proxy.get(conn.name) for conn in self.model.conns_of(name)
                      if not conn.stale and not conn.closed]
            if all(proxy is not None for proxy in drains):
                transport.drain_after_poll([proxy.raw for proxy in drains if proxy is not None])
        return super()._poll(name)

    @invariant()
    def connections_alive_as_modelled(self) -> None:
        """The cluster machine's invariant, with each node's ``alive`` reads made in one
        round trip: every node is told beforehand which reads follow (its connections
        in the model's order, as the invariant walks them) and makes them at once, each
        under its own guard; the invariant then checks each read as before
        (:meth:`ProcessTransport.read_alive_ahead`)."""
        if self.node:
            ahead: dict[str, list[Any]] = {}
            for conn in self.model.conns.values():
                proxy = self.proxy.get(conn.name)
                if not conn.stale and proxy is not None:
                    ahead.setdefault(conn.owner, []).append(proxy.raw)
            for name, raws in ahead.items():
                node = self.node.get(name)
                if node is not None and isinstance(node.transport, ProcessTransport):
                    node.transport.read_alive_ahead(raws)
        super().connections_alive_as_modelled()

    def _alive(self, conn: ConnModel) -> bool:
        """As in the chaos machine; a death right after a short pause is PROC-1."""
        try:
            return super()._alive(conn)
        except Violation as exc:
            now = time.monotonic()
            paused = [n for n in (conn.owner, conn.peer)
                      if self._short_pause_until.get(n, 0.0) > now]
            if exc.clause == "POLL-5" and paused:
                raise Violation(
                    "PROC-1",
                    f"{conn.name} reports alive=False right after a pause of {paused[0]} "
                    "shorter than timeout - interval: a false death",
                ) from None
            raise

    def _transport(self, name: str) -> ProcessTransport:
        transport = self.node[name].transport
        # A process node, or a driver's transport (conformance.contracts.p2p.driver): same faults.
        if not isinstance(transport, ProcessTransport) and not callable(
                getattr(transport, "pause", None)):
            raise TypeError(f"{name} is not a process node")
        return cast(ProcessTransport, transport)  # or a driver's, duck-typed
