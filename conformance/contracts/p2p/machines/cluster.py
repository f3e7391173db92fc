"""The cluster machine: a Hypothesis ``RuleBasedStateMachine`` over 2 to 4 real nodes.

Every rule does something a session owning a node may do (connect, send,
poll, mark a connection dead between polls, close it, reconnect inside the
dead-but-registered window, restart a node on the same port, flap a peer, let
a hostile peer send one frame), tells
:class:`~conformance.contracts.p2p.machines.model.ClusterModel`
what it did and checks what the implementation answered against it. All
calls go through :mod:`conformance.contracts.p2p.harness` (watchdog-guarded); waiting is
poll-driven with a deadline (:meth:`ClusterMachine.settle`).

Extending (chaos machines subclass this): add ``@rule`` methods that inject
faults and tell the model (``self.model``) which messages or connections
become uncertain; override :meth:`ClusterMachine.settle_timeout` or
:meth:`ClusterMachine.settle` when faults need longer to heal, and
:meth:`ClusterMachine.check_settled` for extra post-settle checks. Helpers
``_connect``, ``_send``, ``_poll``, ``_mark_dead``, ``_close`` and
``_restart`` do one checked operation each and are meant to be reused.

Preconditions depend on the model only; where the network makes an outcome
uncertain the model says "either" and the machine accepts both answers.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass
from typing import Any, ClassVar, NoReturn

from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    MultipleResults,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    rule,
)

from conformance.contracts.p2p.harness import (
    WINDOW_PAUSE_S,
    Cluster,
    Connection,
    Node,
    release_leftovers,
)
from conformance.contracts.p2p.hostile import HostilePeer
from conformance.contracts.p2p.machines.model import (
    ClusterModel,
    ConnModel,
    MessageModel,
    Violation,
)
from conformance.contracts.p2p.spec import (
    SUITE_HEARTBEAT_IVL_MS,
    SUITE_HEARTBEAT_TIMEOUT_MS,
    TransportSpec,
)
from conformance.contracts.p2p.strategies import (
    hostile_frames,
    hostile_identities,
    is_plausible_peer_id,
)
from conformance.contracts.p2p.strategies import messages as message_bodies
from conformance.errors import CallBlocked, HostStalled
from conformance.supervision import host_stall
from conformance.testing import resources
from conformance.testing.net import is_address_in_use

__all__ = ["ClusterMachine", "NodeRef"]

#: Slack between a measured host stall and a heartbeat death: the meter is not the
#: starved I/O thread (the chaos machine's PROXY_SLACK_MS, for the host).
_HOST_SLACK_MS = 100

#: Descriptors a node may hold per registered connection (a DEALER, its
#: monitor pair and both ends of one TCP connection need 4 in the reference).
FDS_PER_CONNECTION = 8
#: Descriptors one hostile peer's DEALER and its TCP connection may cost.
FDS_PER_HOSTILE = 6
#: A failure message that starts with a clause ID ("POLL-1: ...").
_NAMES_CLAUSE = re.compile(r"[A-Z]+-[0-9]+: ")
#: How long :meth:`ClusterMachine.let_traffic_land` keeps the other nodes busy:
#: loopback delivery takes well under a millisecond.
LANDING_WINDOW_S = 0.02
#: Fixed slack over the baseline (reconnect attempts in flight, restarts).
FD_SLACK = 16


@dataclass(frozen=True)
class NodeRef:
    """A node of the cluster, as rules see it (stable across restarts)."""

    name: str

    def __repr__(self) -> str:
        return self.name


#: Hostile frame lists, without the 100 kB nesting bombs: those are the
#: example tests' business and would make printed counterexamples unreadable.
#: Left out where they are drawn, not filtered out after being drawn; the
#: filter only keeps the rare long list of valid messages out as before.
_HOSTILE_FRAMES = st.deferred(lambda: hostile_frames(bombs=False)).filter(
    lambda frames: sum(map(len, frames)) < 4096)


class ClusterMachine(RuleBasedStateMachine):
    """2-4 nodes of the transport under test, driven against :class:`ClusterModel`.

    Build it with ``ClusterMachine(spec)``; run it with
    ``run_state_machine_as_test(lambda: ClusterMachine(spec), settings=...)``.
    """

    nodes = Bundle("nodes")

    #: Bodies of sent messages: small, but covering every MessagePack type.
    message_strategy: ClassVar[st.SearchStrategy[dict[str, Any]]] = message_bodies(max_leaves=4)

    def __init__(self, spec: TransportSpec) -> None:
        super().__init__()
        self.spec = spec
        self.model = ClusterModel()
        self.cluster = Cluster(spec)
        self.node: dict[str, Node] = {}
        self.proxy: dict[str, Connection] = {}
        self._known_raw: dict[str, set[int]] = {}
        self._hostiles: list[HostilePeer] = []
        self._hostile_ids: dict[str, set[str]] = {}
        #: Descriptors after start-up; None switches the descriptor checks off
        #: (CONN-5 on close, RES-2 on settle), e.g. while a proxy shares the process.
        self._baseline: resources.ResourceSnapshot | None = None
        #: Failures of this run are appended here (see ``run_machine``).
        self.failure_log: list[AssertionError] | None = None
        #: Connections whose creation visibly opened descriptors.
        self._owns_fds: set[str] = set()
        #: Host stalls are measured from here (docs/load-verdicts.md).
        host_stall.start()
        self._stall_since = time.monotonic()

    # -- setup and teardown ----------------------------------------------------

    @initialize(target=nodes, count=st.integers(min_value=2, max_value=4))
    def start_cluster(self, count: int) -> MultipleResults[NodeRef]:
        refs = []
        for i in range(count):
            name = f"n{i}"
            node = self._call("RES-1", f"building node {name}",
                              lambda name=name: self.cluster.add_node(name))
            self.node[name] = node
            self.model.add_node(name, node.local_id)
            self._known_raw[name] = set()
            self._hostile_ids[name] = set()
            refs.append(NodeRef(name))
        if resources.supported():
            self._baseline = resources.wait_until_stable(quiet=0.02, timeout=0.5)
        return multiple(*refs)

    def teardown(self) -> None:
        self._log_failure(sys.exc_info()[1])
        try:
            # A failing step is propagating: report it, not a follow-up failure.
            if sys.exc_info()[0] is None and self.node:
                try:
                    self.settle()
                except AssertionError as exc:
                    self._log_failure(exc)
                    raise
        finally:
            for peer in self._hostiles:
                peer.close()
            self._hostiles.clear()
            failing = sys.exc_info()[0] is not None
            try:
                self.cluster.close()
            except CallBlocked:
                if not failing:
                    raise
            except Exception as exc:
                if not failing:
                    raise Violation("RES-1", f"closing a node raised {exc!r}") from exc
            finally:
                # Checked already; what a leaking transport left must not pile up
                # into the next example's descriptor checks.
                release_leftovers(self.cluster.nodes)

    def _log_failure(self, exc: BaseException | None) -> None:
        if isinstance(exc, AssertionError) and self.failure_log is not None:
            self.failure_log.append(exc)

    # -- rules -------------------------------------------------------------------

    @rule(src=nodes, dst=nodes, hello=st.none() | message_strategy)
    def connect(self, src: NodeRef, dst: NodeRef, hello: dict[str, Any] | None) -> None:
        """``src.connect(dst)`` (new, duplicate: must raise, or replacing a dead entry),
        then send ``hello`` on it unless None."""
        if src == dst:
            return
        conn = self._connect(src.name, dst.name)
        if conn is not None and hello is not None:
            self._send(conn, hello)

    @rule(src=nodes, dst=nodes, body=message_strategy)
    def send(self, src: NodeRef, dst: NodeRef, body: dict[str, Any]) -> None:
        """Send on ``src``'s current connection to ``dst`` (the registered one, else
        the latest one, which may be dead or closed: then it must raise)."""
        conn = self.current(src.name, dst.name)
        if conn is not None:
            self._send(conn, body)

    @rule(node=nodes)
    def poll(self, node: NodeRef) -> None:
        """One ``poll()`` of one node, then every inbox of it drained and checked."""
        self._poll(node.name)

    @rule()
    def poll_until_settled(self) -> None:
        """Poll every node until every "must" message arrived (bounded by a deadline)."""
        self.settle()

    @rule(src=nodes, dst=nodes)
    def mark_dead(self, src: NodeRef, dst: NodeRef) -> None:
        """The owning session declares ``src``'s current connection to ``dst`` dead
        between two polls."""
        conn = self.current(src.name, dst.name)
        if conn is not None:
            self._mark_dead(conn)

    @rule(src=nodes, dst=nodes)
    def close(self, src: NodeRef, dst: NodeRef) -> None:
        """``close()`` ``src``'s current connection to ``dst`` (also when dead or closed)."""
        conn = self.current(src.name, dst.name)
        if conn is not None:
            self._close(conn)

    @rule(src=nodes, dst=nodes, body=message_strategy)
    def reconnect(self, src: NodeRef, dst: NodeRef, body: dict[str, Any]) -> None:
        """Mark ``src``'s current connection to ``dst`` dead and at once connect again (no
        poll in between: the dead-but-registered window), then send ``body`` (CONN-3)."""
        if src == dst:
            return
        old = self.current(src.name, dst.name)
        if old is not None:
            self._mark_dead(old)
        new = self._connect(src.name, dst.name)
        if new is not None:
            self._send(new, body)

    @rule(node=nodes)
    def let_traffic_land(self, node: NodeRef) -> None:
        """Poll every *other* node for a short window, so traffic towards ``node`` lands
        at its socket while it is not polled (what a session sees between two polls)."""
        others = [n for name, n in self.node.items() if name != node.name]
        deadline = time.monotonic() + LANDING_WINDOW_S
        while time.monotonic() < deadline:
            for other in others:
                self._poll(other.name)
            time.sleep(WINDOW_PAUSE_S)

    @rule(node=nodes, wait=st.booleans())
    def restart(self, node: NodeRef, wait: bool) -> None:
        """Close the node's transport and build a new one on the same port; with
        ``wait``, poll the others until each has seen its old connections die (POLL-5)."""
        self._restart(node.name)
        if wait:
            self._await_detection()

    @rule(node=nodes, peer=nodes, body=message_strategy)
    def rejoin(self, node: NodeRef, peer: NodeRef, body: dict[str, Any]) -> None:
        """``peer`` knows ``node`` (connecting and greeting it if it had no live entry),
        the cluster settles, ``node`` restarts, the others are polled until each has
        seen its old connections die, then ``node`` connects to ``peer``, speaks
        first, and every node is polled until that message arrived (POLL-2).

        The sequence of a worker that restarts and at once re-registers with a
        peer that saw it go. The other rules compose it too, but only when many
        draws line up, and a later step (a restart, a ``mark_dead`` of the
        peer's entry) often excuses a lost message before the final settle
        looks for it: a peer that drops the first message of a peer it saw die
        took hundreds of examples to catch; with this rule, tens.
        """
        if node == peer:
            return
        entry = self.model.nodes[peer.name].registry.get(node.name)
        if entry is None or not entry.healthy:
            conn = self._connect(peer.name, node.name)
            if conn is not None:
                self._send(conn, {"hello": node.name})
        self.settle()
        self._restart(node.name)
        self._await_detection()
        conn = self._connect(node.name, peer.name)
        msg = self._send(conn, body) if conn is not None else None
        if msg is not None:
            self._await_arrival(msg)

    @rule(src=nodes, dst=nodes, cycles=st.integers(min_value=2, max_value=8),
          sweep=st.booleans())
    def flap(self, src: NodeRef, dst: NodeRef, cycles: int, sweep: bool) -> None:
        """``cycles`` times, without a pause: kill the entry for ``dst``, (poll ``src`` if
        ``sweep``), connect again, send one message (CONN-7)."""
        if src == dst:
            return
        for cycle in range(cycles):
            entry = self.model.nodes[src.name].registry.get(dst.name)
            if entry is not None and not entry.must_be_dead:
                self._mark_dead(entry)
            if sweep:
                self._poll(src.name)
            conn = self._connect(src.name, dst.name)
            if conn is not None:
                self._send(conn, {"flap": cycle})

    @rule(node=nodes, identity=hostile_identities(), frames=_HOSTILE_FRAMES)
    def hostile(self, node: NodeRef, identity: bytes | None, frames: list[bytes]) -> None:
        """A raw DEALER (``identity``; None: anonymous) sends ``frames`` to the node,
        which is then polled once (POLL-3)."""
        target = self.node[node.name]
        peer = HostilePeer(target.local_id, identity=identity)
        self._hostiles.append(peer)
        peer.send(frames)
        self.model.nodes[node.name].hostile_inputs += 1
        if identity is not None and is_plausible_peer_id(identity):
            self._hostile_ids[node.name].add(identity.decode("utf-8"))
        self._poll(node.name)

    def current(self, src: str, dst: str) -> ConnModel | None:
        """``src``'s registered connection to ``dst``, else its latest one (this generation)."""
        if src == dst:
            return None
        entry = self.model.nodes[src].registry.get(dst)
        if entry is not None:
            return entry
        generation = self.model.nodes[src].generation
        latest = [c for c in self.model.conns_of(src) if c.peer == dst
                  and c.generation == generation]
        return latest[-1] if latest else None

    # -- invariants ----------------------------------------------------------------

    @invariant()
    def connections_alive_as_modelled(self) -> None:
        """``alive`` agrees with the model; at most one live connection per peer."""
        if not self.node:
            return
        live: dict[tuple[str, str], list[str]] = {}
        for conn in list(self.model.conns.values()):
            if conn.stale:
                continue
            alive = self._alive(conn)
            if alive:
                live.setdefault((conn.owner, conn.peer), []).append(conn.name)
        for (owner, peer), names in live.items():
            if len(names) > 1:
                raise Violation(
                    "CONN-2",
                    f"{owner} has {len(names)} live connections to {peer} at once: "
                    f"{', '.join(names)}",
                )

    # -- hooks for subclasses ----------------------------------------------------

    def settle_timeout(self) -> float:
        """How long :meth:`settle` may poll: the POLL-5 bound plus slack, at least 5 s."""
        return max(5.0, self.spec.capabilities.detects_peer_close_ms / 1000 + 2.0)

    def settle(self) -> None:
        """Poll every node until all "must" messages arrived and no connection is
        uncertain, then :meth:`check_settled`."""
        deadline = time.monotonic() + self.settle_timeout()
        while True:
            for name in self.node:
                self._poll(name)
            missing = self.model.missing()
            uncertain = self.model.uncertain_conns()
            if not missing and not uncertain:
                break
            if time.monotonic() >= deadline:
                self._fail_unsettled(missing, uncertain)
            time.sleep(0.001)
        self.check_settled()

    def check_settled(self) -> None:
        """Post-settle checks: ``alive`` as modelled, descriptors bounded (RES-2)."""
        self.connections_alive_as_modelled()
        if self._baseline is None:
            return
        allowed = (FDS_PER_CONNECTION * self.model.live_entries()
                   + FDS_PER_HOSTILE * len(self._hostiles) + FD_SLACK)
        if resources.fd_count() <= self._baseline.fd_count + allowed:
            return
        # Closed sockets are released asynchronously: judge once the count is
        # stable (quick for a leak, which stays put) rather than after a timeout.
        settled = resources.wait_until_stable(
            drive=lambda: [self._poll(name) for name in self.node], quiet=0.1, timeout=2.0)
        if settled.fd_count > self._baseline.fd_count + allowed:
            raise Violation(
                "RES-2",
                f"descriptors grew beyond {allowed} over the baseline with "
                f"{self.model.live_entries()} registered connection(s): "
                f"{settled.describe_growth(self._baseline)}",
            )

    # -- checked operations ------------------------------------------------------

    def _call(self, clause: str, what: str, fn: Any) -> Any:
        """``fn()``; any exception but a watchdog verdict becomes a ``clause`` violation."""
        try:
            return fn()
        except (CallBlocked, Violation):
            raise
        except AssertionError as exc:
            if _NAMES_CLAUSE.match(str(exc)):
                raise  # a check of the harness, already naming its clause
            raise Violation(clause, f"{what} raised {type(exc).__name__}: {exc}") from exc
        except Exception as exc:
            raise Violation(clause, f"{what} raised {type(exc).__name__}: {exc}") from exc

    def _alive(self, conn: ConnModel) -> bool:
        """Read ``alive`` and check it against the model (resolving uncertain ones)."""
        alive: bool = self._call("CONN-4", f"{conn.name}.alive",
                                 lambda: self.proxy[conn.name].alive)
        if alive and conn.must_be_dead:
            clause = "CONN-5" if conn.closed else ("CONN-3" if conn.retired and not conn.marked
                                                   else "CONN-4")
            raise Violation(clause, f"{conn.name} is {conn.state()} but reports alive=True")
        if not alive and conn.healthy:
            self._unless_host_starved(Violation(
                "POLL-5",
                f"{conn.name} reports alive=False although both nodes are up and nobody "
                "marked or closed it (a false death)",
            ))
        if not alive and conn.uncertain:
            self.model.seen_dead(conn)
        return alive

    def _unless_host_starved(self, violation: Violation) -> NoReturn:
        """Raise ``violation``, or :class:`HostStalled` when the host stalled long enough
        since the example started for a correct transport to lose a healthy connection to
        heartbeat starvation (stall + interval + 100 ms slack >= timeout; the chaos
        machine touches the connections instead, see ``docs/load-verdicts.md``)."""
        timeout = self.spec.heartbeat_timeout_ms or SUITE_HEARTBEAT_TIMEOUT_MS
        ivl = self.spec.heartbeat_ivl_ms or SUITE_HEARTBEAT_IVL_MS
        stalled = host_stall.stall_ms(self._stall_since)
        if stalled + ivl + _HOST_SLACK_MS >= timeout:
            raise HostStalled(f"{violation.clause}: the host stalled processes for {stalled:.0f} "
                           f"ms in this example (overloaded; heartbeat timeout {timeout} ms, "
                           f"interval {ivl} ms): a correct transport may lose a connection "
                           f"then, so this is no verdict ({violation})") from violation
        raise violation

    def _adopt(self, node: Node, proxy: Connection, conn: ConnModel, what: str) -> None:
        raw_id = id(proxy.raw)
        if raw_id in self._known_raw[node.name]:
            raise Violation(
                "POLL-1" if proxy.inbound else "CONN-1",
                f"{what} returned a connection object it had returned before",
            )
        self._known_raw[node.name].add(raw_id)
        self.proxy[conn.name] = proxy

    def _connect(self, src: str, dst: str) -> ConnModel | None:
        node = self.node[src]
        outcome = self.model.connect_outcome(src, dst)
        old = self.model.nodes[src].registry.get(dst)
        what = f"{src}.connect({dst})"
        before = resources.fd_count() if self._baseline is not None else None
        try:
            proxy = node.connect(self.node[dst].local_id)
        except CallBlocked:
            raise
        except Exception as exc:
            if outcome == "duplicate" and old is not None:
                # CONN-2: refused, and the existing connection keeps working.
                self._alive(old)
                return None
            if outcome == "either" and old is not None:
                return None
            if is_address_in_use(exc):
                raise Violation("CONN-7", f"{what} raised {exc!r}: an internal endpoint was "
                                "reused on a fast reconnect") from exc
            clause = "CONN-3" if outcome == "replace" else "CONN-1"
            state = f" ({old.name} is {old.state()})" if old is not None else ""
            raise Violation(clause, f"{what}{state} raised {type(exc).__name__}: {exc}") from exc
        if outcome == "duplicate" and old is not None:
            raise Violation("CONN-2", f"{what} succeeded although {old.name} is registered "
                            "and alive")
        conn = self.model.connected(src, dst)
        if before is not None and resources.fd_count() > before:
            # This transport visibly spends descriptors on a connection, so
            # close() must visibly give some back (CONN-5).
            self._owns_fds.add(conn.name)
        self._adopt(node, proxy, conn, what)
        peer_id = self._call("CONN-1", f"{conn.name}.peer_id", lambda: proxy.peer_id)
        if peer_id != self.node[dst].local_id:
            raise Violation("CONN-1", f"{what} returned peer_id {peer_id!r}")
        if old is not None and not old.stale and old.name in self.proxy:
            self._alive(old)
        self._alive(conn)
        return conn

    def _send(self, conn: ConnModel, body: dict[str, Any]) -> MessageModel | None:
        """Send ``body`` on ``conn`` and check the outcome; the message, if it went out."""
        if conn.stale:
            return None  # its transport is closed: nothing in the contract to check
        outcome = self.model.send_outcome(conn)
        msg = self.model.new_message(conn, body)
        try:
            self.proxy[conn.name].send(msg.msg)
        except CallBlocked:
            raise
        except Exception as exc:
            self.model.send_refused(msg)
            if outcome == "ok":
                raise Violation(
                    "MSG-4",
                    f"send() on {conn.name} ({conn.state()}) raised {type(exc).__name__}: {exc}",
                ) from exc
            if outcome == "either":
                self.model.seen_dead(conn)
            return None
        if outcome == "raise":
            raise Violation("CONN-6", f"send() on {conn.name} ({conn.state()}) did not raise")
        self.model.sent(msg)
        return msg

    def _poll(self, name: str) -> list[ConnModel]:
        """One checked ``poll()``: new connections adopted, every inbox drained."""
        node = self.node[name]
        clause = "POLL-3" if self.model.nodes[name].hostile_inputs else "POLL-1"
        new = self._call(clause, f"{name}.poll()", node.poll)
        self.model.polled(name)
        adopted: list[ConnModel] = []
        for proxy in new:
            conn = self._adopt_inbound(node, proxy)
            if conn is not None:
                adopted.append(conn)
        for conn in self.model.conns_of(name):
            if not conn.stale and not conn.closed:
                self._drain(conn)
        for conn in self.model.conns_of(name):
            if conn.uncertain:
                self._alive(conn)
        return adopted

    def _adopt_inbound(self, node: Node, proxy: Connection) -> ConnModel | None:
        what = f"{node.name}.poll()"
        peer_id = self._call("POLL-1", f"{what}: peer_id of a new connection",
                             lambda: proxy.peer_id)
        peer = self.model.node_of(peer_id)
        if peer is None or peer.name == node.name:
            if peer_id in self._hostile_ids[node.name]:
                # A hostile peer claimed a plausible host:port and sent a valid
                # message: the transport may accept it. Not part of the cluster.
                self._call("CONN-5", f"closing {node.name}'s connection to {peer_id!r}",
                           proxy.close)
                return None
            raise Violation("POLL-3", f"{what} returned a connection from {peer_id!r}, "
                            "which is no node of the cluster")
        if id(proxy.raw) in self._known_raw[node.name]:
            raise Violation("POLL-1", f"{what} returned a connection from {peer.name} that "
                            "an earlier poll() or connect() had returned already")
        try:
            conn, old = self.model.reported(node.name, peer.name)
        except Violation as exc:
            # The "live" entry may have died of a host stall before this poll (CONN-2).
            self._unless_host_starved(exc)
        self._adopt(node, proxy, conn, what)
        if old is not None and not old.stale and old.name in self.proxy:
            self._alive(old)
        first = self._drain(conn)
        if not first:
            raise Violation("POLL-1", f"{what} returned {conn.name} without its first "
                            "message readable")
        return conn

    def _drain(self, conn: ConnModel) -> int:
        got = self.proxy[conn.name].recv()
        for msg in got:
            self.model.received(conn, msg)
        return len(got)

    def _mark_dead(self, conn: ConnModel) -> None:
        if conn.stale:
            return
        if not conn.closed:
            self._drain(conn)
        self._call("CONN-4", f"{conn.name}.mark_dead()", self.proxy[conn.name].mark_dead)
        if not conn.closed:
            self.model.marked_dead(conn)
        self._alive(conn)

    def _close(self, conn: ConnModel) -> None:
        if conn.stale:
            return
        holds_resources = not (conn.closed or conn.retired or conn.uncertain or conn.seen_dead)
        if not conn.closed:
            self._drain(conn)
        # Count descriptors only while nothing else opens any: no reconnecting
        # connections (uncertain ones) and no hostile DEALERs (they reconnect
        # when dropped, and two with one identity take it from each other).
        measure = (self._baseline is not None and conn.name in self._owns_fds
                   and holds_resources and not self._hostiles
                   and not any(c.uncertain for c in self.model.conns.values() if not c.stale))
        before = resources.snapshot() if measure else None
        self._call("CONN-5", f"{conn.name}.close()", self.proxy[conn.name].close)
        self.model.closed(conn)
        self._alive(conn)
        if before is not None:
            resources.wait_for_release(
                before,
                what=f"CONN-5: {conn.name}.close(){' after mark_dead()' if conn.marked else ''}"
                     " released no descriptor",
                timeout=2.0,
                fd_slack=-1,
                check_threads=False,
            )

    def _restart(self, name: str) -> None:
        for conn in self.model.conns_of(name):
            if not conn.stale and not conn.closed:
                self._drain(conn)
        node = self.node[name]
        self._call("RES-1", f"restarting {name} on port {node.port}",
                   lambda: self.cluster.restart(node))
        self.model.restarted(name)
        self._known_raw[name] = set()
        # Hostile identities stay: their DEALERs reconnect to the new transport.

    def _await_detection(self) -> None:
        """Poll every node until no connection is uncertain (bounded: POLL-5)."""
        deadline = time.monotonic() + self.settle_timeout()
        while self.model.uncertain_conns():
            if time.monotonic() >= deadline:
                self._fail_unsettled([], self.model.uncertain_conns())
            for name in self.node:
                self._poll(name)
            time.sleep(WINDOW_PAUSE_S)

    def _await_arrival(self, msg: MessageModel) -> None:
        """Poll every node until ``msg`` arrived, for as long as it must (bounded as
        :meth:`settle` is)."""
        deadline = time.monotonic() + self.settle_timeout()
        while msg.must and not msg.arrivals:
            if time.monotonic() >= deadline:
                self._fail_unsettled([msg], [])
            for name in self.node:
                self._poll(name)
            time.sleep(0.001)

    def _fail_unsettled(self, missing: list[Any], uncertain: list[ConnModel]) -> None:
        if missing:
            msg = missing[0]
            extra = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise Violation(
                msg.clause,
                f"{msg.describe()} lost{extra}: sent while both ends were live, not received "
                f"within {self.settle_timeout():.1f} s",
            )
        conn = uncertain[0]
        raise Violation(
            "POLL-5",
            f"{conn.name} still reports alive=True {self.settle_timeout():.1f} s after "
            f"{conn.peer} was restarted (its old transport closed)",
        )
