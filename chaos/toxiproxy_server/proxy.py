"""A proxy (listener + upstream + toxics + live connections) and the proxy collection.

Behaviour mirrors toxiproxy's: a proxy listening on port 0 reports the
port it got in ``listen`` and listens there again when re-enabled;
disabling closes the listener *and* every live connection; changing
``listen`` or ``upstream`` restarts the proxy (dropping connections);
toxics apply to live connections as well as new ones; an accepted client
whose upstream cannot be reached is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

from chaos.toxiproxy_server.errors import (
    ApiError,
    missing_field,
    proxy_exists,
    proxy_not_found,
    toxic_exists,
    toxic_not_found,
)
from chaos.toxiproxy_server.link import Connection
from chaos.toxiproxy_server.toxics import Stream, Toxic

_log = logging.getLogger(__name__)

_UPSTREAM_CONNECT_TIMEOUT_S = 10.0


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` / ``"[v6]:port"`` / ``":port"`` -> (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep:
        raise ValueError(f"address {address!r} has no port")
    host = host.strip("[]")
    return host, int(port)


def _format_address(sockname: tuple[object, ...]) -> str:
    host, port = str(sockname[0]), int(str(sockname[1]))
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _wildcard(port: int) -> list[tuple[int, int, int, str, tuple[str, int]]]:
    """Go's ``net.Listen("tcp", ":port")``: dual-stack ``[::]``, else IPv4's 0.0.0.0."""
    return [
        (socket.AF_INET6, socket.SOCK_STREAM, 0, "", ("::", port)),
        (socket.AF_INET, socket.SOCK_STREAM, 0, "", ("0.0.0.0", port)),
    ]


def _bind(listen: str) -> socket.socket:
    """Listen on ``listen``; empty means every interface, as toxiproxy does."""
    try:
        host, port = split_address(listen or ":0")
    except ValueError as exc:
        raise ApiError(f"listen {listen!r}: {exc}", 400) from None
    try:
        infos = (
            socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            if host
            else _wildcard(port)
        )
        family, type_, proto, _, addr = infos[0]
        try:
            sock = socket.socket(family, type_, proto)
        except OSError:
            if host or len(infos) < 2:
                raise
            family, type_, proto, _, addr = infos[1]  # no IPv6 on this host
            sock = socket.socket(family, type_, proto)
        try:
            if family == socket.AF_INET6 and not host:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(128)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
    except OSError as exc:
        raise ApiError(f"listen tcp {listen}: {exc.strerror or exc}", 500) from None
    return sock


class Proxy:
    """One named proxy."""

    def __init__(self, name: str, listen: str, upstream: str) -> None:
        self.name = name
        self.listen = listen
        self.upstream = upstream
        self.enabled = False
        self._toxics: dict[str, Toxic] = {}
        self._server: asyncio.Server | None = None
        self._connections: set[Connection] = set()
        self._pending: set[asyncio.Task[None]] = set()

    # -- JSON ---------------------------------------------------------------

    def toxics(self) -> list[Toxic]:
        """Upstream toxics first, then downstream, each in insertion order."""
        order = {Stream.UPSTREAM: 0, Stream.DOWNSTREAM: 1}
        return sorted(self._toxics.values(), key=lambda t: order[t.stream])

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            # toxiproxy 2.12's Proxy struct has an exported ``Logger
            # *zerolog.Logger`` without a json tag and no exported fields, so
            # encoding/json writes it as an empty object, in this place.
            "Logger": {},
            "toxics": [t.to_json() for t in self.toxics()],
        }

    # -- lifecycle ----------------------------------------------------------

    async def start(self) -> None:
        """Listen (no-op when enabled). Raises ``ApiError`` when the bind fails."""
        if self.enabled:
            return
        sock = _bind(self.listen)
        self.listen = _format_address(sock.getsockname())
        self._server = await asyncio.start_server(self._accept, sock=sock)
        self.enabled = True
        _log.info("proxy %s listening on %s -> %s", self.name, self.listen, self.upstream)

    async def stop(self) -> None:
        """Stop listening and close every live connection (no-op when disabled)."""
        if not self.enabled:
            return
        self.enabled = False
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for task in list(self._pending):
            task.cancel()
        for conn in list(self._connections):
            conn.close()
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2.0)
        _log.info("proxy %s stopped", self.name)

    async def update(self, *, listen: str, upstream: str, enabled: bool) -> None:
        if listen != self.listen or upstream != self.upstream:
            was_enabled = self.enabled
            await self.stop()
            self.listen, self.upstream = listen, upstream
            if was_enabled and enabled:
                await self.start()
                return
        if enabled and not self.enabled:
            await self.start()
        elif not enabled and self.enabled:
            await self.stop()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._pending.add(task)
        try:
            host, port = split_address(self.upstream)
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(host, port), _UPSTREAM_CONNECT_TIMEOUT_S
            )
        except (OSError, ValueError, TimeoutError) as exc:
            _log.warning("proxy %s: upstream %s unreachable: %s", self.name, self.upstream, exc)
            writer.close()
            return
        except asyncio.CancelledError:
            writer.close()
            raise
        finally:
            self._pending.discard(task)
        if not self.enabled:
            writer.close()
            up_writer.close()
            return
        conn = Connection(
            (reader, writer), (up_reader, up_writer), self.toxics(), self._connections.discard
        )
        self._connections.add(conn)
        conn.start()

    # -- toxics -------------------------------------------------------------

    def get_toxic(self, name: str) -> Toxic:
        try:
            return self._toxics[name]
        except KeyError:
            raise toxic_not_found() from None

    def add_toxic(self, toxic: Toxic) -> None:
        if toxic.name in self._toxics:
            raise toxic_exists()
        self._toxics[toxic.name] = toxic
        for conn in list(self._connections):
            conn.add_toxic(toxic)

    def update_toxic(self, toxic: Toxic) -> None:
        self._toxics[toxic.name] = toxic
        for conn in list(self._connections):
            conn.update_toxic(toxic)

    def remove_toxic(self, name: str) -> None:
        toxic = self._toxics.pop(name, None)
        if toxic is None:
            raise toxic_not_found()
        for conn in list(self._connections):
            conn.remove_toxic(toxic)

    def remove_all_toxics(self) -> None:
        for name in list(self._toxics):
            self.remove_toxic(name)


class ProxyCollection:
    """All proxies of the server, by name."""

    def __init__(self) -> None:
        self._proxies: dict[str, Proxy] = {}

    def all(self) -> list[Proxy]:
        return list(self._proxies.values())

    def get(self, name: str) -> Proxy:
        try:
            return self._proxies[name]
        except KeyError:
            raise proxy_not_found() from None

    async def create(self, name: str, listen: str, upstream: str, *, enabled: bool) -> Proxy:
        if not name:
            raise missing_field("name")
        if not upstream:
            raise missing_field("upstream")
        if name in self._proxies:
            raise proxy_exists()
        proxy = Proxy(name, listen, upstream)
        if enabled:
            await proxy.start()
        self._proxies[name] = proxy
        return proxy

    async def add_or_replace(
        self, name: str, listen: str, upstream: str, *, enabled: bool
    ) -> Proxy:
        """``/populate`` semantics: keep a proxy whose listen and upstream match."""
        existing = self._proxies.get(name)
        if existing is not None:
            if existing.listen == listen and existing.upstream == upstream:
                return existing
            await self.remove(name)
        return await self.create(name, listen, upstream, enabled=enabled)

    async def remove(self, name: str) -> None:
        proxy = self.get(name)
        await proxy.stop()
        self._proxies.pop(name, None)

    async def reset(self) -> None:
        """Enable every proxy and remove every toxic."""
        for proxy in self.all():
            await proxy.start()
            proxy.remove_all_toxics()

    async def close(self) -> None:
        for proxy in self.all():
            await proxy.stop()
