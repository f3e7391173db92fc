"""The chaos machine: the cluster machine plus fault rules, shrunk together.

:class:`ChaosMachine` subclasses :class:`conformance.contracts.p2p.machines.ClusterMachine`
(every rule of the stateful transport machine: connect, send, poll, settle,
mark dead, close, reconnect, restart, flap, hostile frames) and runs it on a
:class:`conformance.contracts.p2p.topology.ChaosCluster`, adding rules that put faults on a
node's proxy and heal them. Hypothesis shrinks traffic and fault schedule
together: a failure prints the shortest sequence of steps, faults included.

The model (:class:`ChaosModel`) extends :class:`ClusterModel` with what a
fault makes uncertain:

- **Destructive faults** (partition, reset, disabled proxy) on node ``X``
  break everything addressed to ``X``. Every connection with ``X`` at either
  end becomes *fault-touched*: ``alive`` may be True or False from then on
  (a transport may or may not notice a one-sided break, may reconnect
  underneath), sends on it may raise, and its messages, and every message
  between ``X`` and anyone not yet received, become "may". Connections made
  while the fault is active are touched too.
- **After the heal**, connections made anew are healthy again: everything
  sent on them must arrive, in order, exactly once (HB-5), even while the
  receiver still holds a touched connection for the sender that dies
  afterwards (POLL-2). Messages are matched on any connection of the
  receiver, as in the cluster machine.
- **Benign faults** (latency and jitter below the heartbeat timeout, sliced
  links) lose nothing and kill nothing: a healthy connection reported dead
  while one is active is a false death (HB-2), and messages sent across them
  must arrive intact (HB-6).
- **A proxy that overruns its latency** is not benign: the verdict above
  rests on the proxy adding no more than ``latency + jitter``, and the proxy
  server is the suite's, not the implementation's. While a latency toxic is
  in place a :class:`~conformance.contracts.p2p.delay_probe.DelayProbe`
  measures the delay the same server really adds; once its worst one-way
  delay + the heartbeat interval + :data:`PROXY_SLACK_MS` reaches the
  heartbeat timeout, every connection with the node becomes fault-touched
  (it may die; surviving is fine) and the overrun is noted in
  :attr:`ChaosMachine.proxy_overruns` as an infrastructure limitation.

Every fault is healed at teardown (``ChaosCluster.close``) and before the
final settle, after which one fresh connection per pair in each direction
carries a message that must arrive. Waits (settle, detection after a
restart) never insist on fault-touched connections; descriptor checks are
off for an example once a destructive fault was injected.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from chaos.proxy import Toxiproxy
from conformance.contracts.p2p.delay_probe import DelayProbe
from conformance.contracts.p2p.faults import Fault
from conformance.contracts.p2p.harness import WINDOW_PAUSE_S, Connection, Node
from conformance.contracts.p2p.machines import ClusterMachine, ClusterModel, NodeRef, Violation
from conformance.contracts.p2p.machines.model import ConnModel, MessageModel
from conformance.contracts.p2p.spec import (
    SUITE_HEARTBEAT_IVL_MS,
    SUITE_HEARTBEAT_TIMEOUT_MS,
    TransportSpec,
)
from conformance.contracts.p2p.topology import ChaosCluster
from conformance.supervision import host_stall

__all__ = ["ChaosMachine", "ChaosModel"]

#: At most this many faults active at once (keeps examples meaningful and fast).
MAX_ACTIVE_FAULTS = 3

#: Slack between the longest legitimate gap in a node's incoming traffic
#: (heartbeat interval + the worst one-way delay the probe measured) and the
#: heartbeat timeout, below which a death under latency is a false death
#: (HB-2). It covers scheduling of libzmq's I/O threads and the difference
#: between the probe's proxy and the node's on the same server.
PROXY_SLACK_MS = 100


class ChaosModel(ClusterModel):
    """:class:`ClusterModel` plus fault bookkeeping (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        #: Active destructive faults per node name.
        self.broken: Counter[str] = Counter()
        #: Active benign faults per node name.
        self.benign: Counter[str] = Counter()
        #: Names of connections a destructive fault has touched.
        self.touched: set[str] = set()
        #: Nodes that have had a destructive fault healed.
        self.healed: set[str] = set()
        #: Active latency faults per node whose proxy overran its delay.
        self.overrun: Counter[str] = Counter()

    def fault_on(self, node: str, *, destructive: bool, what: str) -> None:
        if not destructive:
            self.benign[node] += 1
            return
        self.broken[node] += 1
        for conn in self.conns.values():
            if node in (conn.owner, conn.peer) and not conn.stale:
                self._touch(conn)
        for msg in self.unreceived():
            if node in (msg.sender, msg.receiver):
                self._may(msg, f"{what} on {node}'s proxy before it arrived")

    def proxy_overran(self, node: str) -> None:
        """The proxy in front of ``node`` added more delay than the heartbeat
        tolerates: its connections may die (they are touched, as under a
        destructive fault), but nothing else about ``node`` becomes uncertain."""
        self.overrun[node] += 1
        for conn in self.conns.values():
            if node in (conn.owner, conn.peer) and not conn.stale:
                self._touch(conn)

    def overrun_healed(self, node: str) -> None:
        self.overrun[node] -= 1
        if self.overrun[node] <= 0:
            del self.overrun[node]

    def fault_healed(self, node: str, *, destructive: bool) -> None:
        counter = self.broken if destructive else self.benign
        counter[node] -= 1
        if counter[node] <= 0:
            del counter[node]
        if destructive:
            self.healed.add(node)

    def new_conn(self, owner: str, peer: str, *, inbound: bool) -> ConnModel:
        conn = super().new_conn(owner, peer, inbound=inbound)
        if self.broken[owner] or self.broken[peer] or self.overrun[owner] or self.overrun[peer]:
            self._touch(conn)
        return conn

    def new_message(self, conn: ConnModel, body: dict[str, Any]) -> MessageModel:
        msg = super().new_message(conn, body)
        if msg.must and (conn.owner in self.healed or conn.peer in self.healed):
            msg.clause = "HB-5"  # a fresh connection after a heal must carry everything
        elif msg.must and (self.benign[conn.owner] or self.benign[conn.peer]):
            msg.clause = "HB-6"  # delayed or sliced, but never lost or altered
        return msg

    def seen_dead(self, conn: ConnModel) -> None:
        """A touched connection found dead only loses what was sent *on* it.

        Messages from its peer on other, healthy connections must still
        arrive (at a new connection, POLL-2).
        """
        if conn.name not in self.touched:
            super().seen_dead(conn)
            return
        conn.seen_dead = True
        for msg in self.unreceived():
            if msg.conn == conn.name:
                self._may(msg, f"{conn.name} was broken by a fault")

    def uncertain_conns(self) -> list[ConnModel]:
        """Uncertain connections that must resolve (to dead) within the POLL-5 bound.

        Fault-touched ones are left out: they may stay alive or dead for good,
        so no wait (settle, detection after a restart) may insist on them.
        """
        return [c for c in super().uncertain_conns() if c.name not in self.touched]

    def _touch(self, conn: ConnModel) -> None:
        if conn.must_be_dead:
            return
        conn.peer_lost = True  # "uncertain": alive either way, sends may raise
        self.touched.add(conn.name)
        for msg in self.unreceived():
            if msg.conn == conn.name:
                self._may(msg, f"{conn.name} was broken by a fault")


class ChaosMachine(ClusterMachine):
    """:class:`ClusterMachine` on a :class:`ChaosCluster`, with fault rules."""

    def __init__(self, spec: TransportSpec, toxiproxy: Toxiproxy) -> None:
        super().__init__(spec)
        self.model: ChaosModel = ChaosModel()
        self.cluster: ChaosCluster = ChaosCluster(spec, toxiproxy)
        self._fault_of: dict[int, tuple[Fault, bool]] = {}
        #: The delay probe shadowing each active latency fault, by fault id.
        self._probe_of: dict[int, DelayProbe] = {}
        #: Ids of latency faults whose proxy was found overrunning.
        self._overran: set[int] = set()
        #: One line per overrun: an infrastructure limitation, not a verdict.
        self.proxy_overruns: list[str] = []
        # The host stalls like an overrunning proxy, for every node at once (load-verdicts).
        self._host_overran = False
        timeout = spec.heartbeat_timeout_ms or SUITE_HEARTBEAT_TIMEOUT_MS
        self._timeout_ms = timeout
        self._ivl_ms = spec.heartbeat_ivl_ms or SUITE_HEARTBEAT_IVL_MS
        # Benign latency: one way at most 40 % of the timeout, jitter included.
        self._max_latency_ms = max(timeout * 3 // 10, 1)
        self._max_jitter_ms = max(timeout // 10, 0)

    # -- fault rules -------------------------------------------------------------

    def _can_fault(self) -> bool:
        return bool(self.node) and len(self.cluster.faults.active) < MAX_ACTIVE_FAULTS

    @precondition(_can_fault)
    @rule(node=ClusterMachine.nodes, kind=st.sampled_from(["partition", "reset", "disable"]))
    def break_link(self, node: NodeRef, kind: str) -> None:
        """A destructive fault on ``node``'s proxy: partition, reset or disable."""
        target = self.node[node.name]
        faults = self.cluster.faults
        if kind == "partition":
            fault = faults.partition(target)
        elif kind == "reset":
            fault = faults.reset(target)
        else:
            fault = faults.disable(target)
        self._register(fault, node.name, destructive=True)

    @precondition(_can_fault)
    @rule(node=ClusterMachine.nodes, latency=st.floats(0.5, 1.0), jitter=st.floats(0.0, 1.0))
    def add_latency(self, node: NodeRef, latency: float, jitter: float) -> None:
        """Latency plus jitter below the heartbeat timeout (HB-2: no false death)."""
        if any(f.kind == "latency" for f in self.cluster.faults.affecting(self.node[node.name])):
            return  # one latency toxic per proxy keeps the bound simple
        latency_ms = round(latency * self._max_latency_ms)
        jitter_ms = round(jitter * self._max_jitter_ms)
        fault = self.cluster.faults.latency(
            self.node[node.name], latency_ms=latency_ms, jitter_ms=jitter_ms)
        self._register(fault, node.name, destructive=False)
        probe = DelayProbe(self.cluster.toxiproxy, latency_ms=latency_ms, jitter_ms=jitter_ms)
        self._probe_of[id(fault)] = probe
        probe.start()

    @precondition(_can_fault)
    @rule(node=ClusterMachine.nodes, average=st.integers(8, 64),
          variation=st.integers(0, 63), delay_us=st.integers(10, 100))
    def slice_link(self, node: NodeRef, average: int, variation: int, delay_us: int) -> None:
        """Cut every stream to ``node`` into small writes (HB-6: delivered intact).

        At worst 8 bytes per 100 us (80 KB/s): the machine's messages (a few
        KB at most) cross in a fraction of the heartbeat timeout. The delay is
        never 0: a slicer without delay may cut a hostile peer's 300 KB frame
        into tens of thousands of writes without pausing, which stalls an
        in-process proxy (and every heartbeat through it) for a large part of
        the timeout.
        """
        fault = self.cluster.faults.slice(
            self.node[node.name], average_size=average,
            size_variation=min(variation, average - 1), delay_us=delay_us,
        )
        self._register(fault, node.name, destructive=False)

    @precondition(lambda self: bool(self.cluster.faults.active))
    @rule(pick=st.integers(0, MAX_ACTIVE_FAULTS - 1))
    def heal(self, pick: int) -> None:
        """Heal one active fault (the ``pick``-th, modulo how many are active)."""
        active = self.cluster.faults.active
        self._heal(active[pick % len(active)])

    @precondition(lambda self: bool(self.cluster.faults.active))
    @rule()
    def heal_all(self) -> None:
        for fault in list(self.cluster.faults.active):
            self._heal(fault)

    @precondition(lambda self: bool(self.node))
    @rule(long=st.booleans())
    def let_heartbeats_run(self, long: bool) -> None:
        """Poll every node for one heartbeat interval, or for timeout + 2 intervals
        (``long``), so broken links turn into detected deaths while benign faults
        must not cause any (checked by the invariant after the step)."""
        span_ms = self._timeout_ms + 2 * self._ivl_ms if long else self._ivl_ms
        deadline = time.monotonic() + span_ms / 1000
        while time.monotonic() < deadline:
            for name in self.node:
                self._poll(name)
            time.sleep(WINDOW_PAUSE_S)

    # -- overrides -----------------------------------------------------------------

    def _alive(self, conn: ConnModel) -> bool:
        """As in the cluster machine; a false death under a benign fault is HB-2
        (unless the proxy overran its latency, which touches the connection first)."""
        self._check_probes()
        try:
            return super()._alive(conn)
        except Violation as exc:
            benign = [f.describe() for f in self.cluster.faults.active if not f.destructive
                      and (conn.owner in f.nodes or conn.peer in f.nodes)]
            if exc.clause == "POLL-5" and benign:
                measured = [f"{probe.worst_delay_ms():.0f} ms"
                            for fault in self.cluster.faults.active
                            if (probe := self._probe_of.get(id(fault))) is not None
                            and (conn.owner in fault.nodes or conn.peer in fault.nodes)]
                seen = (f"; the proxy's measured worst one-way delay: {', '.join(measured)}"
                        if measured else "")
                raise Violation(
                    "HB-2",
                    f"{conn.name} reports alive=False under {', '.join(benign)} only "
                    f"(latency/slicing below the heartbeat timeout): a false death{seen}",
                ) from None
            raise

    def _fail_unsettled(self, missing: list[Any], uncertain: list[ConnModel]) -> None:
        """As in the cluster machine, after asking the probes: a message lost with a
        connection the proxy overran is "may" (the wait then goes on without it)."""
        self._check_probes()
        missing = [m for m in missing if m.must]
        still = self.model.uncertain_conns()
        uncertain = [c for c in uncertain if c in still]
        if missing or uncertain:
            super()._fail_unsettled(missing, uncertain)

    def teardown(self) -> None:
        """Heal everything, reconnect each pair afresh (HB-5), settle, close."""
        try:
            if sys.exc_info()[0] is None and self.node:
                for fault in list(self.cluster.faults.active):
                    self._heal(fault)
                self._fresh_round()
        finally:
            try:
                self._close_probes()
            finally:
                super().teardown()

    # -- internals -----------------------------------------------------------------

    def _register(self, fault: Fault, node: str, *, destructive: bool) -> None:
        self._fault_of[id(fault)] = (fault, destructive)
        if destructive:
            # Broken connections reconnect in the background (libzmq keeps trying
            # through a disabled or resetting proxy), so descriptor counts stop
            # meaning anything for this example: RES-2 and CONN-5's descriptor
            # checks stay with the cluster machine.
            self._baseline = None
        self.model.fault_on(node, destructive=destructive, what=fault.describe())

    def _heal(self, fault: Fault) -> None:
        self._check_probes()  # a death noticed after the heal may stem from an overrun
        probe = self._probe_of.pop(id(fault), None)
        if probe is not None:
            probe.close()
        self.cluster.faults.heal(fault)
        _, destructive = self._fault_of.pop(id(fault))
        for node in fault.nodes:
            self.model.fault_healed(node, destructive=destructive)
            if id(fault) in self._overran:
                self.model.overrun_healed(node)
        self._overran.discard(id(fault))

    def _close_probes(self) -> None:
        """Close every probe, even if one fails (a stopped server); then raise the first error."""
        probes, self._probe_of = list(self._probe_of.values()), {}
        error: BaseException | None = None
        for probe in probes:
            try:
                probe.close()
            except BaseException as exc:  # re-raised below, after the rest are closed
                error = error or exc
        if error is not None:
            raise error

    def _adopt_inbound(self, node: Node, proxy: Connection) -> ConnModel | None:
        """As in the cluster machine, after the overrun checks: a new inbound connection
        from a peer whose entry a host stall killed is no CONN-2 duplicate."""
        self._check_probes()
        return super()._adopt_inbound(node, proxy)

    def _check_host(self) -> None:
        """A host stall (``conformance.supervision.host_stall``) that leaves less than
        :data:`PROXY_SLACK_MS` between the heartbeat interval and the timeout starves
        heartbeats as an overrunning proxy does, on every node at once: every connection
        is touched for the rest of the example and the stall noted in
        :attr:`proxy_overruns` (seen: CONN-2 on the reference at load 25-33, a connection
        that died under a 584 ms stall taken for a duplicate)."""
        if self._host_overran:
            return
        stalled = host_stall.stall_ms(self._stall_since)
        if stalled + self._ivl_ms + PROXY_SLACK_MS < self._timeout_ms:
            return
        self._host_overran = True
        self.proxy_overruns.append(
            f"the host stalled processes for {stalled:.0f} ms (+ {self._ivl_ms} ms interval + "
            f"{PROXY_SLACK_MS} ms slack >= {self._timeout_ms} ms timeout); deaths from then "
            "on are not judged (HB-2, CONN-2)")
        for name in self.model.nodes:
            self.model.proxy_overran(name)

    def _check_probes(self) -> None:
        """Touch the connections behind every proxy whose measured delay leaves less
        than :data:`PROXY_SLACK_MS` between the heartbeat interval and the timeout, and
        every connection once the host stalled that long (:meth:`_check_host`)."""
        self._check_host()
        for fault in self.cluster.faults.active:
            probe = self._probe_of.get(id(fault))
            if probe is None or id(fault) in self._overran:
                continue
            worst = probe.worst_delay_ms()
            if worst + self._ivl_ms + PROXY_SLACK_MS < self._timeout_ms:
                continue
            self._overran.add(id(fault))
            self.proxy_overruns.append(
                f"{fault.describe()}: the proxy server delayed bytes by up to {worst:.0f} ms "
                f"(+ {self._ivl_ms} ms interval + {PROXY_SLACK_MS} ms slack >= "
                f"{self._timeout_ms} ms timeout); deaths there are not judged (HB-2)")
            for node in fault.nodes:
                self.model.proxy_overran(node)

    def _fresh_round(self) -> None:
        """Every ordered pair gets a new connection and one message on it, which must
        arrive at the final settle (HB-5).

        All registered entries are marked dead first, then every pair
        connects, then every new connection sends: marking a receiver's entry
        dead after a message was sent would make that message "may".
        """
        names = sorted(self.node)
        for name in names:
            for entry in list(self.model.nodes[name].registry.values()):
                if not entry.must_be_dead and not entry.stale:
                    self._mark_dead(entry)
        fresh: list[ConnModel] = []
        for src in names:
            for dst in names:
                if src != dst:
                    conn = self._connect(src, dst)
                    if conn is not None:
                        fresh.append(conn)
        for conn in fresh:
            self._send(conn, {"after": "heal"})
