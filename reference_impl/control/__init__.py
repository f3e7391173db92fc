"""The control-channel contract (CTL-1..7) and its reference server and client.

``REFERENCE`` is what ``zmq-conformance run --contract control`` tests by
default: an implementation object with a ``server`` and a ``client`` factory
(see :mod:`reference_impl.control.interface`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reference_impl.control.client import ControlClient
from reference_impl.control.interface import (
    PING,
    ClientClosed,
    ControlError,
    Handler,
    Message,
    RequestRejected,
    RequestTimeout,
    is_error_reply,
)
from reference_impl.control.server import ControlServer


@dataclass(frozen=True)
class ControlImplementation:
    """A control-channel implementation: a server factory, a client factory, or both.

    A side left ``None`` is not under test; the suite plays it with the
    reference. Calling it returns itself: the conformance CLI takes any
    ``MODULE:ATTR`` that is an implementation or a zero-argument callable
    returning one.
    """

    server: Any = None
    client: Any = None

    def __call__(self) -> ControlImplementation:
        return self


REFERENCE = ControlImplementation(server=ControlServer, client=ControlClient)

__all__ = [
    "PING",
    "REFERENCE",
    "ClientClosed",
    "ControlClient",
    "ControlError",
    "ControlImplementation",
    "ControlServer",
    "Handler",
    "Message",
    "RequestRejected",
    "RequestTimeout",
    "is_error_reply",
]
