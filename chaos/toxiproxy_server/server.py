"""Running the embedded server: HTTP API listener plus proxies, and a clean stop."""

from __future__ import annotations

import logging

from chaos.toxiproxy_server.api import Api
from chaos.toxiproxy_server.http_server import HttpServer
from chaos.toxiproxy_server.proxy import ProxyCollection

_log = logging.getLogger(__name__)


class EmbeddedServer:
    """The toxiproxy-compatible server inside the running event loop.

    ``await start()`` binds the API (``port`` 0 picks a free port, read it
    from ``port`` afterwards); ``await stop()`` closes every proxy
    listener and connection, then the API.
    """

    def __init__(self, host: str, port: int) -> None:
        self._requested_port = port
        self.collection = ProxyCollection()
        self._http = HttpServer(Api(self.collection))
        self.host = host
        self.port = port

    async def start(self) -> None:
        self.host, self.port = await self._http.start(self.host, self._requested_port)
        _log.info("toxiproxy API listening on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        await self.collection.close()
        await self._http.stop()
