"""An embedded toxiproxy-compatible server (HTTP API and TCP proxying on asyncio).

Used by the chaos suite when no real ``toxiproxy-server`` is available. It
speaks toxiproxy 2.x's HTTP API (same endpoints, JSON shapes and status
codes) and implements the toxics the suite needs: latency, bandwidth,
slow_close, timeout, reset_peer, slicer and limit_data. Run it as a
process: ``python -m chaos.toxiproxy_server --host 127.0.0.1 --port 0``
(see ``__main__``), or in a running event loop with ``EmbeddedServer``.
"""

from chaos.toxiproxy_server.api import VERSION
from chaos.toxiproxy_server.server import EmbeddedServer

__all__ = ["VERSION", "EmbeddedServer"]
