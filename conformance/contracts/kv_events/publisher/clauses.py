"""The clauses of the ``kv-events-publisher`` contract (EVT-1 .. EVT-9).

Texts follow DESIGN.md, "KV-event stream" and "Wire profiles". IDs never
change meaning.
"""

from __future__ import annotations

from typing import Final

from conformance.clauses import Clause, clause_table

__all__ = ["CLAUSES", "CONTRACT"]

CONTRACT: Final = "kv-events-publisher"

CLAUSES: Final[dict[str, Clause]] = clause_table(
    Clause(
        "EVT-1",
        "framing and sequence",
        "Each batch is one [topic, seq, payload] message; seq is 8 bytes big-endian, from 0, "
        "with no gap and no repeat; the payload decodes to exactly what was published.",
    ),
    Clause(
        "EVT-2",
        "every batch once, in order",
        "A connected, reading subscriber gets every batch once, in order.",
    ),
    Clause(
        "EVT-3",
        "publish never blocks",
        "publish() never blocks its caller: no subscriber, a stalled one, a full internal "
        "queue; shedding is reported (error or counter), never silent reordering.",
    ),
    Clause(
        "EVT-4",
        "replay from start, then the end marker",
        "Replay returns every retained batch with seq >= start, in order, byte-identical, "
        "then the end marker; a start older than retention replays from the oldest retained; "
        "a start past the newest gets the end marker alone.",
    ),
    Clause(
        "EVT-5",
        "replay never silently truncated",
        "A replay is never silently truncated (a ROUTER drops at its high-water mark without "
        "ZMQ_ROUTER_MANDATORY): a slow reader gets all of it, or no end marker.",
    ),
    Clause(
        "EVT-6",
        "hostile replay requests are harmless",
        "Hostile replay requests (frame counts, seq not 8 bytes, negative or huge seq, "
        "floods, a requester gone mid-replay) never stop publishing or kill the publisher's "
        "thread; other requesters are served.",
    ),
    Clause(
        "EVT-7",
        "bounded shutdown delivers the queue",
        "Shutdown is bounded, delivers or reports every queued batch, releases sockets, "
        "threads and descriptors; publish() afterwards raises.",
    ),
    Clause(
        "EVT-8",
        "data-parallel ranks do not collide",
        "Publishers of several data-parallel ranks on one host, with the endpoints they "
        "derive from one configuration, all start and each serves its own stream.",
    ),
    Clause(
        "EVT-9",
        "the declared wire profile is exact",
        "The declared replay layout and schema version are exact: every replay answer and "
        "end marker has the declared layout, and every batch has every field the declared "
        "schema version requires, each field typed as specified, and no field the version "
        "does not define.",
    ),
    Clause(
        "EVT-10",
        "strangers get no batch and no replay",
        "Where the publisher declares authentication (CURVE), a subscriber or replay client "
        "without an allowed key receives nothing, neither live batches nor replays, while "
        "authenticated peers are served as usual; no secret key appears in its logs or "
        "reprs.",
    ),
    Clause(
        "EVT-11",
        "hostile bytes on its ports are harmless",
        "Raw TCP peers sending random or truncated ZMTP greetings, NULL and CURVE handshakes "
        "with garbage commands, and frames announced past any receive limit, on the PUB and "
        "the replay port, neither stop publishing nor starve readers and replays, and cost "
        "bounded memory.",
    ),
)
