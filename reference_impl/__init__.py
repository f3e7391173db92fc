"""The reference implementations, one subpackage per contract family.

``p2p`` (the peer-to-peer transport, re-exported here: ``reference_impl:ZmqTransport``
is the default transport under test), ``kv_events`` (publisher and subscriber
of the KV-event stream) and ``control`` (the request/reply control channel).

The p2p names are imported on first use (PEP 562), so a process that needs
one family only (an engine process of the engine-pipeline suite) does not
pay for the p2p transport's imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from reference_impl.p2p.transport import ZmqConnection, ZmqTransport

_LAZY = {
    **dict.fromkeys(("ConnectionDeadError", "ControlConnection", "ControlTransport",
                     "DuplicateConnectionError", "Message", "MessageTooLargeError",
                     "SendQueueFullError", "TransportError"), "reference_impl.p2p.interface"),
    **dict.fromkeys(("ZmqConnection", "ZmqTransport"), "reference_impl.p2p.transport"),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'reference_impl' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "ConnectionDeadError",
    "ControlConnection",
    "ControlTransport",
    "DuplicateConnectionError",
    "Message",
    "MessageTooLargeError",
    "SendQueueFullError",
    "TransportError",
    "ZmqConnection",
    "ZmqTransport",
]
