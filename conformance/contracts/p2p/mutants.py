"""The ``p2p`` self-check catalog: the reference transport with one real defect each.

:data:`CATALOG` lists the mutants ``zmq-conformance self-check`` runs by
default (the classes are in :mod:`conformance.contracts.p2p.transports`),
:data:`RACY` those whose kill depends on timing, and :data:`FAILURE_MODES`
the real-world failure modes they model (the catalog must cover every bug
class DESIGN.md lists).
"""

from __future__ import annotations

from typing import Final

from conformance.selfcheck.mutants import FailureMode, Mutant

__all__ = ["CATALOG", "FAILURE_MODES", "RACY"]

_T = "conformance.contracts.p2p.transports"
_P = "conformance.contracts.p2p.process_transports"


def _modes(*items: FailureMode) -> dict[str, FailureMode]:
    return {m.key: m for m in items}


FAILURE_MODES: Final[dict[str, FailureMode]] = _modes(
    # The bug classes of DESIGN.md.
    FailureMode("assert-on-registered-entry",
                "asserting on any registered entry, so a reconnect in the dead-but-registered "
                "window crashes", design=True),
    FailureMode("per-peer-monitor-endpoint",
                "deriving the inproc monitor endpoint from the peer alone, so a fast reconnect "
                "fails with EADDRINUSE", design=True),
    FailureMode("mark-dead-guards-close",
                "mark_dead() setting the flag close() guards on, so sockets leak", design=True),
    FailureMode("sweep-after-routing",
                "sweeping dead connections only after routing, so a reconnecting peer's first "
                "message is lost", design=True),
    FailureMode("blocking-send-at-hwm",
                "blocking send() once the high-water mark is reached", design=True),
    FailureMode("unguarded-identity-decode",
                "decoding the routing identity outside any error handling, so an anonymous peer "
                "crashes poll()", design=True),
    FailureMode("trusting-colon-in-identity",
                "trusting an identity to contain ':'", design=True),
    FailureMode("non-dict-payload",
                "handing non-dict payloads to the caller", design=True),
    FailureMode("heartbeat-not-applied",
                "heartbeat options not applied, so partitions are never detected", design=True),
    FailureMode("heartbeat-one-side",
                "heartbeat options applied to one side (socket type) only", design=True),
    FailureMode("heartbeat-after-connect",
                "heartbeat options set after bind/connect, where libzmq no longer applies them",
                design=True),
    FailureMode("no-router-handover",
                "no ROUTER handover, so a peer's first messages after a fast reconnect vanish",
                design=True),
    # Further failure modes seen in transports of this shape.
    FailureMode("send-before-ready-dropped",
                "sends before the connection is 'ready' (handshake seen) silently dropped"),
    FailureMode("duplicate-connect-replaces",
                "a duplicate connect() silently replacing the live connection"),
    FailureMode("message-lost-after-reconnect",
                "the first message on a replacement connection lost"),
    FailureMode("message-duplicated-on-reconnect",
                "at-least-once resend on reconnect without de-duplication"),
    FailureMode("retire-leaks",
                "retiring a dead connection without releasing its sockets"),
    FailureMode("mark-dead-discards",
                "mark_dead() discarding messages received but not yet read"),
    FailureMode("lazy-mark-dead",
                "mark_dead() deferred to the next poll()"),
    FailureMode("close-leaks-monitor",
                "close() releasing the DEALER but leaking its monitor socket"),
    FailureMode("close-not-idempotent",
                "close() that raises, or unregisters a successor, when called twice"),
    FailureMode("send-on-dead-accepted",
                "send() checking only for closed, not dead, connections"),
    FailureMode("fd-derived-monitor-endpoint",
                "pyzmq's get_monitor_socket() endpoint from a reused fd number"),
    FailureMode("inbound-reported-twice",
                "an inbound connection announced again after a restart"),
    FailureMode("inbound-reported-early",
                "an inbound connection announced before its first message is readable"),
    FailureMode("hostile-input-raises",
                "poll() raising on malformed frames, MessagePack or sizes"),
    FailureMode("idle-poll-blocks",
                "poll() waiting for traffic when there is none"),
    FailureMode("disconnect-ignored",
                "disconnect events not turned into alive = False (or only after long grace)"),
    FailureMode("unbounded-poll",
                "poll() draining a flood without bound, stalling the caller"),
    FailureMode("lossy-encoding",
                "encodings that change types or values (bin as str, uint64 as int64)"),
    FailureMode("reordering",
                "messages delivered out of order"),
    FailureMode("recv-aliasing",
                "recv() results aliasing internal buffers, or not draining"),
    FailureMode("hidden-size-limit",
                "an undeclared buffer size (64 KiB) above which messages silently vanish"),
    FailureMode("racy-loss",
                "a race that loses a message only sometimes (a failure that does not "
                "reproduce every run)"),
    FailureMode("size-limit-one-side",
                "the size limit enforced on one side only, or not at all"),
    FailureMode("context-leak",
                "transport close() not terminating its ZeroMQ context"),
    FailureMode("context-abandoned",
                "transport close() dropping its sockets and context unclosed, leaving them to "
                "the garbage collector (whose Context.__del__ can block forever)"),
    FailureMode("call-never-returns",
                "a call that waits without a timeout for something that never happens"),
    FailureMode("process-crash",
                "the process killed inside a call (a libzmq assertion, SIGABRT or SIGSEGV)"),
    FailureMode("poll-spins",
                "poll() spinning in a busy loop that never returns"),
    FailureMode("bounded-queue-abort",
                "a bounded receive queue under ZMTP heartbeats: a peer that fills it and "
                "resets makes libzmq 4.3 abort the process (!_io_error)"),
    FailureMode("curve-after-bind",
                "CURVE options set after bind()/connect(), where libzmq no longer applies them"),
    FailureMode("zap-allows-everyone",
                "a ZAP handler that allows every client key"),
    FailureMode("keys-logged",
                "secret keys written to logs, reprs or reports"),
    FailureMode("curve-dropped-on-reconnect",
                "authentication dropped on a socket rebuilt after a reconnect"),
    FailureMode("unbounded-receive-buffer",
                "no receive limit, so a raw peer that announces a huge frame costs memory"),
    FailureMode("heartbeat-partially-applied",
                "HEARTBEAT_IVL set without TIMEOUT/TTL, so the timeout silently equals the "
                "interval"),
    FailureMode("long-handshake-interval",
                "ZMQ_HANDSHAKE_IVL left at 30 s, so a swallowed reconnect stalls recovery"),
    # Failure modes only a node in its own process shows (PROC-1..3).
    FailureMode("tcp-only-liveness",
                "liveness from TCP alone (keepalive, disconnect events): a paused process's "
                "kernel keeps answering, so a hung node is never noticed"),
    FailureMode("stall-hides-disconnects",
                "disconnects after the node's own stall taken for artefacts and dropped, so a "
                "resumed node never learns its peers gave up on it"),
    FailureMode("stale-identity-lock",
                "an identity lock only close() releases, so the replacement of a crashed node "
                "is unreachable until the lock expires"),
)


