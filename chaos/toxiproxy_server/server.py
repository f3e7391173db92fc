"""Running the embedded server: HTTP API site plus proxies, and a clean stop."""

from __future__ import annotations

import logging

from aiohttp import web

from chaos.toxiproxy_server.api import build_app
from chaos.toxiproxy_server.proxy import ProxyCollection

_log = logging.getLogger(__name__)


class EmbeddedServer:
    """The toxiproxy-compatible server inside the running event loop.

    ``await start()`` binds the API (``port`` 0 picks a free port, read it
    from ``port`` afterwards); ``await stop()`` closes every proxy
    listener and connection, then the API.
    """

    def __init__(self, host: str, port: int) -> None:
        self._host = host
        self._requested_port = port
        self.collection = ProxyCollection()
        self._runner: web.AppRunner | None = None
        self.host = host
        self.port = port

    async def start(self) -> None:
        runner = web.AppRunner(build_app(self.collection), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._requested_port, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        sockname = runner.addresses[0]
        self.host, self.port = str(sockname[0]), int(sockname[1])
        _log.info("toxiproxy API listening on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        await self.collection.close()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
