"""The interface of a ZeroMQ control transport and the reference implementation."""

from reference_impl.interface import (
    ConnectionDeadError,
    ControlConnection,
    ControlTransport,
    DuplicateConnectionError,
    Message,
    MessageTooLargeError,
    SendQueueFullError,
    TransportError,
)
from reference_impl.transport import ZmqConnection, ZmqTransport

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