def _m(name: str, cls: str, description: str, models: str, *clauses: str,
       chaos: bool = False, isolate: bool = False) -> Mutant:
    """A mutant of :mod:`~conformance.contracts.p2p.transports`. Its targeted run shares
    a process with others unless it is chaos or ``isolate`` (its defect outlives its
    tests: a hang, an abort, a spin, a leaked context, a per-process random state)."""
    return Mutant(name, f"{_T}:{cls}", description, models, tuple(clauses), chaos=chaos,
                  isolate=isolate or chaos)


#: The built-in catalog, derived from the reference transport.
CATALOG: Final[tuple[Mutant, ...]] = (
    # -- connection lifecycle
    _m("drops_sends_before_handshake", "DropsSendsBeforeHandshake",
       "send() silently drops messages until poll() has seen the connection's handshake event",
       "send-before-ready-dropped", "CONN-1"),
    _m("duplicate_connect_replaces", "DuplicateConnectReplaces",
       "connect() to a peer with a live connection retires it and returns a new one",
       "duplicate-connect-replaces", "CONN-2"),
    _m("asserts_on_registered_entry", "AssertsOnRegisteredEntry",
       "connect() raises AssertionError whenever an entry is registered, dead or alive",
       "assert-on-registered-entry", "CONN-3"),
    _m("drops_first_send_after_reconnect", "DropsFirstSendAfterReconnect",
       "the first send() on a connection that replaced a dead entry is silently lost",
       "message-lost-after-reconnect", "CONN-3", "HB-5"),
    _m("duplicates_on_reconnect", "DuplicatesOnReconnect",
       "a reconnect re-sends the last message sent on the connection it replaces",
       "message-duplicated-on-reconnect", "MSG-2", "CONN-3"),
    _m("retire_without_release", "RetireWithoutRelease",
       "retiring a dead connection (connect() or the poll() sweep) never closes its sockets",
       "retire-leaks", "CONN-3", "RES-2"),
    _m("mark_dead_discards_inbox", "MarkDeadDiscardsInbox",
       "mark_dead() clears the messages received but not yet read",
       "mark-dead-discards", "CONN-4"),
    _m("mark_dead_is_lazy", "MarkDeadIsLazy",
       "mark_dead() only takes effect at the next poll(); alive stays True until then",
       "lazy-mark-dead", "CONN-4"),
    _m("mark_dead_disables_close", "MarkDeadDisablesClose",
       "mark_dead() sets the 'released' flag close() guards on: close() and the sweep leak "
       "the DEALER and its monitor",
       "mark-dead-guards-close", "CONN-5", "RES-2"),
    _m("close_leaks_monitor", "CloseLeaksMonitor",
       "closing (or retiring) a connection closes the DEALER but leaks the monitor socket",
       "close-leaks-monitor", "CONN-5", "RES-2"),
    _m("close_forgets_by_peer", "CloseForgetsByPeer",
       "close() unregisters by peer id without checking: a second close() raises KeyError",
       "close-not-idempotent", "CONN-5"),
    _m("send_on_dead_queues", "SendOnDeadQueues",
       "send() on a dead (not closed) connection queues the message instead of raising",
       "send-on-dead-accepted", "CONN-6"),
    _m("monitor_endpoint_per_peer", "MonitorEndpointPerPeer",
       "the inproc monitor endpoint is 'inproc://monitor-<peer>', reused on every reconnect",
       "per-peer-monitor-endpoint", "CONN-7", "CONN-3"),
    # -- polling and routing
    _m("reports_twice_after_restart", "ReportsTwiceAfterRestart",
       "an inbound connection from a peer seen before (a restart) is returned by two polls",
       "inbound-reported-twice", "POLL-1"),
    _m("first_message_deferred", "FirstMessageDeferred",
       "a new inbound connection is returned one poll() before its first message is readable",
       "inbound-reported-early", "POLL-1"),
    _m("sweeps_after_routing", "SweepsAfterRouting",
       "poll() routes traffic before retiring connections killed since the last poll",
       "sweep-after-routing", "POLL-2"),
    _m("frame_count_unchecked", "FrameCountUnchecked",
       "poll() unpacks identity and payload without checking the frame count",
       "hostile-input-raises", "POLL-3", "SEC-1"),
    _m("identity_decoded_unguarded", "IdentityDecodedUnguarded",
       "the routing identity is UTF-8-decoded outside any error handling",
       "unguarded-identity-decode", "POLL-3", "SEC-1"),
    _m("trusts_colon_in_identity", "TrustsColonInIdentity",
       "a UTF-8 routing identity is split on ':' and its port parsed without error handling",
       "trusting-colon-in-identity", "POLL-3", "SEC-1"),
    _m("undecodable_payload_raises", "UndecodablePayloadRaises",
       "the MessagePack payload is decoded outside any error handling",
       "hostile-input-raises", "POLL-3", "SEC-1"),
    _m("non_dict_payload_delivered", "NonDictPayloadDelivered",
       "a payload that decodes to a list, str, int, ... is delivered to recv()",
       "non-dict-payload", "POLL-3"),
    _m("oversize_crashes_poll", "OversizeCrashesPoll",
       "no ZMQ_MAXMSGSIZE on the ROUTER; poll() raises MessageTooLargeError on an oversize "
       "frame instead of dropping it",
       "hostile-input-raises", "POLL-3", "MSG-5", "SEC-1"),
    _m("idle_poll_waits", "IdlePollWaits",
       "poll() waits up to 150 ms for traffic when there is none",
       "idle-poll-blocks", "POLL-4"),
    _m("ignores_disconnect_events", "IgnoresDisconnectEvents",
       "monitor events are drained but a disconnect never marks the connection dead",
       "disconnect-ignored", "POLL-5", "HB-1", "HB-4"),
    _m("disconnect_debounced", "DisconnectDebounced",
       "a disconnect marks the connection dead only if no reconnect succeeds within 10 s",
       "disconnect-ignored", "POLL-5", "HB-4"),
    # -- messages
    _m("bytes_arrive_as_str", "BytesArriveAsStr",
       "bytes values are sent as MessagePack str (latin-1), so they arrive as str",
       "lossy-encoding", "MSG-1"),
    _m("large_ints_wrap", "LargeIntsWrap",
       "integers from 2**63 to 2**64-1 are sent as signed int64 and arrive negative",
       "lossy-encoding", "MSG-1"),
    _m("drops_large_undeclared", "DropsLargeMessagesUndeclared",
       "send() silently drops messages encoding to more than 64 KiB; no max_message_bytes "
       "is declared",
       "hidden-size-limit", "MSG-1", "MSG-2"),
    _m("drops_sends_at_random", "DropsSendsAtRandom",
       "send() silently loses about one message in 3000 (fixed-seed generator per process)",
       "racy-loss", "MSG-2", isolate=True),
    _m("reorders_messages", "ReordersMessages",
       "of two sends between polls, the second goes out first",
       "reordering", "MSG-2"),
    _m("recv_returns_shared_list", "RecvReturnsSharedList",
       "recv() returns the same list object each time and refills it, emptying the "
       "caller's previous result",
       "recv-aliasing", "MSG-3"),
    _m("recv_returns_one_at_a_time", "RecvReturnsOneAtATime",
       "recv() returns one message per call instead of everything pending",
       "recv-aliasing", "MSG-3"),
    _m("send_blocks_at_hwm", "SendBlocksAtHwm",
       "send() is a blocking libzmq send: instant below the high-water mark, stuck at it",
       "blocking-send-at-hwm", "MSG-4", isolate=True),
    _m("send_unchecked_size", "SendUncheckedSize",
       "send() does not enforce the size limit; only the receiver's MAXMSGSIZE does",
       "size-limit-one-side", "MSG-5"),
    _m("receiver_accepts_oversize", "ReceiverAcceptsOversize",
       "no receive limit: oversize frames are delivered (only send() checks the size)",
       "size-limit-one-side", "MSG-5"),
    # -- resources
    _m("close_leaks_context", "CloseLeaksContext",
       "transport close() closes every socket but never terminates its context",
       "context-leak", "RES-1", isolate=True),
    _m("close_abandons_context", "CloseAbandonsContext",
       "transport close() closes the ROUTER but leaves DEALERs, monitors and the context "
       "open and drops its references to them",
       "context-abandoned", "RES-1", isolate=True),
    # -- misbehaving processes: each must end in its verdict, never in a hung run
    _m("close_never_returns", "CloseNeverReturns",
       "transport close() waits forever for an answer that never comes",
       "call-never-returns", "CONN-5", "RES-1", isolate=True),
    _m("aborts_in_send", "AbortsInSend",
       "send() on an outbound connection aborts the process (SIGABRT)",
       "process-crash", "CONN-1", "MSG-1", isolate=True),
    _m("poll_spins", "PollSpins",
       "poll() busy-waits forever once a connection is registered",
       "poll-spins", "CONN-1", "POLL-1", isolate=True),
    _m("bounded_receive_queue", "BoundedReceiveQueue",
       "libzmq's default receive high-water mark (1,000) on heartbeated sockets: a peer "
       "that fills the queue and vanishes aborts the process",
       "bounded-queue-abort", "SEC-1", isolate=True),
    # -- authentication
    _m("curve_set_after_bind", "CurveSetAfterBind",
       "the ROUTER's CURVE server options are set after bind(): plain peers get in",
       "curve-after-bind", "SEC-2"),
    _m("zap_allows_everyone", "ZapAllowsEveryone",
       "the ZAP handler allows every client key: any CURVE peer that knows the server key "
       "gets in",
       "zap-allows-everyone", "SEC-2"),
    _m("curve_keys_logged", "CurveKeysLogged",
       "the CURVE secret keys are logged at DEBUG when the transport starts",
       "keys-logged", "SEC-2"),
    _m("curve_dropped_after_reconnect", "CurveDroppedAfterReconnect",
       "a reconnect's DEALER is plain: the peer's CURVE ROUTER refuses it and messages "
       "after the reconnect are lost",
       "curve-dropped-on-reconnect", "SEC-2"),
    _m("no_receive_limit", "NoReceiveLimit",
       "no ZMQ_MAXMSGSIZE on the ROUTER: frames announced past the limit are buffered byte "
       "by byte (poll() still drops them once whole)",
       "unbounded-receive-buffer", "SEC-3"),
    # -- heartbeats under faults (chaos)
    _m("heartbeat_not_applied", "HeartbeatNotApplied",
       "no ZMTP heartbeat option on any socket",
       "heartbeat-not-applied", "HB-1", "HB-3", chaos=True),
    _m("heartbeat_router_only", "HeartbeatRouterOnly",
       "heartbeat options on the ROUTER only; DEALERs (the liveness signal) never PING and "
       "notice a partition only via the remote ROUTER's TTL",
       "heartbeat-one-side", "HB-1", "HB-3", chaos=True),
    _m("heartbeat_timeout_not_set", "HeartbeatTimeoutNotSet",
       "only HEARTBEAT_IVL is set: the timeout defaults to the interval, so latency below "
       "the configured timeout kills connections",
       "heartbeat-partially-applied", "HB-2", "HB-6", chaos=True),
    _m("heartbeat_set_after_connect", "HeartbeatSetAfterConnect",
       "heartbeat options are set after bind()/connect(), where libzmq ignores them",
       "heartbeat-after-connect", "HB-1", "HB-3", chaos=True),
    _m("handshake_ivl_default", "HandshakeIvlDefault",
       "ZMQ_HANDSHAKE_IVL is left at libzmq's 30 s, so a reconnect swallowed by a fault "
       "stalls recovery for 30 s",
       "long-handshake-interval", "HB-5", "HB-7", chaos=True),
    _m("no_router_handover", "NoRouterHandover",
       "the ROUTER runs without ZMQ_ROUTER_HANDOVER: a peer's new connection is ignored "
       "while its old one (half-open after a restart) lingers",
       "no-router-handover", "HB-7", "HB-5", "CONN-3", chaos=True),
    # -- process faults (chaos; each node in its own process)
    Mutant("tcp_keepalive_liveness", f"{_P}:TcpKeepaliveLiveness",
           "TCP keepalive and disconnect events instead of a ZMTP heartbeat: a paused node is "
           "never declared dead (a proxy partition, HB-1, shows it too)",
           "tcp-only-liveness", ("PROC-1", "HB-1"), chaos=True),
    Mutant("stall_suppresses_disconnects", f"{_P}:StallSuppressesDisconnects",
           "disconnects read within a heartbeat timeout after a gap between polls longer than "
           "timeout + interval are dropped: after SIGCONT the node keeps its dead connections",
           "stall-hides-disconnects", ("PROC-2",), chaos=True),
    Mutant("stale_identity_lock", f"{_P}:StaleIdentityLock",
           "a lock file per identity that only close() removes: a killed node's replacement "
           "stays unbound for 30 s",
           "stale-identity-lock", ("PROC-3",), chaos=True),
)

#: Mutants whose defect is real but shows only in a race or under enough load,
#: so a kill is not reproducible. Not run by default; run them with
#: ``--extra conformance.selfcheck.mutants:RACY``.
RACY: Final[tuple[Mutant, ...]] = (
    _m("unbounded_poll_batch", "UnboundedPollBatch",
       "poll() routes until the ROUTER is empty, however long a flood lasts (a stall needs "
       "floods faster than poll() drains them: load-dependent)",
       "unbounded-poll", "SEC-1"),
    _m("monitor_endpoint_from_fd", "MonitorEndpointFromFd",
       "the monitor comes from pyzmq's get_monitor_socket(): 'inproc://monitor.s-<fd>' "
       "collides only when a new DEALER reuses a descriptor number before libzmq's reaper "
       "released the old endpoint",
       "fd-derived-monitor-endpoint", "CONN-7"),
)
