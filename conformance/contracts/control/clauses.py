"""The control-channel clauses CTL-1..9, by stable ID (texts follow ``DESIGN.md``)."""

from __future__ import annotations

from typing import Final

from conformance.clauses import Clause

CLAUSES: Final[dict[str, Clause]] = {
    c.id: c
    for c in (
        Clause(
            "CTL-1",
            "every declared request type succeeds, PING included",
            "Every request type of the declared protocol, PING included, has a handler on the "
            "server and gets a success reply.",
        ),
        Clause(
            "CTL-2",
            "unknown or malformed requests get an error reply",
            "An unknown or malformed request gets an error reply, never silence (a REQ peer "
            "would wait forever); the server keeps serving.",
        ),
        Clause(
            "CTL-3",
            "a raising handler yields an error reply",
            "A handler that raises yields an error reply; the server keeps serving.",
        ),
        Clause(
            "CTL-4",
            "requests to a dead server fail in time; the client recovers",
            "With the server dead or partitioned, requests fail within their timeout; the "
            "client stays usable (no EFSM; lazy-pirate rebuild) and recovers when the server "
            "is back.",
        ),
        Clause(
            "CTL-5",
            "heartbeats detect a silent server; replies matched to requests",
            "Heartbeats mark the server dead within [timeout, timeout + interval + slack] of a "
            "silent partition and alive after the heal; a reply is always matched to its own "
            "request (PINGs never shift replies).",
        ),
        Clause(
            "CTL-6",
            "a restarted server is re-registered with",
            "A restarted server is detected and the client re-synchronises (re-registers) "
            "without help; the next request succeeds.",
        ),
        Clause(
            "CTL-7",
            "slow handlers and vanished clients do not block others",
            "A slow handler or a client that vanished mid-request never blocks other clients "
            "beyond the declared head-of-line policy.",
        ),
        Clause(
            "CTL-8",
            "strangers are not served; impostor servers are refused",
            "Where the implementation declares authentication (CURVE), no request from a "
            "client without an allowed key reaches a handler, and a client given the server's "
            "public key gets no reply from a server without the matching secret (plain, or "
            "CURVE with another key), also after a rebuild; authenticated peers are "
            "unaffected; no secret key appears in logs or reprs.",
        ),
        Clause(
            "CTL-9",
            "hostile bytes on the server's port are harmless",
            "Raw TCP peers sending random or truncated ZMTP greetings, NULL and CURVE "
            "handshakes with garbage commands, frames announced past the receive limit, and "
            "floods from many identities neither stop the server nor starve honest clients, "
            "never reach a handler, and cost bounded memory.",
        ),
    )
}
