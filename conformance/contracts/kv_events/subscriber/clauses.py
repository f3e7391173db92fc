"""The clauses of the ``kv-events-subscriber`` contract (EVS-1 .. EVS-9).

Texts follow DESIGN.md, "KV-event stream" and "Wire profiles". IDs never
change meaning.
"""

from __future__ import annotations

from typing import Final

from conformance.clauses import Clause

__all__ = ["CLAUSES", "CONTRACT"]

CONTRACT: Final = "kv-events-subscriber"

CLAUSES: Final[dict[str, Clause]] = {
    c.id: c
    for c in (
        Clause(
            "EVS-1",
            "every batch once, in order",
            "The application sees every batch once, in seq order: a gap triggers a replay "
            "from last+1; replayed and live duplicates are dropped.",
        ),
        Clause(
            "EVS-2",
            "the end marker is signed -1",
            "The end marker is read as signed -1, never as seq 2**64-1.",
        ),
        Clause(
            "EVS-3",
            "unanswered replays time out; lazy pirate",
            "A replay that gets no answer, or only part of one, times out within a bound; "
            "the subscriber stays usable (rebuilds its replay socket) and retries.",
        ),
        Clause(
            "EVS-4",
            "publisher restarts are recognised",
            "A publisher restart (seq back to 0) is recognised and reported, not discarded "
            "as duplicates.",
        ),
        Clause(
            "EVS-5",
            "garbled frames are skipped",
            "Garbled frames (frame count, short seq, undecodable payload, unknown tag) are "
            "counted and skipped; the subscriber never crashes.",
        ),
        Clause(
            "EVS-6",
            "only the configured topic",
            "Only the configured topic is delivered (empty topic: all).",
        ),
        Clause(
            "EVS-7",
            "silent partitions heal gap-free",
            "(chaos) After a silent partition heals, the subscriber notices (a seq gap or its "
            "own heartbeat) and replays what it missed: nothing lost that the publisher "
            "still retains.",
            chaos=True,
        ),
        Clause(
            "EVS-8",
            "both replay layouts are read",
            "Replay answers in both layouts, [b'', seq, payload] (seq-payload) and [b'', "
            "topic, seq, payload] (topic-seq-payload), told apart by the frame count after "
            "the delimiter, or in the one layout the subscriber declares, are read "
            "correctly; a layout it does not read is named.",
        ),
        Clause(
            "EVS-9",
            "batches of newer producers are read",
            "Batches from a newer producer are accepted: unknown map keys and extra trailing "
            "array elements are ignored, and an event of an unknown type is skipped and "
            "counted while its batch's other events are delivered; the stream goes on.",
        ),
        Clause(
            "EVS-10",
            "an impostor publisher is refused",
            "Where the subscriber declares authentication (CURVE) and is given the "
            "publisher's server key, a publisher without the matching secret key (plain, or "
            "CURVE with another key) delivers nothing to the application, also after the "
            "subscriber rebuilds its sockets; the real publisher's batches arrive as usual; "
            "no secret key appears in its logs or reprs.",
        ),
        Clause(
            "EVS-11",
            "garbage ZMTP from an impostor is harmless",
            "Raw TCP servers on the publisher's endpoints answering every connection with "
            "random or truncated ZMTP greetings, garbage NULL or CURVE handshakes, or a frame "
            "announced past any receive limit, never make poll() raise and deliver nothing; "
            "once the real publisher is back, its batches are delivered.",
        ),
    )
}
