"""The model of what must be true of a cluster of nodes: pure bookkeeping, no I/O.

The stateful machines (:mod:`conformance.contracts.p2p.machines.cluster`) drive real
transports and tell this model what they did and what they observed; the
model answers what the contract allows and raises :class:`Violation` (an
``AssertionError`` whose message starts with the clause ID) when an
observation breaks it. Keeping it free of sockets makes it unit-testable and
lets subclasses (chaos machines) add fault bookkeeping without touching the
driving code.

Semantics it encodes (the interface of ``DESIGN.md``, as the reference
transport implements it):

- A node keeps at most one registered connection per peer, whichever side
  opened it. Messages from peer ``P`` land on the node's current connection
  for ``P``: possibly an old inbound one that is still alive, possibly a new
  one ``poll()`` returns. So a message is matched by its sequence number, on
  *any* connection of the receiver whose ``peer_id`` is the sender.
- Every message is either **must** (sent on a healthy connection to a node
  whose entry for the sender is healthy; it has to arrive exactly once, in
  order) or **may** (network timing makes delivery legitimately uncertain:
  the sender's connection was marked dead or closed before it arrived, either
  node restarted, the receiver marked its entry for the sender dead). "May"
  messages are still checked for duplication, order and fidelity.
- A connection is **healthy** (``alive`` must be True), **dead** (marked,
  closed, replaced, swept, or its node restarted: ``alive`` must be False), or
  **uncertain**: its peer restarted and the owner's ``poll()`` may or may not
  have noticed yet. Uncertain connections resolve to dead once the
  implementation reports them dead, and must do so within the POLL-5 bound.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from conformance.testing.values import first_difference

__all__ = [
    "SEQ_KEY",
    "ClusterModel",
    "ConnModel",
    "MessageModel",
    "NodeModel",
    "Violation",
]

#: Key under which every message the machines send carries its sequence number.
SEQ_KEY = "zmq-conformance-seq"


class Violation(AssertionError):
    """A contract violation; the message starts with the clause ID ("MSG-2: ...")."""

    def __init__(self, clause: str, text: str) -> None:
        super().__init__(f"{clause}: {text}")
        self.clause = clause


@dataclass(eq=False)
class NodeModel:
    """One node: its name, address, generation and registry (peer name -> connection)."""

    name: str
    local_id: str
    generation: int = 0
    registry: dict[str, ConnModel] = field(default_factory=dict)
    hostile_inputs: int = 0


@dataclass(eq=False)
class ConnModel:
    """One connection object of one node generation.

    ``name`` reads ``"n0>n1#2"``: owned by ``n0``, leading to ``n1``, the
    second connection of that pair.
    """

    name: str
    owner: str
    peer: str
    generation: int
    inbound: bool
    marked: bool = False
    closed: bool = False
    #: No longer the owner's registered connection for ``peer`` (replaced,
    #: swept, closed, or the owner restarted).
    retired: bool = False
    #: The owner was restarted: the object belongs to a closed transport.
    stale: bool = False
    #: The peer restarted after this connection was made; not yet seen dead.
    peer_lost: bool = False
    #: The implementation has reported ``alive == False`` at least once.
    seen_dead: bool = False
    #: Made by ``connect()`` retiring a dead-but-registered entry (CONN-3).
    replaced: bool = False
    #: A message sent on it has arrived: it reached the peer's transport.
    established: bool = False
    #: The peer restarted before it was established: it may have attached to
    #: the new peer transport instead, so it may stay alive (allowed either).
    may_survive: bool = False
    #: Sequence numbers sent on this connection, in order.
    sent: list[int] = field(default_factory=list)

    @property
    def must_be_dead(self) -> bool:
        return self.marked or self.closed or self.stale or self.seen_dead or (
            self.retired and not self.peer_lost
        )

    @property
    def healthy(self) -> bool:
        """``alive`` must be True and sends must succeed."""
        return not self.must_be_dead and not self.peer_lost

    @property
    def uncertain(self) -> bool:
        return not self.must_be_dead and self.peer_lost

    def state(self) -> str:
        if self.stale:
            return "stale (its node restarted)"
        if self.closed:
            return "closed"
        if self.marked:
            return "marked dead"
        if self.seen_dead:
            return "dead"
        if self.uncertain:
            return "alive-or-dead (peer restarted)"
        return "alive"

    def __repr__(self) -> str:
        return f"<{self.name} {self.state()}>"


@dataclass(eq=False)
class MessageModel:
    seq: int
    sender: str
    sender_generation: int
    conn: str
    receiver: str
    receiver_generation: int
    msg: dict[str, Any]
    must: bool
    why_may: str = ""
    #: The clause a loss of this message breaks.
    clause: str = "MSG-2"
    #: Receiving connection names, one per arrival (more than one: duplicated).
    arrivals: list[str] = field(default_factory=list)

    def describe(self) -> str:
        return f"message #{self.seq} {self.sender}->{self.receiver} (sent on {self.conn})"


class ClusterModel:
    """What the contract says about a cluster; updated by the machine, never by I/O."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeModel] = {}
        self.conns: dict[str, ConnModel] = {}
        self.messages: dict[int, MessageModel] = {}
        self._seq = itertools.count(1)
        self._pair_serial: dict[tuple[str, str], itertools.count[int]] = {}
        #: (sender connection, receiving connection) -> highest seq received.
        self._last_seq: dict[tuple[str, str], int] = {}
        #: Receiving connections marked dead (after a drain): nothing may land there.
        self._sealed: set[str] = set()

    # -- nodes --------------------------------------------------------------

    def add_node(self, name: str, local_id: str) -> NodeModel:
        node = NodeModel(name, local_id)
        self.nodes[name] = node
        return node

    def node_of(self, local_id: str) -> NodeModel | None:
        for node in self.nodes.values():
            if node.local_id == local_id:
                return node
        return None

    def restarted(self, name: str) -> None:
        """``name``'s transport was closed and rebuilt on the same address."""
        node = self.nodes[name]
        for conn in self.conns_of(name):
            if not conn.stale:
                conn.stale = conn.retired = True
        node.registry.clear()
        node.generation += 1
        for msg in self.unreceived():
            if msg.receiver == name:
                self._may(msg, f"{name} restarted before it arrived")
            elif msg.sender == name:
                self._may(msg, f"its sender {name} restarted before it arrived")
        for other in self.nodes.values():
            entry = other.registry.get(name)
            if entry is not None and not entry.must_be_dead:
                entry.peer_lost = True
                # A connection whose first bytes never reached the old transport
                # may connect to the new one: nothing "went away" for it.
                entry.may_survive = not entry.established

    def link_faulted(self, a: str, b: str, why: str, *, may_die: bool = True) -> None:
        """A fault between ``a`` and ``b`` (for chaos machines): traffic in flight
        between them becomes "may"; with ``may_die``, their connections to each
        other become uncertain (either outcome allowed, never required to die)."""
        for msg in self.unreceived():
            if {msg.sender, msg.receiver} == {a, b}:
                self._may(msg, why)
        if may_die:
            for owner, peer in ((a, b), (b, a)):
                entry = self.nodes[owner].registry.get(peer)
                if entry is not None and not entry.must_be_dead:
                    entry.peer_lost = entry.may_survive = True

    # -- connections --------------------------------------------------------

    def new_conn(self, owner: str, peer: str, *, inbound: bool) -> ConnModel:
        serial = self._pair_serial.setdefault((owner, peer), itertools.count(1))
        conn = ConnModel(
            name=f"{owner}>{peer}#{next(serial)}",
            owner=owner,
            peer=peer,
            generation=self.nodes[owner].generation,
            inbound=inbound,
        )
        self.conns[conn.name] = conn
        return conn

    def conns_of(self, owner: str) -> list[ConnModel]:
        return [c for c in self.conns.values() if c.owner == owner]

    def connect_outcome(self, owner: str, peer: str) -> str:
        """What ``owner.connect(peer)`` must do: ``"new"``, ``"replace"``,
        ``"duplicate"`` (must raise) or ``"either"`` (entry uncertain)."""
        entry = self.nodes[owner].registry.get(peer)
        if entry is None or entry.retired:
            return "new"
        if entry.must_be_dead:
            return "replace"
        if entry.uncertain:
            return "either"
        return "duplicate"

    def connected(self, owner: str, peer: str) -> ConnModel:
        """``owner.connect(peer)`` succeeded: retire the old entry, register the new one."""
        node = self.nodes[owner]
        old = node.registry.get(peer)
        if old is not None:
            self._retire(old)
        conn = self.new_conn(owner, peer, inbound=False)
        conn.replaced = old is not None
        node.registry[peer] = conn
        return conn

    def polled(self, owner: str) -> None:
        """``owner.poll()`` returned: entries killed before it are swept (POLL-2)."""
        node = self.nodes[owner]
        for conn in list(node.registry.values()):
            if conn.marked:
                self._retire(conn)

    def reported(self, owner: str, peer: str) -> tuple[ConnModel, ConnModel | None]:
        """``owner.poll()`` returned a new inbound connection from ``peer``.

        Returns the new connection and the entry it displaced. Raises CONN-2
        when the displaced entry was healthy (two live connections to one peer).
        """
        node = self.nodes[owner]
        old = node.registry.get(peer)
        if old is not None and not old.retired and old.healthy:
            raise Violation(
                "CONN-2",
                f"{owner}.poll() returned a new inbound connection from {peer} while "
                f"{old.name} is registered and alive: two live connections to one peer",
            )
        if old is not None:
            self._retire(old)
        conn = self.new_conn(owner, peer, inbound=True)
        node.registry[peer] = conn
        return conn, old

    def marked_dead(self, conn: ConnModel) -> None:
        """``conn.mark_dead()`` (after its inbox was drained)."""
        conn.marked = True
        self._sealed.add(conn.name)
        self._lost_end(conn, "marked dead")

    def closed(self, conn: ConnModel) -> None:
        conn.closed = True
        self._sealed.add(conn.name)
        self._lost_end(conn, "closed")
        self._retire(conn)

    def seen_dead(self, conn: ConnModel) -> None:
        """The implementation reported an uncertain connection dead: it is dead for good."""
        conn.seen_dead = True
        self._lost_end(conn, "found dead")

    def _retire(self, conn: ConnModel) -> None:
        conn.retired = True
        node = self.nodes[conn.owner]
        if node.registry.get(conn.peer) is conn:
            del node.registry[conn.peer]

    def _lost_end(self, conn: ConnModel, how: str) -> None:
        """In-flight traffic over a connection whose one end died becomes "may"."""
        for msg in self.unreceived():
            if msg.conn == conn.name:
                self._may(msg, f"{conn.name} was {how} before it arrived")
            elif msg.receiver == conn.owner and msg.sender == conn.peer:
                self._may(msg, f"the receiver's {conn.name} was {how} before it arrived")

    # -- messages -----------------------------------------------------------

    def send_outcome(self, conn: ConnModel) -> str:
        """``"ok"`` (must succeed), ``"raise"`` (CONN-6) or ``"either"``."""
        if conn.must_be_dead:
            return "raise"
        if conn.uncertain:
            return "either"
        return "ok"

    def new_message(self, conn: ConnModel, body: dict[str, Any]) -> MessageModel:
        seq = next(self._seq)
        receiver = self.nodes[conn.peer]
        entry = receiver.registry.get(conn.owner)
        must, why = True, ""
        if not conn.healthy:
            must, why = False, f"{conn.name} may already be dead"
        elif entry is not None and entry.marked:
            must, why = False, f"the receiver's {entry.name} is marked dead"
        if conn.replaced and not conn.sent:
            clause = "CONN-3"
        elif conn.generation > 0 and not any(
            m.sender == conn.owner and m.sender_generation == conn.generation
            and m.receiver == conn.peer for m in self.messages.values()
        ):
            clause = "POLL-2"
        elif not conn.inbound and not conn.sent:
            clause = "CONN-1"
        else:
            clause = "MSG-2"
        msg = MessageModel(
            clause=clause,
            seq=seq,
            sender=conn.owner,
            sender_generation=conn.generation,
            conn=conn.name,
            receiver=conn.peer,
            receiver_generation=receiver.generation,
            msg={SEQ_KEY: seq, "body": body},
            must=must,
            why_may=why,
        )
        self.messages[seq] = msg
        return msg

    def sent(self, msg: MessageModel) -> None:
        self.conns[msg.conn].sent.append(msg.seq)

    def send_refused(self, msg: MessageModel) -> None:
        del self.messages[msg.seq]

    def received(self, conn: ConnModel, got: Any) -> MessageModel:
        """``conn.recv()`` handed over ``got``; check it against what was sent."""
        seq = got.get(SEQ_KEY) if isinstance(got, dict) else None
        msg = self.messages.get(seq) if isinstance(seq, int) else None
        if msg is None:
            raise Violation(
                "MSG-1",
                f"{conn.name}.recv() returned {got!r:.120}, which no node sent "
                "(corrupted or invented)",
            )
        where = f"{msg.describe()} arrived on {conn.name}"
        if conn.owner != msg.receiver or conn.peer != msg.sender:
            raise Violation("MSG-2", f"{where}: delivered to the wrong node or peer")
        if conn.name in self._sealed:
            raise Violation(
                "POLL-2",
                f"{where} after {conn.name} was marked dead: traffic was routed to a dead "
                "connection instead of a new one",
            )
        if msg.arrivals:
            raise Violation(
                "MSG-2",
                f"{msg.describe()} duplicated: arrived on {msg.arrivals[0]} and again on "
                f"{conn.name}",
            )
        diff = first_difference(msg.msg, got)
        if diff is not None:
            raise Violation("MSG-1", f"{where} altered: {diff}")
        key = (msg.conn, conn.name)
        last = self._last_seq.get(key, 0)
        if msg.seq < last:
            raise Violation(
                "MSG-2",
                f"{where} after message #{last}, which was sent after it on {msg.conn}: "
                "reordered",
            )
        self._last_seq[key] = msg.seq
        msg.arrivals.append(conn.name)
        self.conns[msg.conn].established = True
        return msg

    def unreceived(self) -> Iterator[MessageModel]:
        return (m for m in list(self.messages.values()) if not m.arrivals)

    def missing(self) -> list[MessageModel]:
        """"Must" messages that have not arrived yet."""
        return [m for m in self.unreceived() if m.must]

    def _may(self, msg: MessageModel, why: str) -> None:
        if msg.must:
            msg.must, msg.why_may = False, why

    # -- questions ----------------------------------------------------------

    def uncertain_conns(self) -> list[ConnModel]:
        """Connections whose peer restarted that must be found dead (POLL-5)."""
        return [c for c in self.conns.values()
                if c.uncertain and not c.stale and not c.may_survive]

    def live_entries(self) -> int:
        """Registered connections the implementation may still hold resources for."""
        return sum(
            1 for node in self.nodes.values() for c in node.registry.values() if not c.retired
        )
