"""Adapters for LMCache 0.4.x's multiprocess message queue under the ``control`` contract.

Not part of the package: ``docs/adapters.md`` shows this file, and the
optional tox env ``thirdparty-control`` runs the gate with it against the
LMCache wheel from PyPI. The adapters translate no frames: the suite speaks
LMCache's own wire (``--capability wire=lmcache-mq`` is declared below) to
LMCache's own server, and what LMCache does with it is the verdict.

- ``BLEND_V2``: ``lmcache.v1.multiprocess.blend_server_v2.run_cache_server``
  as LMCache starts it (its ``MessageQueueServer``, its handler
  registrations), bound to the suite's endpoint. The server runs its own I/O
  thread, so the adapter has no ``serve()``; the suite watches that thread.
- ``MQ_CLIENT``: LMCache's ``MessageQueueClient`` behind the client
  interface, with the heartbeat LMCache's vLLM adapter runs (a PING every
  interval; ``alive`` is False once one goes unanswered for the timeout).

Request codes are LMCache's ``RequestType`` values, read from the installed
wheel (they move between releases: PING is 11 in 0.4.2 and 12 in 0.4.3).
LMCache's request types are a closed enum, so the handlers the suite adds
cannot be served (``added_handlers`` false): the clauses that need them are
skipped with that reason.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import zmq
from lmcache.v1.multiprocess.mq import MessageQueueClient
from lmcache.v1.multiprocess.protocol import RequestType, get_response_class

#: The declared types the gate checks: each must succeed with its typed result (CTL-1).
_DECLARED = {"PING": "bool", "NOOP": "str", "GET_CHUNK_SIZE": "int"}

CAPABILITIES: dict[str, Any] = {
    "wire": "lmcache-mq",
    "request_types": {name: {} for name in _DECLARED},
    "request_codes": {t.name: t.value for t in RequestType},
    "results": dict(_DECLARED),
    "added_handlers": False,
}


class BlendServerV2:
    """``blend_server_v2.run_cache_server`` on the suite's endpoint; ``close()`` stops it."""

    zmq_conformance_capabilities = CAPABILITIES

    def __init__(self, endpoint: str, handlers: Mapping[str, Any]) -> None:
        from lmcache.v1.distributed.config import parse_args_to_config
        from lmcache.v1.multiprocess import blend_server_v2 as blend
        from lmcache.v1.multiprocess.config import MPServerConfig

        where = urlsplit(endpoint)
        mp_config = MPServerConfig(host=where.hostname or "127.0.0.1", port=where.port or 0)
        args = _default_args(blend)
        self._server, self._engine = blend.run_cache_server(
            mp_config, parse_args_to_config(args), *_observability_configs(blend, args),
            return_engine=True)

    def close(self) -> None:
        self._server.close()
        close = getattr(self._engine, "close", None)
        if close is not None:
            close()


def _default_args(blend: Any) -> Any:
    """The server's command-line defaults (its ``parse_args()`` reads ``sys.argv``)."""
    quiet = ("--disable-observability" if hasattr(blend, "parse_args_to_observability_config")
             else "--disable-prometheus")  # no metrics HTTP port per server instance
    saved = sys.argv
    sys.argv = ["blend_server_v2", "--l1-size-gb", "1", "--eviction-policy", "LRU", quiet]
    try:
        return blend.parse_args()
    finally:
        sys.argv = saved


def _observability_configs(blend: Any, args: Any) -> tuple[Any, ...]:
    """0.4.2 takes (prometheus_config, telemetry_config), 0.4.3 one obs_config."""
    if hasattr(blend, "parse_args_to_observability_config"):
        return (blend.parse_args_to_observability_config(args),)
    return (blend.parse_args_to_prometheus_config(args),
            blend.parse_args_to_telemetry_config(args))


class MqClient:
    """LMCache's ``MessageQueueClient`` behind the contract's client interface."""

    zmq_conformance_capabilities = CAPABILITIES

    def __init__(self, endpoint: str, *, heartbeat_ivl_ms: int, heartbeat_timeout_ms: int,
                 request_timeout_ms: int,
                 register: tuple[str, Mapping[str, Any]] | None = None) -> None:
        self._ctx = zmq.Context()
        self._client = MessageQueueClient(endpoint, self._ctx)
        self._ivl, self._hb = heartbeat_ivl_ms / 1000, heartbeat_timeout_ms / 1000
        self._timeout = request_timeout_ms / 1000
        self._ping: tuple[Any, float] | None = None
        self._next_ping = time.monotonic()
        self.alive = True

    def request(self, type: str, body: Mapping[str, Any]) -> Any:
        kind = RequestType[type]
        future = self._client.submit_request(kind, list(body.values()),
                                             get_response_class(kind))
        return future.result(timeout=self._timeout)  # TimeoutError after the request timeout

    def tick(self) -> None:
        now = time.monotonic()
        if self._ping is not None:
            future, sent = self._ping
            if future.query():
                self.alive, self._ping = bool(future.result()), None
            elif now - sent >= self._hb:
                self.alive, self._ping = False, None
        if self._ping is None and now >= self._next_ping:
            kind = RequestType.PING
            self._ping = (self._client.submit_request(kind, [], get_response_class(kind)), now)
            self._next_ping = now + self._ivl

    def close(self) -> None:
        self._client.close()
        self._ctx.term()


class _Implementation:
    def __init__(self, server: Any = None, client: Any = None) -> None:
        self.server, self.client = server, client


BLEND_V2 = _Implementation(server=BlendServerV2)
MQ_CLIENT = _Implementation(client=MqClient)
