"""The clauses of the ``p2p`` contract: the peer-to-peer control transport.

ROUTER in, a DEALER per peer, heartbeats through ZMTP (DESIGN.md, "Contract
clauses"). IDs never change meaning once published.
"""

from __future__ import annotations

from typing import Final

from conformance.clauses import Clause, clause_table

__all__ = ["CLAUSES"]

CLAUSES: Final[dict[str, Clause]] = clause_table(
    # Connection lifecycle
    Clause(
        "CONN-1",
        "connect returns a live connection",
        "connect() returns a live connection whose peer_id is the argument; messages sent "
        "before the remote ever polls are delivered.",
    ),
    Clause(
        "CONN-2",
        "duplicate connect is refused",
        "connect() to a peer with a live registered connection is a duplicate: it raises, "
        "and the existing connection keeps working.",
    ),
    Clause(
        "CONN-3",
        "reconnect retires a dead-but-registered entry",
        "connect() to a peer whose registered connection is dead (marked dead, not yet swept "
        "by poll()) retires it, releasing its resources, and returns a new live connection; "
        "a message sent on the new connection right after the reconnect arrives at the remote.",
    ),
    Clause(
        "CONN-4",
        "mark_dead only flips liveness",
        "mark_dead() makes alive False at once; it releases nothing; messages already "
        "buffered stay readable with recv().",
    ),
    Clause(
        "CONN-5",
        "close is idempotent and releases everything",
        "close() is idempotent and releases every resource of the connection, also after "
        "mark_dead() (no leaked sockets or descriptors).",
    ),
    Clause(
        "CONN-6",
        "send on a dead or closed connection raises",
        "send() on a dead or closed connection raises; the transport keeps working.",
    ),
    Clause(
        "CONN-7",
        "flapping peers stay reachable",
        "A peer that flaps (connect, die, sweep, connect again, many times in a row, with no "
        "pause) stays reachable: no address-in-use errors from reused internal endpoints.",
    ),
    # Polling and routing
    Clause(
        "POLL-1",
        "each inbound connection is reported once",
        "Each inbound connection is returned by exactly one poll(), with its first "
        "message(s) already readable.",
    ),
    Clause(
        "POLL-2",
        "dead connections are swept before routing",
        "Connections killed between two polls are retired before traffic is routed: a "
        "reconnecting peer's next message arrives on a new connection returned by poll(); it "
        "is never swallowed by the dead one.",
    ),
    Clause(
        "POLL-3",
        "hostile input never makes poll raise",
        "poll() never raises because of what a peer sent: wrong frame counts, a routing "
        "identity that is not UTF-8 or not host:port, undecodable MessagePack, a payload that "
        "is not a dict, an oversized message. Such input is dropped; other peers are "
        "unaffected.",
    ),
    Clause(
        "POLL-4",
        "idle poll is quick and empty",
        "poll() with nothing to do returns an empty sequence quickly.",
    ),
    Clause(
        "POLL-5",
        "a closed peer is noticed",
        "When a peer's transport closes, the connection to it is marked dead by poll() within "
        "a bounded time.",
    ),
    # Messages
    Clause(
        "MSG-1",
        "message fidelity",
        "Any dict of MessagePack-representable values (nested maps and lists, str, bytes, "
        "ints to 64 bits, floats, bools, None) arrives equal to what was sent.",
    ),
    Clause(
        "MSG-2",
        "in order, exactly once",
        "Per connection, messages arrive in order, each exactly once, while both ends live.",
    ),
    Clause(
        "MSG-3",
        "recv drains",
        "recv() returns everything received since the last call, then an empty sequence.",
    ),
    Clause(
        "MSG-4",
        "send never blocks",
        "send() never blocks, also towards an unreachable or stalled peer and past any "
        "high-water mark: it queues, or raises a documented error, quickly.",
    ),
    Clause(
        "MSG-5",
        "size limit enforced on both ends",
        "Messages up to the documented size limit arrive; above it send() raises a clear "
        "error and the receiver drops oversize frames.",
    ),
    # Heartbeats under faults
    Clause(
        "HB-1",
        "silent partition detected in the window",
        "A silent partition makes both sides mark the connection dead no earlier than "
        "timeout - interval and no later than timeout + interval + slack.",
        chaos=True,
    ),
    Clause(
        "HB-2",
        "latency below the timeout is no death",
        "Latency and jitter below the heartbeat timeout never cause a false death.",
        chaos=True,
    ),
    Clause(
        "HB-3",
        "latency above the timeout is detected",
        "Latency above the heartbeat timeout is detected like a partition.",
        chaos=True,
    ),
    Clause(
        "HB-4",
        "reset or disabled link detected promptly",
        "A reset or a refused/disabled link is detected promptly.",
        chaos=True,
    ),
    Clause(
        "HB-5",
        "reconnect after heal works both ways",
        "After the fault heals, reconnecting yields a working connection both ways; nothing "
        "sent after the reconnect is lost.",
        chaos=True,
    ),
    Clause(
        "HB-6",
        "sliced and slow links deliver intact",
        "Sliced and bandwidth-limited links deliver messages intact (for messages that can "
        "cross the link within the heartbeat timeout).",
        chaos=True,
    ),
    Clause(
        "HB-7",
        "restart behind a partition",
        "A node restarted behind a partition (same identity, old connection half-open on the "
        "far side) is reachable as soon as the partition heals.",
        chaos=True,
    ),
    # Process faults (nodes in their own processes)
    Clause(
        "PROC-1",
        "a paused node is detected in the heartbeat window",
        "A paused node (SIGSTOP; its kernel keeps TCP alive) is marked dead by its peers "
        "within the heartbeat window; a pause shorter than timeout - interval causes no death.",
        chaos=True,
    ),
    Clause(
        "PROC-2",
        "a resumed node learns and both sides converge",
        "After SIGCONT the paused node learns its connections died, and both sides converge "
        "within the recovery bound; nothing sent after recovery is lost.",
        chaos=True,
    ),
    Clause(
        "PROC-3",
        "a killed node is detected, its replacement reachable",
        "A killed node (SIGKILL) is detected promptly; a replacement process on the same port "
        "is reachable at once.",
        chaos=True,
    ),
    # Resources
    Clause(
        "RES-1",
        "transport close releases everything",
        "Closing the transport releases every socket, descriptor and thread it created, "
        "whatever state its connections are in.",
    ),
    Clause(
        "RES-2",
        "no descriptor growth over reconnect cycles",
        "Long runs of connect/die/reconnect do not grow descriptors.",
    ),
    # Security
    Clause(
        "SEC-1",
        "hostile peers cannot crash, stall or starve",
        "A hostile peer cannot crash, stall or starve the node (POLL-3 plus floods).",
    ),
    Clause(
        "SEC-2",
        "authentication keeps strangers out",
        "Where an implementation declares authentication (CURVE), peers without the right "
        "key get no message through.",
    ),
    Clause(
        "SEC-3",
        "hostile bytes below ZeroMQ are harmless",
        "Raw TCP peers sending random or truncated ZMTP greetings, NULL and CURVE handshakes "
        "with garbage commands, and frames announced past the receive limit (MAXMSGSIZE) "
        "neither crash nor stall the node, never become connections, and cost bounded memory; "
        "honest peers are served throughout.",
    ),
)

