"""The reference ZeroMQ control transport.

Shape (the one DESIGN.md describes, shared by real transports in the field):

- one ROUTER bound on ``host:port`` receives everything addressed to this node;
- one DEALER per peer sends; its routing identity is this node's
  ``local_id`` plus an incarnation tag (``"host:port#<nonce>.<serial>"``,
  see :func:`parse_routing_id`), so the remote ROUTER knows who is talking
  *and* tells each DEALER of that peer apart;
- a socket monitor per DEALER turns TCP disconnects (including heartbeat
  expiry) into ``alive = False``;
- ZMTP heartbeats on every socket; MessagePack (msgspec) on the wire.

A node keeps at most one connection per peer, whichever side opened it:
messages arriving from peer ``P`` are delivered to the node's registered
connection for ``P``. An inbound connection opens its own DEALER back to the
peer at once, so both directions are heartbeated and both sides notice a
partition.

Why the tag: libzmq's ROUTER keys its routing table by identity. With one
identity per peer, a DEALER closed during a fast reconnect could finish its
handshake after its replacement, and ROUTER_HANDOVER then gave the identity
to the dying connection; the replacement's pipe was renamed to an anonymous
id and every message on it was lost (CONN-7 under flapping). With a distinct
identity per DEALER incarnation there is nothing to hand over: each DEALER
has its own pipe at the ROUTER, and the receiver maps every incarnation of a
peer back to its ``"host:port"``. Because a node holds at most one live
DEALER per peer, an incarnation older than one already heard from is dead;
its late messages are dropped (counted as ``dropped_stale``), so a peer's
messages never arrive out of order across a reconnect. Plain ``"host:port"``
identities (other implementations, raw peers) are still accepted, and
ROUTER_HANDOVER stays on for them and for a DEALER that reconnects itself.

Why receive queues are unbounded (``ZMQ_RCVHWM=0``): libzmq 4.3 aborts the
whole process (``Assertion failed: !_io_error``, stream_engine_base.cpp) when
a connection whose receive queue is full is reset by its peer while ZMTP
heartbeats are on: the reset marks the stopped engine failed, and the next
heartbeat timer writes to it. Any peer that floods faster than ``poll()``
drains and then vanishes triggers it (SEC-1). With no receive limit the
engine never stops reading, so the failing state cannot arise; the price is
that a node which polls slower than its inbound rate buffers in memory
instead of pushing back over TCP. Nothing honest is ever sent to a DEALER,
so whatever a peer's ROUTER sends there is read and discarded in ``poll()``.

Everything happens inside the caller's :meth:`ZmqTransport.poll`; the
transport starts no Python threads. Each transport owns its own
:class:`zmq.Context`, so :meth:`ZmqTransport.close` can release libzmq's I/O
thread and every descriptor.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import secrets
from collections import Counter, deque
from collections.abc import Callable, Collection
from typing import Any, ClassVar, Final, cast

import msgspec
import zmq
from zmq.backend import Socket as _RawSocket

from reference_impl._curve import (
    CurveClient,
    CurveServer,
    ZapHandler,
    ZapPolicy,
    client_config,
    server_config,
)
from reference_impl._monitor import monitor_event
from reference_impl.p2p.interface import (
    ConnectionDeadError,
    ControlConnection,
    ControlTransport,
    DuplicateConnectionError,
    Message,
    MessageTooLargeError,
    SendQueueFullError,
    TransportError,
)

__all__ = ["ZmqConnection", "ZmqTransport", "parse_peer_id", "parse_routing_id"]

_log = logging.getLogger("reference_impl")

#: Defaults, documented in the README. Heartbeats: a PING every second; a peer
#: silent for 3 s is dead. Reconnect quickly (100 ms) but back off to 1 s, and
#: give a handshake 3 s instead of libzmq's 30 s so a blackholed reconnect
#: recovers in bounded time once the fault heals.
DEFAULT_HEARTBEAT_IVL_MS: Final = 1000
DEFAULT_HEARTBEAT_TIMEOUT_MS: Final = 3000
DEFAULT_HEARTBEAT_TTL_MS: Final = 3000
DEFAULT_MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024
DEFAULT_SEND_HWM: Final = 1000
DEFAULT_RECONNECT_IVL_MS: Final = 100
DEFAULT_RECONNECT_IVL_MAX_MS: Final = 1000
DEFAULT_HANDSHAKE_IVL_MS: Final = 3000
#: Upper bound on messages routed by one poll(), so a flooding peer cannot
#: keep poll() from returning (SEC-1).
DEFAULT_POLL_BATCH: Final = 10_000

_MONITOR_EVENTS: Final = zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
_TTL_LIMIT_MS: Final = 6_553_500  # ZMQ_HEARTBEAT_TTL is carried in deciseconds (16 bits)

#: Between a node's ``"host:port"`` and its DEALER's incarnation tag.
INCARNATION_SEPARATOR: Final = "#"
#: Hex digits of the per-transport nonce in the incarnation tag.
_NONCE_HEX: Final = 12
#: libzmq's limit on a routing identity.
_MAX_ROUTING_ID_BYTES: Final = 255
#: Longest incarnation tag appended to ``local_id`` ("#" + nonce + "." + serial).
_TAG_RESERVE: Final = 1 + _NONCE_HEX + 1 + 20
#: The hot paths call pyzmq's compiled socket methods directly, with plain-int
#: flags: the Python layer of ``zmq.Socket`` (``recv_multipart``, ``send``'s
#: keyword handling, enum conversions) costs more than the libzmq call itself
#: for a 64-byte message.
_raw_send = cast(Callable[["zmq.Socket[bytes]", bytes, int, bool], Any], _RawSocket.send)
_raw_recv = cast(Callable[["zmq.Socket[bytes]", int], bytes], _RawSocket.recv)
_raw_get = cast(Callable[["zmq.Socket[bytes]", int], int], _RawSocket.get)
_NOBLOCK: Final = int(zmq.NOBLOCK)
_RCVMORE: Final = int(zmq.RCVMORE)
_EVENTS: Final = int(zmq.EVENTS)
_POLLIN: Final = int(zmq.POLLIN)
#: Payloads at least this large are handed to libzmq without a copy.
_ZERO_COPY_BYTES: Final = 65536
#: ``map(isinstance, keys, _STR)`` checks every key without a Python-level loop.
_STR: Final = itertools.repeat(str)

#: Parsed routing identities kept by raw bytes; cleared when full, so a peer
#: cycling through identities cannot grow it without bound.
_ORIGIN_CACHE_SIZE: Final = 4096

#: Monitor endpoints must never be reused: libzmq releases an inproc address
#: asynchronously, so a name derived from the peer (or from a file descriptor
#: number) collides on a fast reconnect (CONN-7). A process-wide counter does not.
_monitor_serial = itertools.count()


def parse_peer_id(peer_id: str) -> tuple[str, int]:
    """Split ``"host:port"``; raise ``ValueError`` for anything else.

    The port is the text after the last ``:``, so bracketed IPv6 literals
    (``[::1]:5555``) work.
    """
    host, sep, port_text = peer_id.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"peer id must be 'host:port', got {peer_id!r}")
    port = int(port_text)
    if not 0 < port < 65536:
        raise ValueError(f"peer id {peer_id!r}: port out of range")
    return host, port


def parse_routing_id(identity: bytes) -> tuple[str, str, int]:
    """Split a routing identity into ``(peer_id, nonce, serial)``; ``ValueError`` otherwise.

    Two forms are accepted, both UTF-8:

    - ``"host:port"`` (other implementations of the shape, raw peers):
      ``nonce`` is ``""`` and ``serial`` is 0;
    - ``"host:port#<nonce>.<serial>"`` (this transport's DEALERs): ``nonce``
      is 12 lowercase hex digits drawn once per transport, ``serial`` the
      DEALER's number within that transport, counted from 1.

    ``peer_id`` always passes :func:`parse_peer_id`.
    """
    text = identity.decode("utf-8")  # UnicodeDecodeError is a ValueError
    host, sep, port_text = text.rpartition(":")
    if sep and host and port_text.isdigit():
        parse_peer_id(text)
        return text, "", 0
    peer_id, sep, tag = text.rpartition(INCARNATION_SEPARATOR)
    nonce, dot, serial_text = tag.partition(".")
    if (
        not sep
        or not dot
        or len(nonce) != _NONCE_HEX
        or nonce.strip("0123456789abcdef")
        or not (serial_text.isascii() and serial_text.isdigit())
        or serial_text.startswith("0")
    ):
        raise ValueError(f"routing id {identity[:64]!r} is not host:port")
    parse_peer_id(peer_id)
    return peer_id, nonce, int(serial_text)


class ZmqConnection(ControlConnection):
    """A connection to one peer: a DEALER to send, an inbox the ROUTER fills.

    Created by :class:`ZmqTransport` only. ``mark_dead()`` flips the flag and
    nothing else; :meth:`close` releases the DEALER and its monitor whatever
    the flag says (the flag is *not* the guard of ``close()``).
    """

    def __init__(self, transport: ZmqTransport, peer_id: str, *, inbound: bool) -> None:
        self._transport = transport
        self._peer_id = peer_id
        self.inbound = inbound
        self._alive = True
        self._released = False
        self._inbox: deque[Message] = deque()
        #: The newest incarnation of the peer's DEALER heard from, as
        #: (nonce, serial); ("", 0) until a tagged message arrives.
        self._origin_nonce = ""
        self._origin_serial = 0
        self._dealer, self._monitor = transport._open_dealer(peer_id)

    # -- the interface ----------------------------------------------------

    @property
    def peer_id(self) -> str:
        return self._peer_id

    @property
    def alive(self) -> bool:
        return self._alive and not self._released

    def send(self, msg: Message) -> None:
        """Queue ``msg`` for the peer without ever blocking (MSG-4).

        Raises:
            ConnectionDeadError: the connection is dead or closed (CONN-6).
            TypeError: ``msg`` is not a dict or not MessagePack-encodable.
            MessageTooLargeError: the encoding exceeds ``max_message_bytes``.
            SendQueueFullError: ``send_hwm`` messages are already queued
                towards a peer that is not reading; nothing was queued.
        """
        if self._released or not self._alive:
            state = "closed" if self._released else "dead"
            raise ConnectionDeadError(f"send() on {state} connection to {self._peer_id}")
        payload = self._transport._encode(msg)
        try:
            _raw_send(self._dealer, payload, _NOBLOCK, len(payload) < _ZERO_COPY_BYTES)
        except zmq.Again:
            raise SendQueueFullError(
                f"send queue to {self._peer_id} is full ({self._transport.send_hwm} messages); "
                "the peer is not reading"
            ) from None

    def recv(self) -> list[Message]:
        """Everything received since the last call, oldest first (a new list)."""
        received = list(self._inbox)
        self._inbox.clear()
        return received

    def mark_dead(self) -> None:
        self._alive = False

    def close(self) -> None:
        self._alive = False
        self._release()
        self._transport._forget(self)

    # -- used by the transport --------------------------------------------

    def _deliver(self, msg: Message) -> None:
        self._inbox.append(msg)

    def _drain_monitor(self) -> None:
        """Read pending monitor events; a disconnect means the peer is gone.

        Also discards whatever arrived on the DEALER (only a hostile peer
        sends there), so its unbounded receive queue stays empty.
        """
        if self._released:
            return
        monitor = self._monitor
        # Asking for ZMQ_EVENTS is far cheaper than a failed non-blocking
        # receive, which raises; poll() does this for every connection.
        while _raw_get(monitor, _EVENTS) & _POLLIN:
            event = monitor_event(monitor.recv_multipart(_NOBLOCK))
            if event == zmq.EVENT_DISCONNECTED and self._alive:
                _log.info("connection to %s lost", self._peer_id)
                self._alive = False
        dealer = self._dealer
        while _raw_get(dealer, _EVENTS) & _POLLIN:
            _raw_recv(dealer, _NOBLOCK)

    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        # Stop the monitor, close the monitored socket, then the reader: closing
        # the reader first can leave libzmq blocked writing monitor events.
        with contextlib.suppress(zmq.ZMQError):
            self._dealer.disable_monitor()
        self._dealer.close(linger=0)
        self._monitor.close(linger=0)

    def __repr__(self) -> str:
        state = "alive" if self.alive else ("closed" if self._released else "dead")
        side = "inbound" if self.inbound else "outbound"
        return f"<ZmqConnection {side} {self._peer_id} {state}>"


class ZmqTransport(ControlTransport):
    """The reference transport. See the module docstring for the shape.

    Args:
        local_id: ``"host:port"`` by which other nodes reach this node; with
            an incarnation tag it is the routing identity of this node's
            DEALERs, so it may take at most 221 bytes. May differ from the
            bind address, e.g. with a proxy in between.
        host, port: where the ROUTER binds.
        heartbeat_ivl_ms: ZMTP PING interval on every socket.
        heartbeat_timeout_ms: silence after a PING that kills a connection.
        heartbeat_ttl_ms: asks the remote to drop us after this much silence
            (100 ms granularity, at most 6553.5 s).
        max_message_bytes: size limit of one encoded message. ``send()``
            refuses larger ones; the ROUTER drops the connection of a peer
            that sends a larger frame (ZMQ_MAXMSGSIZE).
        send_hwm: messages queued per peer before ``send()`` raises
            :class:`SendQueueFullError`.
        reconnect_ivl_ms, reconnect_ivl_max_ms: libzmq's reconnect backoff.
        handshake_ivl_ms: how long a ZMTP handshake may take; bounds recovery
            when a fault swallows the reconnect (libzmq's default is 30 s).
        poll_batch: most messages one ``poll()`` routes.
        curve_server_secret_key, curve_allowed_client_keys, curve_zap_handler,
        curve_client_secret_key, curve_server_key: CURVE, off by default (see
            :mod:`reference_impl._curve`). With them the ROUTER is a CURVE
            server that lets in only the allowed client keys (or whom the ZAP
            handler allows), and every DEALER is a CURVE client of its peer's
            server key. All five or none: a node is both server and client.
            ZAP requests are answered inside ``poll()``.

    Raises:
        ValueError: an option is out of range, a CURVE key does not fit, or
            ``local_id`` is not ``"host:port"`` or too long.
        zmq.ZMQError: binding ``host:port`` failed (e.g. ``EADDRINUSE``); the
            half-built transport is released first.
    """

    #: The class of every connection this transport creates, outbound and
    #: inbound. A subclass may substitute its own (the self-check mutants do).
    connection_class: ClassVar[type[ZmqConnection]] = ZmqConnection

    #: What this transport declares to the conformance suite.
    zmq_conformance_capabilities: Final = {
        "max_message_bytes": DEFAULT_MAX_MESSAGE_BYTES,
        "heartbeat_configurable": True,
        "detects_peer_close_ms": 2000,
        "authentication": True,
    }

    def __init__(
        self,
        local_id: str,
        host: str,
        port: int,
        *,
        heartbeat_ivl_ms: int = DEFAULT_HEARTBEAT_IVL_MS,
        heartbeat_timeout_ms: int = DEFAULT_HEARTBEAT_TIMEOUT_MS,
        heartbeat_ttl_ms: int = DEFAULT_HEARTBEAT_TTL_MS,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        send_hwm: int = DEFAULT_SEND_HWM,
        reconnect_ivl_ms: int = DEFAULT_RECONNECT_IVL_MS,
        reconnect_ivl_max_ms: int = DEFAULT_RECONNECT_IVL_MAX_MS,
        handshake_ivl_ms: int = DEFAULT_HANDSHAKE_IVL_MS,
        poll_batch: int = DEFAULT_POLL_BATCH,
        curve_server_secret_key: str | bytes | None = None,
        curve_allowed_client_keys: Collection[str | bytes] | None = None,
        curve_zap_handler: ZapPolicy | None = None,
        curve_client_secret_key: str | bytes | None = None,
        curve_server_key: str | bytes | None = None,
    ) -> None:
        parse_peer_id(local_id)
        self._curve_server: CurveServer | None = server_config(
            curve_server_secret_key, curve_allowed_client_keys, curve_zap_handler)
        self._curve_client: CurveClient | None = client_config(
            curve_client_secret_key, curve_server_key)
        if (self._curve_server is None) != (self._curve_client is None):
            raise ValueError("curve_server_secret_key and curve_client_secret_key go together: "
                             "every node is both a CURVE server (ROUTER) and client (DEALERs)")
        if len(local_id.encode()) + _TAG_RESERVE > _MAX_ROUTING_ID_BYTES:
            raise ValueError(
                f"local_id must be at most {_MAX_ROUTING_ID_BYTES - _TAG_RESERVE} bytes "
                "(it is the routing identity, plus an incarnation tag)"
            )
        _require_positive(
            heartbeat_ivl_ms=heartbeat_ivl_ms,
            heartbeat_timeout_ms=heartbeat_timeout_ms,
            heartbeat_ttl_ms=heartbeat_ttl_ms,
            max_message_bytes=max_message_bytes,
            send_hwm=send_hwm,
            reconnect_ivl_ms=reconnect_ivl_ms,
            reconnect_ivl_max_ms=reconnect_ivl_max_ms,
            handshake_ivl_ms=handshake_ivl_ms,
            poll_batch=poll_batch,
        )
        if heartbeat_ttl_ms > _TTL_LIMIT_MS:
            raise ValueError(f"heartbeat_ttl_ms must be at most {_TTL_LIMIT_MS}")
        self.local_id = local_id
        self.host = host
        self.port = port
        self.heartbeat_ivl_ms = heartbeat_ivl_ms
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self.heartbeat_ttl_ms = heartbeat_ttl_ms
        self.max_message_bytes = max_message_bytes
        self.send_hwm = send_hwm
        self.reconnect_ivl_ms = reconnect_ivl_ms
        self.reconnect_ivl_max_ms = reconnect_ivl_max_ms
        self.handshake_ivl_ms = handshake_ivl_ms
        self.poll_batch = poll_batch

        self._nonce = secrets.token_hex(_NONCE_HEX // 2)
        self._dealer_serial = itertools.count(1)
        self._origins: dict[bytes, tuple[str, str, int]] = {}
        self._encoder = msgspec.msgpack.Encoder()
        # Messages are maps with string keys (``Message``); anything else is
        # rejected by the decoder itself, before the caller can see it.
        self._decoder = msgspec.msgpack.Decoder(dict[str, Any])
        self._connections: dict[str, ZmqConnection] = {}
        self._stats: Counter[str] = Counter()  # drops, by reason
        self._accepted = 0
        self._delivered = 0
        self._closed = False

        self._ctx = zmq.Context(io_threads=1)
        self._zap: ZapHandler | None = None
        try:
            if self._curve_server is not None:
                self._zap = ZapHandler(self._ctx, self._curve_server.policy)
            self._router = self._ctx.socket(zmq.ROUTER)
            self._apply_common_options(self._router)
            # A reconnecting peer's new connection takes over its identity at
            # once; without this, libzmq keeps the old (possibly half-open)
            # connection and silently drops the new one's messages.
            self._router.setsockopt(zmq.ROUTER_HANDOVER, 1)
            self._router.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
            self._secure_router(self._router)
            self._router.bind(f"tcp://{_bracket(host)}:{port}")
        except BaseException:
            self._ctx.destroy(linger=0)
            raise

    # -- the interface ----------------------------------------------------

    def connect(self, peer_id: str) -> ZmqConnection:
        """Open a connection to ``peer_id`` (CONN-1..3, CONN-7).

        Raises:
            DuplicateConnectionError: a live connection to ``peer_id`` is
                registered (CONN-2); it is left untouched.
            ValueError: ``peer_id`` is not ``"host:port"`` or is this node.
            TransportError: the transport is closed.
        """
        self._check_open()
        parse_peer_id(peer_id)
        if peer_id == self.local_id:
            raise ValueError(f"cannot connect to self ({peer_id})")
        existing = self._connections.get(peer_id)
        if existing is not None:
            if existing.alive:
                raise DuplicateConnectionError(
                    f"a live connection to {peer_id} is already registered"
                )
            # Dead but not yet swept: retire it now (CONN-3).
            self._retire(existing)
        conn = self.connection_class(self, peer_id, inbound=False)
        self._connections[peer_id] = conn
        return conn

    def poll(self) -> list[ZmqConnection]:
        """Do the I/O; return the inbound connections that are new since last time.

        Order matters: liveness events are read and dead connections retired
        *before* any message is routed, so a reconnecting peer's first message
        opens a new connection instead of vanishing into the dead one (POLL-2).
        """
        self._check_open()
        if self._zap is not None:
            self._zap.serve()
        dead: list[ZmqConnection] = []
        for conn in self._connections.values():
            conn._drain_monitor()
            if not conn.alive:
                dead.append(conn)
        for conn in dead:
            self._retire(conn)

        new: list[ZmqConnection] = []
        router = self._router
        # Idle fast path: ZMQ_EVENTS answers "nothing to read" without the
        # exception a failed non-blocking receive raises.
        if not _raw_get(router, _EVENTS) & _POLLIN:
            return new
        route = self._route
        for _ in range(self.poll_batch):
            try:
                first = _raw_recv(router, _NOBLOCK)
            except zmq.Again:
                break
            # A multipart message is delivered whole: later frames never block.
            if not _raw_get(router, _RCVMORE):
                route([first], new)
                continue
            second = _raw_recv(router, _NOBLOCK)
            if not _raw_get(router, _RCVMORE):
                route([first, second], new)
                continue
            frames = [first, second]
            while _raw_get(router, _RCVMORE):
                frames.append(_raw_recv(router, _NOBLOCK))
            route(frames, new)
        return new

    def close(self) -> None:
        """Release every socket, descriptor and libzmq thread (RES-1). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for conn in list(self._connections.values()):
            conn._alive = False
            conn._release()
        self._connections.clear()
        self._router.close(linger=0)
        if self._zap is not None:
            self._zap.close()
        self._ctx.term()

    # -- extras -----------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Counters of what ``poll()`` dropped or accepted, by reason.

        Keys: ``dropped_frames`` (not exactly identity + payload),
        ``dropped_identity`` (routing id not UTF-8 ``host:port``),
        ``dropped_undecodable``, ``dropped_not_dict`` (not a map with string
        keys), ``dropped_oversize``, ``dropped_stale`` (a late message from a
        DEALER of the peer older than one already heard from),
        ``accepted`` (inbound connections opened), ``delivered`` (messages).
        """
        counts = dict(self._stats)
        if self._accepted:
            counts["accepted"] = self._accepted
        if self._delivered:
            counts["delivered"] = self._delivered
        return counts

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> ZmqTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ZmqTransport {self.local_id} bound {self.host}:{self.port}>"

    # -- internals --------------------------------------------------------

    def _route(self, frames: list[bytes], new: list[ZmqConnection]) -> None:
        """Deliver one inbound message, or drop it with a reason (POLL-3)."""
        if len(frames) != 2:
            self._drop("dropped_frames", f"{len(frames)} frames instead of 2")
            return
        identity, payload = frames
        origin = self._origins.get(identity)
        if origin is None:
            try:
                origin = parse_routing_id(identity)
            except ValueError:
                self._drop("dropped_identity", f"routing id {identity[:64]!r} is not host:port")
                return
            if len(self._origins) >= _ORIGIN_CACHE_SIZE:
                self._origins.clear()
            self._origins[identity] = origin
        peer_id, nonce, serial = origin
        if len(payload) > self.max_message_bytes:
            self._drop("dropped_oversize", f"{len(payload)} bytes from {peer_id}")
            return
        try:
            msg = self._decoder.decode(payload)
        except msgspec.ValidationError as exc:  # well-formed, but not a str-keyed map
            self._drop("dropped_not_dict", f"from {peer_id}: {exc}")
            return
        except Exception as exc:  # msgspec.DecodeError, RecursionError, ...
            self._drop("dropped_undecodable", f"from {peer_id}: {exc}")
            return
        if peer_id == self.local_id:
            self._drop("dropped_identity", "a peer claims this node's own identity")
            return
        conn = self._connections.get(peer_id)
        if conn is None:
            try:
                conn = self.connection_class(self, peer_id, inbound=True)
            except zmq.ZMQError as exc:
                self._drop("dropped_identity", f"cannot connect back to {peer_id}: {exc}")
                return
            self._connections[peer_id] = conn
            self._accepted += 1
            new.append(conn)
        if (serial != conn._origin_serial or nonce != conn._origin_nonce) and _is_stale(
            conn, nonce, serial
        ):
            self._stats["dropped_stale"] += 1
            _log.debug("dropped a late message from a retired DEALER of %s", peer_id)
            return
        conn._inbox.append(msg)  # conn._deliver(msg), without the call
        self._delivered += 1

    def _drop(self, reason: str, detail: str) -> None:
        count = self._stats[reason] + 1
        self._stats[reason] = count
        # Log the first few of each kind, then every thousandth: a flood must
        # not turn into a logging denial of service.
        if count <= 10 or count % 1000 == 0:
            _log.warning("%s: dropped inbound message (%s), %d so far", reason, detail, count)

    def _encode(self, msg: Message) -> bytes:
        if not isinstance(msg, dict):
            raise TypeError(f"a message must be a dict, not {type(msg).__name__}")
        if not all(map(isinstance, msg, _STR)):
            raise TypeError("a message's keys must be strings")
        try:
            payload = self._encoder.encode(msg)
        except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
            raise TypeError(f"message is not MessagePack-encodable: {exc}") from None
        if len(payload) > self.max_message_bytes:
            raise MessageTooLargeError(
                f"encoded message is {len(payload)} bytes; the limit (max_message_bytes) "
                f"is {self.max_message_bytes}"
            )
        return payload

    def _open_dealer(self, peer_id: str) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
        """A DEALER connected to ``peer_id`` plus the PAIR reading its monitor.

        Every option is set before ``connect()``: libzmq copies options into a
        session when it is created and ignores later changes.
        """
        host, port = parse_peer_id(peer_id)
        dealer: zmq.Socket[bytes] = self._ctx.socket(zmq.DEALER)
        monitor: zmq.Socket[bytes] | None = None
        try:
            self._apply_common_options(dealer)
            dealer.setsockopt(zmq.ROUTING_ID, self._routing_id())
            dealer.setsockopt(zmq.SNDHWM, self.send_hwm)
            dealer.setsockopt(zmq.RECONNECT_IVL, self.reconnect_ivl_ms)
            dealer.setsockopt(zmq.RECONNECT_IVL_MAX, self.reconnect_ivl_max_ms)
            self._secure_dealer(dealer)
            monitor = self._attach_monitor(dealer, peer_id)
            dealer.connect(f"tcp://{_bracket(host)}:{port}")
        except BaseException:
            if monitor is not None:
                monitor.close(linger=0)
            dealer.close(linger=0)
            raise
        return dealer, monitor

    def _routing_id(self) -> bytes:
        """The routing identity of a new DEALER: ``local_id`` plus a fresh incarnation tag."""
        serial = next(self._dealer_serial)
        return f"{self.local_id}{INCARNATION_SEPARATOR}{self._nonce}.{serial}".encode()

    def _attach_monitor(self, dealer: zmq.Socket[bytes], peer_id: str) -> zmq.Socket[bytes]:
        """Start ``dealer``'s monitor and return the connected PAIR that reads it.

        The endpoint comes from a process-wide counter, never from ``peer_id``
        or a descriptor number: those are reused by a fast reconnect while
        libzmq still holds the old inproc address (CONN-7).
        """
        endpoint = f"inproc://reference-impl-monitor-{next(_monitor_serial)}"
        dealer.monitor(endpoint, _MONITOR_EVENTS)
        monitor: zmq.Socket[bytes] = self._ctx.socket(zmq.PAIR)
        try:
            monitor.setsockopt(zmq.LINGER, 0)
            monitor.connect(endpoint)
        except BaseException:
            monitor.close(linger=0)
            raise
        return monitor

    def _apply_common_options(self, sock: zmq.Socket[bytes]) -> None:
        sock.setsockopt(zmq.LINGER, 0)
        # Unbounded: a full receive queue plus a peer's reset aborts libzmq
        # under heartbeats (see the module docstring).
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.HEARTBEAT_IVL, self.heartbeat_ivl_ms)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, self.heartbeat_timeout_ms)
        sock.setsockopt(zmq.HEARTBEAT_TTL, self.heartbeat_ttl_ms)
        sock.setsockopt(zmq.HANDSHAKE_IVL, self.handshake_ivl_ms)

    @property
    def authenticated(self) -> bool:
        """Whether CURVE is on (the keys themselves are never exposed)."""
        return self._curve_server is not None

    def _secure_router(self, router: zmq.Socket[bytes]) -> None:
        """CURVE server options on the ROUTER, before ``bind()`` (a no-op when off)."""
        if self._curve_server is not None:
            self._curve_server.apply(router)

    def _secure_dealer(self, dealer: zmq.Socket[bytes]) -> None:
        """CURVE client options on a DEALER, before ``connect()`` (a no-op when off)."""
        if self._curve_client is not None:
            self._curve_client.apply(dealer)

    def _retire(self, conn: ZmqConnection) -> None:
        """Unregister a dead connection and release its sockets; its inbox stays readable."""
        conn._alive = False
        conn._release()
        self._forget(conn)

    def _forget(self, conn: ZmqConnection) -> None:
        if self._connections.get(conn.peer_id) is conn:
            del self._connections[conn.peer_id]

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError(f"transport {self.local_id} is closed")


def _is_stale(conn: ZmqConnection, nonce: str, serial: int) -> bool:
    """Whether a message from DEALER ``(nonce, serial)`` comes from a retired incarnation.

    A node holds at most one live DEALER per peer and numbers them upwards,
    so once ``conn`` has heard from serial ``n`` of a nonce, serials below
    ``n`` of that nonce are closed DEALERs. Otherwise the incarnation becomes
    the newest one: a higher serial, a new nonce (the peer's transport was
    rebuilt; nonces are not ordered, so the latest heard wins), or a plain
    ``"host:port"`` (untracked).
    """
    if not serial:
        return False
    if nonce == conn._origin_nonce and serial < conn._origin_serial:
        return True
    conn._origin_nonce, conn._origin_serial = nonce, serial
    return False


def _bracket(host: str) -> str:
    """IPv6 literals need brackets in a ZeroMQ TCP endpoint."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host


def _require_positive(**values: Any) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
