"""The control-channel contract (CTL-1..7) and its reference server and client.

``REFERENCE`` is what ``zmq-conformance run --contract control`` tests by
default: an implementation object with a ``server`` and a ``client`` factory
(see :mod:`reference_impl.control.interface`). ``REFERENCE_MQ`` is the same
code speaking the ``lmcache-mq`` wire profile (:mod:`reference_impl.control.wire`),
``REFERENCE_MQ05`` the same on ``lmcache-0.5`` (LMCache 0.5's operation names).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

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
from reference_impl.control.wire import (
    LMCACHE_05,
    LMCACHE_MQ,
    PING_BODY_05,
    REFERENCE_CODES,
    SUITE_OPERATIONS,
)


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


class MqControlServer(ControlServer):
    """The reference server on the ``lmcache-mq`` wire (LMCache 0.4.3's PING code)."""

    zmq_conformance_capabilities: ClassVar[dict[str, Any]] = {
        "request_types": {PING: {}},
        "head_of_line": "serial",
        "wire": LMCACHE_MQ,
        "request_codes": dict(REFERENCE_CODES),
        "results": {PING: "bool"},
    }

    def __init__(self, endpoint: str, handlers: Any = None, **options: Any) -> None:
        options.setdefault("wire", LMCACHE_MQ)
        super().__init__(endpoint, handlers, **options)


class MqControlClient(ControlClient):
    """The reference client on the ``lmcache-mq`` wire."""

    def __init__(self, endpoint: str, **options: Any) -> None:
        options.setdefault("wire", LMCACHE_MQ)
        super().__init__(endpoint, **options)


class Mq05ControlServer(ControlServer):
    """The reference server on the ``lmcache-0.5`` wire: operations by name (``"ping"``)."""

    zmq_conformance_capabilities: ClassVar[dict[str, Any]] = {
        "request_types": {PING: dict(PING_BODY_05)},
        "head_of_line": "serial",
        "wire": LMCACHE_05,
        "request_codes": dict(SUITE_OPERATIONS),
        "results": {PING: "bool"},
    }

    def __init__(self, endpoint: str, handlers: Any = None, **options: Any) -> None:
        options.setdefault("wire", LMCACHE_05)
        super().__init__(endpoint, handlers, **options)


class Mq05ControlClient(ControlClient):
    """The reference client on the ``lmcache-0.5`` wire."""

    def __init__(self, endpoint: str, **options: Any) -> None:
        options.setdefault("wire", LMCACHE_05)
        super().__init__(endpoint, **options)


REFERENCE = ControlImplementation(server=ControlServer, client=ControlClient)
REFERENCE_MQ = ControlImplementation(server=MqControlServer, client=MqControlClient)
REFERENCE_MQ05 = ControlImplementation(server=Mq05ControlServer, client=Mq05ControlClient)

__all__ = [
    "PING",
    "REFERENCE",
    "REFERENCE_MQ",
    "REFERENCE_MQ05",
    "ClientClosed",
    "ControlClient",
    "ControlError",
    "ControlImplementation",
    "ControlServer",
    "Handler",
    "Message",
    "Mq05ControlClient",
    "Mq05ControlServer",
    "MqControlClient",
    "MqControlServer",
    "RequestRejected",
    "RequestTimeout",
    "is_error_reply",
]
