"""The mutant catalog: deliberately broken transports the suite must catch.

Each :class:`Mutant` names a transport factory (``MODULE:ATTR``) that differs
from a working *base* transport by one documented defect, the real failure
mode it models, and the clauses whose tests must fail against it.
``zmq-conformance self-check`` runs the suite against every entry and reports
which survived: a surviving mutant means a clause test is too weak (or, for a
user's own catalog, that an expected-failure list hides a real bug).

The built-in catalog (:data:`CATALOG`) derives from the reference transport;
the classes live in :mod:`conformance.selfcheck.transports`. Users add their
own with ``--extra MODULE:ATTR`` (an iterable of :class:`Mutant`, or a
callable returning one) or through the entry-point group
``zmq_conformance.mutants`` (see ``docs/mutants.md``).

This module is never imported by the plugin or the suite: self-check is
tooling around the suite, not part of a normal run.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from conformance.clauses import CLAUSES
from conformance.errors import ConfigError
from conformance.spec import DEFAULT_TRANSPORT

__all__ = [
    "CATALOG",
    "ENTRY_POINT_GROUP",
    "FAILURE_MODES",
    "RACY",
    "FailureMode",
    "Mutant",
    "by_name",
    "load_catalog",
    "load_extra",
    "validate",
]

ENTRY_POINT_GROUP: Final = "zmq_conformance.mutants"

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_T = "conformance.selfcheck.transports"
_P = "conformance.selfcheck.process_transports"


@dataclass(frozen=True)
class FailureMode:
    """A real-world way transports of this shape break.

    ``design`` marks the bug classes ``DESIGN.md`` lists under "Bug classes the
    suite must catch"; the catalog must cover each of them.
    """

    key: str
    description: str
    design: bool = False


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
    FailureMode("size-limit-one-side",
                "the size limit enforced on one side only, or not at all"),
    FailureMode("context-leak",
                "transport close() not terminating its ZeroMQ context"),
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


@dataclass(frozen=True)
class Mutant:
    """One catalog entry.

    Attributes:
        name: unique, ``snake_case``; used on the command line (``--mutant``).
        factory: ``MODULE:ATTR`` of the mutant transport factory.
        description: the defect, in one sentence.
        models: a :data:`FAILURE_MODES` key (for user catalogs: any short text).
        clauses: the clause IDs whose tests must fail against the mutant;
            self-check runs the tests of these clauses first.
        chaos: killing it needs the fault-injecting proxy; runs only with
            ``--chaos``.
        base: the unmutated factory it derives from; self-check runs it too and
            it must pass every selected clause.
    """

    name: str
    factory: str
    description: str
    models: str
    clauses: tuple[str, ...]
    chaos: bool = False
    base: str = DEFAULT_TRANSPORT


def _m(name: str, cls: str, description: str, models: str, *clauses: str,
       chaos: bool = False) -> Mutant:
    return Mutant(name, f"{_T}:{cls}", description, models, tuple(clauses), chaos=chaos)


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
       "blocking-send-at-hwm", "MSG-4"),
    _m("send_unchecked_size", "SendUncheckedSize",
       "send() does not enforce the size limit; only the receiver's MAXMSGSIZE does",
       "size-limit-one-side", "MSG-5"),
    _m("receiver_accepts_oversize", "ReceiverAcceptsOversize",
       "no receive limit: oversize frames are delivered (only send() checks the size)",
       "size-limit-one-side", "MSG-5"),
    # -- resources
    _m("close_leaks_context", "CloseLeaksContext",
       "transport close() closes every socket but never terminates its context",
       "context-leak", "RES-1"),
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


def validate(mutants: Sequence[Mutant], *, origin: str = "catalog") -> None:
    """Raise :class:`ConfigError` for a malformed catalog (names, clauses, factories)."""
    seen: set[str] = set()
    for mutant in mutants:
        if not isinstance(mutant, Mutant):
            raise ConfigError(f"{origin}: {mutant!r} is not a conformance.selfcheck.Mutant")
        where = f"{origin}: mutant {mutant.name!r}"
        if not _NAME.match(mutant.name):
            raise ConfigError(f"{where}: names are snake_case ([a-z][a-z0-9_]*)")
        if mutant.name in seen:
            raise ConfigError(f"{where}: duplicate name")
        seen.add(mutant.name)
        if not mutant.clauses:
            raise ConfigError(f"{where}: names no target clause")
        unknown = [c for c in mutant.clauses if c not in CLAUSES]
        if unknown:
            raise ConfigError(
                f"{where}: unknown clause {unknown[0]!r}; known: {', '.join(CLAUSES)}"
            )
        if not mutant.chaos and all(CLAUSES[c].chaos for c in mutant.clauses):
            raise ConfigError(f"{where}: targets only chaos clauses but is not marked chaos")
        for path in (mutant.factory, mutant.base):
            module, sep, attr = path.partition(":")
            if not sep or not module or not attr:
                raise ConfigError(f"{where}: {path!r} is not MODULE:ATTR")


def by_name(mutants: Iterable[Mutant]) -> dict[str, Mutant]:
    return {m.name: m for m in mutants}


def load_extra(path: str, *, option: str = "--extra") -> tuple[Mutant, ...]:
    """Load a user catalog ``MODULE:ATTR``: an iterable of Mutant or a callable returning one."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{option}={path!r}: expected MODULE:ATTR, e.g. mypkg.mutants:CATALOG")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{option}={path!r}: cannot import {module_name!r}: {exc}") from None
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(f"{option}={path!r}: no attribute {attr!r}") from None
    return _as_catalog(target, origin=f"{option}={path!r}")


def _as_catalog(target: Any, *, origin: str) -> tuple[Mutant, ...]:
    if callable(target) and not isinstance(target, Mutant):
        target = target()
    if isinstance(target, Mutant):
        return (target,)
    try:
        items = tuple(target)
    except TypeError:
        raise ConfigError(f"{origin}: expected an iterable of Mutant") from None
    validate(items, origin=origin)
    return items


def _entry_point_catalogs() -> list[tuple[str, tuple[Mutant, ...]]]:
    found: list[tuple[str, tuple[Mutant, ...]]] = []
    for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        origin = f"entry point {point.name} ({point.value}) in {ENTRY_POINT_GROUP}"
        try:
            target = point.load()
        except Exception as exc:
            raise ConfigError(f"{origin}: cannot load: {type(exc).__name__}: {exc}") from None
        found.append((origin, _as_catalog(target, origin=origin)))
    return found


def load_catalog(
    extras: Sequence[str] = (), *, builtin: bool = True, entry_points: bool = True
) -> tuple[Mutant, ...]:
    """The built-in catalog, plus entry-point catalogs, plus ``--extra`` ones (in that order).

    Raises :class:`ConfigError` on a bad extra or a name used twice.
    """
    combined: list[Mutant] = list(CATALOG) if builtin else []
    if entry_points:
        for _origin, items in _entry_point_catalogs():
            combined.extend(items)
    for path in extras:
        combined.extend(load_extra(path))
    validate(combined, origin="combined catalog")
    return tuple(combined)
