"""CURVE for the references: key checks, per-socket options, an in-loop ZAP handler.

Every reference (p2p transport, KV-event publisher and subscriber, control
server and client) takes the same keyword arguments, all off by default:

- server side: ``curve_server_secret_key`` plus either
  ``curve_allowed_client_keys`` (the client public keys let in) or
  ``curve_zap_handler`` (a callable ``(client_public_key, address) -> bool``
  deciding per connection);
- client side: ``curve_client_secret_key`` and ``curve_server_key`` (the
  server's public key, pinned: a server without the matching secret cannot
  complete the handshake).

Keys are 40-character Z85 text (``str`` or ``bytes``, what
``zmq.curve_keypair()`` returns) or 32 raw bytes; a public key is derived
from its secret, so a mismatched pair cannot be configured. A key that does
not fit is a :class:`ValueError` naming the option, never the key.

Why a server needs an allow-list or a handler: a CURVE server without ZAP
lets in every client that knows its (public) key, so "authenticated"
would only mean "encrypted". :func:`server_config` refuses that.

Why the ZAP handler runs in the owner's loop (:class:`ZapHandler`) and not
in pyzmq's ``zmq.auth.thread.ThreadAuthenticator``: the authenticator is a
ROUTER bound at ``inproc://zeromq.zap.01`` in the owner's own context, read
without blocking wherever the owner already does its I/O (``poll()``,
``serve()``, the publisher's thread), so authentication adds no thread and
no descriptor beyond one inproc socket, and closes with its owner (RES-1
counts both). The price: a handshake completes when the owner next runs
its loop, which every reference does continuously while it has peers.

Key material never leaves this module in text: the configuration objects'
``repr`` says only that CURVE is on, and nothing here logs a key.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Final, cast

import zmq
from zmq.utils import z85

__all__ = [
    "CurveClient",
    "CurveServer",
    "ZapHandler",
    "ZapPolicy",
    "client_config",
    "server_config",
]

_log = logging.getLogger("reference_impl.curve")

#: ``(client public key as Z85 bytes, peer address) -> allowed?``
ZapPolicy = Callable[[bytes, str], bool]

ZAP_ENDPOINT: Final = "inproc://zeromq.zap.01"
#: The ZAP domain every reference's CURVE server asks for.
ZAP_DOMAIN: Final = b"zmq-conformance"
_Z85_CHARS: Final = 40
_RAW_BYTES: Final = 32
_POLLIN: Final = int(zmq.POLLIN)


def _key(value: object, option: str) -> bytes:
    """``value`` as Z85 bytes, or a ValueError naming ``option`` (never the value)."""
    if isinstance(value, str):
        try:
            value = value.encode("ascii")
        except UnicodeEncodeError:
            raise ValueError(f"{option}: not Z85 text (non-ASCII characters)") from None
    if not isinstance(value, bytes | bytearray | memoryview):
        raise ValueError(
            f"{option} must be a CURVE key: 40 Z85 characters (str or bytes) or 32 raw "
            f"bytes, not a {type(value).__name__}"
        )
    raw = bytes(value)
    if len(raw) == _RAW_BYTES:
        return z85.encode(raw)
    if len(raw) != _Z85_CHARS:
        raise ValueError(
            f"{option} must be a CURVE key: 40 Z85 characters or 32 raw bytes, "
            f"got {len(raw)} bytes"
        )
    try:
        decoded = z85.decode(raw)
    except (ValueError, KeyError, IndexError, TypeError):
        raise ValueError(f"{option}: not valid Z85 text") from None
    if len(decoded) != _RAW_BYTES:
        raise ValueError(f"{option}: not valid Z85 text")
    return raw


def _require_curve(option: str) -> None:
    if not zmq.has("curve"):
        raise ValueError(f"{option}: this libzmq was built without CURVE support")


@dataclass(frozen=True)
class CurveServer:
    """A CURVE server's settings; apply them to a socket before ``bind()``."""

    secret_key: bytes = field(repr=False)
    policy: ZapPolicy = field(repr=False)

    def apply(self, sock: zmq.Socket[bytes]) -> None:
        """Make ``sock`` a CURVE server that asks ZAP about each client. Before bind()."""
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret_key)
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)

    def __repr__(self) -> str:
        return "CurveServer(<keys hidden>)"


@dataclass(frozen=True)
class CurveClient:
    """A CURVE client's settings; apply them to a socket before ``connect()``."""

    secret_key: bytes = field(repr=False)
    public_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)

    def apply(self, sock: zmq.Socket[bytes]) -> None:
        """Make ``sock`` a CURVE client pinned to the server key. Before connect()."""
        sock.setsockopt(zmq.CURVE_SERVERKEY, self.server_key)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public_key)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret_key)

    def __repr__(self) -> str:
        return "CurveClient(<keys hidden>)"


