"""The interface of a ZeroMQ peer-to-peer control transport, with its contract.

Implementations need not inherit these classes: the conformance suite only
duck-types. They exist to state the contract in one place, clause by clause
(IDs as in ``DESIGN.md``), and to give implementers something to subclass.

The model: every node binds one address and is known to the others by a
``local_id`` of the form ``"host:port"``. A node opens an outbound
:class:`ControlConnection` to a peer with :meth:`ControlTransport.connect`
and learns of inbound ones from :meth:`ControlTransport.poll`. All I/O is
driven by the caller's ``poll()``; calls are never concurrent.

On the wire, the sender's DEALER presents a routing identity from which the
receiving ROUTER recovers the sender's ``local_id``: either the plain
``"host:port"`` or ``"host:port#<nonce>.<serial>"``, where the tag names one
DEALER incarnation (the reference uses the tagged form, so two DEALERs of one
node never share an identity and a ROUTER never hands one's identity to the
other). ``peer_id`` is always the ``"host:port"`` part; anything else is not
a peer and is dropped (POLL-3).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

Message = dict[str, Any]


class TransportError(Exception):
    """Base class of the errors a transport raises on purpose."""


class DuplicateConnectionError(TransportError):
    """``connect()`` to a peer that already has a live registered connection (CONN-2)."""


class ConnectionDeadError(TransportError):
    """``send()`` on a connection that is dead or closed (CONN-6)."""


class MessageTooLargeError(TransportError, ValueError):
    """``send()`` of a message whose encoding exceeds the size limit (MSG-5)."""


class SendQueueFullError(TransportError):
    """``send()`` found the outbound queue to the peer full (MSG-4).

    Raised at once instead of blocking; the message was not queued and the
    connection stays usable once the peer drains its queue.
    """


class ControlConnection(abc.ABC):
    """One logical connection to one peer, as seen from one node.

    Contract:

    - ``peer_id`` is the ``"host:port"`` the connection leads to.
    - ``alive`` is True from creation until :meth:`mark_dead` or
      :meth:`close`, or until ``poll()`` notices the peer went away (POLL-5).
    - :meth:`send` never blocks (MSG-4) and raises on a dead or closed
      connection (CONN-6).
    - :meth:`recv` returns every message received since the previous call, in
      order, each exactly once, then an empty sequence (MSG-2, MSG-3).
    - :meth:`mark_dead` flips ``alive`` at once and releases nothing: buffered
      messages stay readable (CONN-4).
    - :meth:`close` is idempotent and releases every resource, also after
      :meth:`mark_dead` (CONN-5).
    """

    @property
    @abc.abstractmethod
    def peer_id(self) -> str: ...

    @property
    @abc.abstractmethod
    def alive(self) -> bool: ...

    @abc.abstractmethod
    def send(self, msg: Message) -> None: ...

    @abc.abstractmethod
    def recv(self) -> Sequence[Message]: ...

    @abc.abstractmethod
    def mark_dead(self) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...


class ControlTransport(abc.ABC):
    """One node: binds ``host:port``, is reached by others at ``local_id``.

    Contract:

    - :meth:`connect` returns a live connection to ``peer_id`` (CONN-1);
      messages sent on it before the remote ever polls are delivered. A
      second ``connect()`` while the registered connection is alive raises
      (CONN-2); if the registered connection is dead but not yet swept it is
      retired and a fresh one returned, and a message sent on it right away
      arrives (CONN-3). Fast connect/die cycles never fail on reused internal
      endpoints (CONN-7).
    - :meth:`poll` does all the I/O. It sweeps connections killed since the
      previous call before routing any traffic (POLL-2), returns each new
      inbound connection exactly once with its first messages readable
      (POLL-1), never raises because of what a peer sent (POLL-3), returns an
      empty sequence quickly when idle (POLL-4) and marks connections to
      peers that went away dead within a bounded time (POLL-5).
    - :meth:`close` releases every socket, descriptor and thread, whatever
      state the connections are in (RES-1).
    """

    @abc.abstractmethod
    def connect(self, peer_id: str) -> ControlConnection: ...

    @abc.abstractmethod
    def poll(self) -> Sequence[ControlConnection]: ...

    @abc.abstractmethod
    def close(self) -> None: ...
