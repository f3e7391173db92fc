"""The reference implementations, one subpackage per contract family.

``p2p`` (the peer-to-peer transport, re-exported here: ``reference_impl:ZmqTransport``
is the default transport under test), ``kv_events`` (publisher and subscriber
of the KV-event stream) and ``control`` (the request/reply control channel).
"""

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
