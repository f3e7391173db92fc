"""CURVE keys the suite hands to an implementation that declares ``authentication``.

How the suite turns authentication on (the same for every family): an
implementation whose capabilities say ``authentication=True`` promises that
its factories take these keyword arguments, all Z85 ``bytes`` (40
characters, what ``zmq.curve_keypair()`` returns):

- a server side (p2p ROUTER, KV publisher's PUB and replay ROUTER, control
  server, the engine-pipeline client, which binds every socket):
  ``curve_server_secret_key`` and ``curve_allowed_client_keys`` (a list of
  client public keys to let in; nobody else);
- a client side (p2p DEALERs, KV subscriber, control client, an engine of the
  engine pipeline): ``curve_client_secret_key`` and ``curve_server_key`` (the server public
  key to pin; a server without the matching secret must be refused).

A p2p node is both, so it gets all four. The suite draws fresh keys for each
test (:meth:`SuiteCredentials.generate`): one server key pair and one client
key pair shared by the honest parties of that test (a cluster credential).
Strangers get key pairs of their own. Public keys are public; secret keys
must never appear in an implementation's logs, reprs or in the suite's
reports, which :func:`secrets_in` checks and this module's ``repr``\\ s honour.

What every family's authentication clause (SEC-2, EVT-10, EVS-10, CTL-8,
PIPE-13) meets is the same: a server side is tried by the :func:`strangers`
(a plain client, a CURVE client with a key pair of its own that knows the
real server key; p2p adds strangers of its own), a client side by the
:data:`IMPOSTORS` (a plain server, a CURVE server holding another key), and
no secret may leak (:func:`assert_no_secret_leaked`). How each family's
sockets meet them, and what "refused" means on its wire, stays in its own
tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import zmq
from zmq.utils import z85

__all__ = [
    "CLIENT_KEYWORDS",
    "IMPOSTORS",
    "SERVER_KEYWORDS",
    "KeyPair",
    "Secure",
    "SuiteCredentials",
    "as_client",
    "as_server",
    "assert_no_secret_leaked",
    "curve_client",
    "impostor_server",
    "secrets_in",
    "strangers",
]

SERVER_KEYWORDS: Final = ("curve_server_secret_key", "curve_allowed_client_keys")
CLIENT_KEYWORDS: Final = ("curve_client_secret_key", "curve_server_key")
#: The impostor servers a client side must refuse, by the names tests are parametrised
#: with: one that speaks plain ZMTP, and a CURVE server holding another key than the
#: one the client pins (:func:`impostor_server`).
IMPOSTORS: Final = ("plain", "curve-other-key")

#: What makes a socket, before bind or connect, a CURVE peer (:func:`as_client`,
#: :func:`as_server`); ``None`` where a peer speaks plain ZMTP.
Secure = Callable[[zmq.Socket[bytes]], None]


@dataclass(frozen=True)
class KeyPair:
    """A CURVE key pair (Z85 bytes); its ``repr`` shows neither key."""

    public: bytes = field(repr=False)
    secret: bytes = field(repr=False)

    @classmethod
    def generate(cls) -> KeyPair:
        public, secret = zmq.curve_keypair()
        return cls(public, secret)

    def __repr__(self) -> str:
        return "KeyPair(<hidden>)"


@dataclass(frozen=True)
class SuiteCredentials:
    """The honest parties' keys for one test: a server pair and a client pair."""

    server: KeyPair
    client: KeyPair

    @classmethod
    def generate(cls) -> SuiteCredentials:
        return cls(KeyPair.generate(), KeyPair.generate())

    def server_kwargs(self) -> dict[str, Any]:
        """What a server-side factory is given."""
        return {"curve_server_secret_key": self.server.secret,
                "curve_allowed_client_keys": [self.client.public]}

    def client_kwargs(self) -> dict[str, Any]:
        """What a client-side factory is given."""
        return {"curve_client_secret_key": self.client.secret,
                "curve_server_key": self.server.public}

    def node_kwargs(self) -> dict[str, Any]:
        """What a p2p node (server and client at once) is given."""
        return {**self.server_kwargs(), **self.client_kwargs()}

    def secret_keys(self) -> tuple[bytes, bytes]:
        return self.server.secret, self.client.secret

    def __repr__(self) -> str:
        return "SuiteCredentials(<keys hidden>)"


def _forms(secret: bytes) -> list[str]:
    """The ways a secret key may be written out: Z85, hex, and Python's bytes repr."""
    raw = z85.decode(secret)
    return [secret.decode("ascii"), raw.hex(), repr(raw)[2:-1], repr(secret)[2:-1]]


def secrets_in(text: str, secrets: Iterable[bytes]) -> list[str]:
    """Which of ``secrets`` appear in ``text``, as a hint that names no key.

    Returns entries such as ``"secret key #1 (z85)"``; empty when nothing leaked.
    """
    found: list[str] = []
    names = ("z85", "hex", "raw bytes repr", "z85 bytes repr")
    for index, secret in enumerate(secrets, start=1):
        for name, form in zip(names, _forms(secret), strict=True):
            if form and form in text:
                found.append(f"secret key #{index} ({name})")
                break
    return found


def assert_no_secret_leaked(texts: Iterable[str], secrets: Iterable[bytes], *, clause: str,
                            where: str) -> None:
    """Fail ``clause`` if any of ``secrets`` appears in ``texts`` (logs, reprs, stats).

    The message names which key and in which form (:func:`secrets_in`), never
    the key, and says ``where`` the texts came from ("a log or repr").
    """
    leaked = secrets_in("\n".join(texts), secrets)
    assert not leaked, f"{clause}: {', '.join(leaked)} appeared in {where}"


def as_client(keys: KeyPair, server_key: bytes) -> Secure:
    """A function that makes a socket (before connect) a CURVE client of ``server_key``."""

    def secure(sock: zmq.Socket[bytes]) -> None:
        sock.setsockopt(zmq.CURVE_SERVERKEY, server_key)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)

    return secure


def as_server(keys: KeyPair) -> Secure:
    """A function that makes a socket (before bind) a CURVE server with ``keys``.

    No ZAP handler is involved: it lets in every client that knows its public key,
    which is what an impostor server played by the suite wants.
    """

    def secure(sock: zmq.Socket[bytes]) -> None:
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)

    return secure


def strangers(creds: SuiteCredentials) -> list[tuple[str, Secure | None]]:
    """The clients a server side must refuse, each with the name a failure gives it.

    A plain one (``None``: no CURVE), and a CURVE client with a fresh key pair
    of its own that knows the real server key, so only client authentication
    (the allowed client keys) stops it.
    """
    return [("plain", None),
            ("CURVE with an unknown key", as_client(KeyPair.generate(), creds.server.public))]


def impostor_server(kind: str) -> Secure | None:
    """How the suite's impostor server of ``kind`` (one of :data:`IMPOSTORS`) sets up
    its socket: ``None`` for plain ZMTP, else a CURVE server with a fresh key pair."""
    if kind not in IMPOSTORS:
        raise ValueError(f"unknown impostor {kind!r}; choose one of {', '.join(IMPOSTORS)}")
    return None if kind == "plain" else as_server(KeyPair.generate())


def curve_client(ctx: zmq.Context[Any], kind: int, *, keys: KeyPair, server_key: bytes,
                 **options: Any) -> zmq.Socket[bytes]:
    """A raw CURVE client socket (not connected): the suite's honest or stranger peer."""
    sock: zmq.Socket[bytes] = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    as_client(keys, server_key)(sock)
    for name, value in options.items():
        sock.setsockopt(getattr(zmq, name.upper()), value)
    return sock
