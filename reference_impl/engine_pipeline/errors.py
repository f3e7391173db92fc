"""The typed errors of the engine pipeline (both sides).

The suite only needs "an ``Exception``" from an implementation under test;
the reference raises these so that a caller can tell a dead engine from a
timeout from its own mistake.
"""

from __future__ import annotations

__all__ = [
    "AddressInUse",
    "ClientClosed",
    "DuplicateRequest",
    "EngineDead",
    "EngineFatal",
    "HandshakeRefused",
    "HandshakeTimeout",
    "MessageTooLarge",
    "PipelineError",
    "ReadyTimeout",
    "UtilityFailed",
    "UtilityTimeout",
]


class PipelineError(Exception):
    """Base of every error the reference pipeline raises on purpose."""


class EngineDead(PipelineError):
    """An engine died (or stopped answering): every waiter is released with this."""


class ClientClosed(PipelineError):
    """The client was closed (or is closing): nothing more is sent or awaited."""


class ReadyTimeout(PipelineError, TimeoutError):
    """Not every expected engine said READY within the ready deadline."""


class HandshakeTimeout(PipelineError, TimeoutError):
    """An engine got no answer to its HELLO within the handshake deadline."""


class HandshakeRefused(PipelineError):
    """A client refused an engine's HELLO (unknown or duplicate engine index)."""


class MessageTooLarge(PipelineError, ValueError):
    """A request whose encoding exceeds ``max_message_bytes``: refused, never truncated."""


class DuplicateRequest(PipelineError, ValueError):
    """``add()`` with the id of a request still in flight."""


class UtilityFailed(PipelineError):
    """The engine ran the utility and it raised; the message is the engine's."""


class UtilityTimeout(PipelineError, TimeoutError):
    """No result of a utility call within its ``timeout_ms``."""


class AddressInUse(PipelineError, OSError):
    """An address another live pipeline holds (an ipc path is never taken over)."""


class EngineFatal(PipelineError):
    """The engine's own loop failed; it told its clients (ENGINE_CORE_DEAD) and ends."""