def server_config(
    secret_key: object = None,
    allowed_client_keys: Collection[object] | None = None,
    zap_handler: ZapPolicy | None = None,
) -> CurveServer | None:
    """Check the server-side keywords; ``None`` when CURVE is off (no secret key).

    Raises:
        ValueError: a key does not fit, or the allow-list and the handler are
            both given or both missing while a secret key is (naming the option).
    """
    if secret_key is None:
        if allowed_client_keys is not None or zap_handler is not None:
            raise ValueError("curve_allowed_client_keys / curve_zap_handler need "
                             "curve_server_secret_key (the server's own key)")
        return None
    _require_curve("curve_server_secret_key")
    secret = _key(secret_key, "curve_server_secret_key")
    if (allowed_client_keys is None) == (zap_handler is None):
        raise ValueError(
            "curve_server_secret_key needs exactly one of curve_allowed_client_keys and "
            "curve_zap_handler: without either, every client that knows the server's "
            "public key would get in"
        )
    if zap_handler is not None:
        if not callable(zap_handler):
            raise ValueError("curve_zap_handler must be callable (client_key, address) -> bool")
        return CurveServer(secret, zap_handler)
    assert allowed_client_keys is not None
    if isinstance(allowed_client_keys, str | bytes) or not isinstance(
        allowed_client_keys, Collection
    ):
        raise ValueError("curve_allowed_client_keys must be a collection of public keys")
    allowed = frozenset(
        _key(k, f"curve_allowed_client_keys[{i}]") for i, k in enumerate(allowed_client_keys)
    )
    return CurveServer(secret, _AllowList(allowed))


def client_config(secret_key: object = None, server_key: object = None) -> CurveClient | None:
    """Check the client-side keywords; ``None`` when CURVE is off (neither given).

    Raises:
        ValueError: a key does not fit, or only one of the two is given.
    """
    if secret_key is None and server_key is None:
        return None
    if secret_key is None or server_key is None:
        raise ValueError("curve_client_secret_key and curve_server_key go together (the "
                         "client's own key and the server key it pins)")
    _require_curve("curve_client_secret_key")
    secret = _key(secret_key, "curve_client_secret_key")
    server = _key(server_key, "curve_server_key")
    return CurveClient(secret, zmq.curve_public(secret), server)


@dataclass(frozen=True)
class _AllowList:
    keys: frozenset[bytes] = field(repr=False)

    def __call__(self, client_key: bytes, address: str) -> bool:
        return client_key in self.keys

    def __repr__(self) -> str:
        return f"<allow-list of {len(self.keys)} client keys>"


class ZapHandler:
    """The ZAP authenticator of one context, answered by its owner's loop.

    Bind it *before* any CURVE server socket of the context binds. Call
    :meth:`serve` wherever the owner does I/O (it never blocks), or register
    :attr:`socket` in the owner's poller. ``denied`` counts refused clients.
    """

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], policy: ZapPolicy) -> None:
        self._policy = policy
        self.denied = 0
        self.allowed = 0
        self.socket: zmq.Socket[bytes] = ctx.socket(zmq.ROUTER)
        try:
            self.socket.setsockopt(zmq.LINGER, 0)
            self.socket.bind(ZAP_ENDPOINT)
        except BaseException:
            self.socket.close(linger=0)
            raise

    def serve(self) -> int:
        """Answer every pending ZAP request; return how many."""
        sock = self.socket
        answered = 0
        while cast(int, sock.getsockopt(zmq.EVENTS)) & _POLLIN:
            frames = sock.recv_multipart(zmq.NOBLOCK)
            self._answer(frames)
            answered += 1
        return answered

    def _answer(self, frames: list[bytes]) -> None:
        # [routing id, b"", version, request id, domain, address, identity, mechanism,
        #  credentials...] (RFC 27)
        if len(frames) < 8 or frames[1] != b"":
            return  # not a ZAP request: nothing to answer
        version, request_id, domain, address, mechanism = (
            frames[2], frames[3], frames[4], frames[5], frames[7])
        allowed = False
        if version == b"1.0" and domain == ZAP_DOMAIN and mechanism == b"CURVE" \
                and len(frames) == 9 and len(frames[8]) == _RAW_BYTES:
            client_key = z85.encode(frames[8])
            try:
                allowed = bool(self._policy(client_key, address.decode("utf-8", "replace")))
            except Exception:
                _log.exception("curve_zap_handler raised; the client is refused")
                allowed = False
        if allowed:
            self.allowed += 1
            status, text = b"200", b"OK"
        else:
            self.denied += 1
            if self.denied <= 10 or self.denied % 1000 == 0:
                _log.warning("CURVE: refused a client from %s (%d refused so far)",
                             address.decode("utf-8", "replace"), self.denied)
            status, text = b"400", b"not allowed"
        reply = [frames[0], b"", b"1.0", request_id, status, text, b"", b""]
        with contextlib.suppress(zmq.ZMQError):  # the session asking is gone
            self.socket.send_multipart(reply, zmq.NOBLOCK)

    def close(self) -> None:
        self.socket.close(linger=0)

    def __repr__(self) -> str:
        return f"<ZapHandler allowed={self.allowed} denied={self.denied}>"
