"""An adapter for LMCache 0.5.x's ZMQ request server under the ``control`` contract.

Not part of the package: ``docs/control-lmcache-wire.md`` describes the wire
and the run. The adapter translates no frames: the suite speaks LMCache's own
wire (``--capability wire=lmcache-0.5`` is declared below) to LMCache's own
``MessageQueueServer`` (``lmcache/v1/multiprocess/transport/zmq_impl/mq.py``),
and what that server does with it is the verdict.

``SERVER``: the server bound to the suite's endpoint with the three
management operations LMCache's ``ManagementModule`` serves, registered with
the same signatures (checked by LMCache against its RPC specs) and handler
types (``ping`` on a worker pool, the others inline); their bodies are the
module's answers (``True``, ``"OK"``, a chunk size). The server runs its own
I/O thread (``mq-server-thread``), so there is no ``serve()``: the suite
watches that thread. LMCache's operations are a closed set, so the handlers
the suite adds are not served (``added_handlers`` false). ``SERVER_LEGACY_IDS``
is the same server asked by the frozen legacy ints LMCache's own workers send.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import zmq
from lmcache.v1.multiprocess.request_handler import HandlerType
from lmcache.v1.multiprocess.transport.zmq_impl.mq import MessageQueueServer

_RESULTS = {"PING": "bool", "NOOP": "str", "GET_CHUNK_SIZE": "int"}

CAPABILITIES: dict[str, Any] = {
    "wire": "lmcache-0.5",
    "request_types": {"PING": {"instance_id": None}, "NOOP": {}, "GET_CHUNK_SIZE": {}},
    "request_codes": {"PING": "ping", "NOOP": "noop", "GET_CHUNK_SIZE": "get_chunk_size"},
    "results": dict(_RESULTS),
    "added_handlers": False,
}
#: The same, by LMCache 0.5's frozen legacy ids (``transport/zmq_impl/wire.py``).
LEGACY_CAPABILITIES: dict[str, Any] = {
    **CAPABILITIES, "request_codes": {"PING": 22, "NOOP": 24, "GET_CHUNK_SIZE": 21}}

#: ``ManagementModule.get_chunk_size``'s answer in the default configuration.
CHUNK_SIZE = 256


def ping(instance_id: int | None) -> bool:
    return True


def noop() -> str:
    return "OK"


def get_chunk_size() -> int:
    return CHUNK_SIZE


class Lmcache05Server:
    """LMCache's ``MessageQueueServer`` on the suite's endpoint; ``close()`` stops it."""

    zmq_conformance_capabilities = CAPABILITIES

    def __init__(self, endpoint: str, handlers: Mapping[str, Any]) -> None:
        self._ctx = zmq.Context()
        self._server = MessageQueueServer(endpoint, self._ctx)
        self._server.add_handler("ping", HandlerType.BLOCKING, ping)
        self._server.add_handler("noop", HandlerType.SYNC, noop)
        self._server.add_handler("get_chunk_size", HandlerType.SYNC, get_chunk_size)
        self._server.add_normal_thread_pool(["ping"], max_workers=2)
        self._server.start()

    def close(self) -> None:
        self._server.close()
        self._ctx.destroy(linger=0)


class Lmcache05LegacyIds(Lmcache05Server):
    zmq_conformance_capabilities = LEGACY_CAPABILITIES


class _Implementation:
    def __init__(self, server: Any = None, client: Any = None) -> None:
        self.server, self.client = server, client


SERVER = _Implementation(server=Lmcache05Server)
SERVER_LEGACY_IDS = _Implementation(server=Lmcache05LegacyIds)
