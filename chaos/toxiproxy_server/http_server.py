"""A small HTTP/1.1 server on an asyncio protocol, answering as Go's ``net/http`` does.

The embedded server's API is a handful of JSON calls from one client per
xdist worker, over one kept-alive connection. A general web framework
costs more than the calls themselves: importing aiohttp was a third of the
server's CPU in a chaos run (the server starts once per worker, in a fresh
interpreter) and each request went through its parser, middleware and
response objects. This module parses requests straight from the socket's
bytes and writes each answer in one ``write``.

What it does, as the real toxiproxy's Go server (``net/http``) does:

- HTTP/1.1 keep-alive (HTTP/1.0 closes unless ``Connection: keep-alive``),
  pipelined requests answered in order, ``Connection: close`` honoured and
  echoed;
- bodies by ``Content-Length`` or ``Transfer-Encoding: chunked``; ``Expect:
  100-continue`` gets its interim ``100 Continue``;
- an HTTP/1.1 request without ``Host`` and a malformed request get Go's
  ``400 Bad Request`` answers, and the connection is closed;
- every answer carries ``Date`` after the handler's headers, then
  ``Content-Length`` (none for 204), as Go writes them.

It does not add toxiproxy's random ``X-Toxiproxy-Request-Id`` header.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import email.utils
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

_log = logging.getLogger(__name__)

#: Go's ``http.DefaultMaxHeaderBytes``: a request head larger than this is refused.
MAX_HEAD_BYTES = 1 << 20

REASONS: dict[int, str] = {
    100: "Continue",
    200: "OK",
    201: "Created",
    204: "No Content",
    301: "Moved Permanently",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


@dataclass
class Request:
    """One parsed request: method, decoded path and raw query, lower-case headers, body."""

    method: str
    target: str
    version: str
    headers: dict[str, str]
    body: bytes = b""


@dataclass
class Response:
    """An answer: status, the handler's headers in the order to write them, body."""

    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""


#: Answers a request: at once (a ``Response``), or later (an awaitable of one), so that
#: the calls that need no waiting cost no task.
Handler = Callable[[Request], "Response | Awaitable[Response]"]


class _BadRequest(Exception):
    """The request cannot be parsed: answer ``text`` with ``status`` and close."""

    def __init__(self, text: str, status: int = 400) -> None:
        super().__init__(text)
        self.text = text
        self.status = status


class _DateCache:
    """``Date`` as Go writes it (RFC 1123, GMT), formatted once per second."""

    def __init__(self) -> None:
        self._second = -1
        self._text = ""

    def now(self) -> str:
        second = int(time.time())
        if second != self._second:
            self._second = second
            self._text = email.utils.formatdate(second, usegmt=True)
        return self._text


_DATE = _DateCache()


def _head(
    version: str, response: Response, *, close: bool, keep_alive_10: bool, head_only: bool
) -> bytes:
    """Status line and headers; ``close`` writes ``Connection: close`` (Go does so for an
    HTTP/1.1 request that asked for it, never for HTTP/1.0's implicit close). A ``HEAD``
    answer with no body has no ``Content-Length``, as in Go."""
    status = response.status
    lines = [f"{version} {status} {REASONS.get(status, 'Status')}"]
    lines += [f"{name}: {value}" for name, value in response.headers]
    lines.append(f"Date: {_DATE.now()}")
    if status != 204 and not 100 <= status < 200 and not (head_only and not response.body):
        lines.append(f"Content-Length: {len(response.body)}")
    if close:
        lines.append("Connection: close")
    elif keep_alive_10:
        lines.append("Connection: keep-alive")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("latin-1")


def _find_head_end(buffer: bytearray) -> tuple[int, int]:
    """Where the head ends and the body starts, or (-1, -1); bare LF lines are accepted."""
    crlf = buffer.find(b"\r\n\r\n")
    lf = buffer.find(b"\n\n")
    if crlf >= 0 and (lf < 0 or crlf < lf):
        return crlf, crlf + 4
    if lf >= 0:
        return lf, lf + 2
    return -1, -1


def _parse_head(raw: bytes) -> Request:
    lines = raw.decode("latin-1").replace("\r\n", "\n").split("\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0] or not parts[1] or not parts[2].startswith("HTTP/1."):
        raise _BadRequest("400 Bad Request")
    method, target, version = parts
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise _BadRequest("400 Bad Request")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise _BadRequest("400 Bad Request: malformed MIME header line")
        key = name.lower()
        value = value.strip(" \t")
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    if version == "HTTP/1.1" and "host" not in headers:
        raise _BadRequest("400 Bad Request: missing required Host header")
    return Request(method, target, version, headers)


def _chunked_body(buffer: bytearray, start: int) -> tuple[bytes, int] | None:
    """Decode a chunked body from ``buffer[start:]``: (body, end), or None while incomplete."""
    body = bytearray()
    pos = start
    while True:
        line_end = buffer.find(b"\n", pos)
        if line_end < 0:
            return None
        size_text = bytes(buffer[pos:line_end]).strip().split(b";", 1)[0]
        try:
            size = int(size_text, 16)
        except ValueError:
            raise _BadRequest("400 Bad Request") from None
        pos = line_end + 1
        if size == 0:
            while True:  # trailer lines, up to an empty one
                line_end = buffer.find(b"\n", pos)
                if line_end < 0:
                    return None
                line = bytes(buffer[pos:line_end]).strip()
                pos = line_end + 1
                if not line:
                    return bytes(body), pos
        if len(buffer) < pos + size + 1:
            return None
        body += buffer[pos : pos + size]
        pos += size
        if buffer[pos : pos + 2] == b"\r\n":
            pos += 2
        elif buffer[pos : pos + 1] == b"\n":
            pos += 1
        elif len(buffer) < pos + 2:
            return None
        else:
            raise _BadRequest("400 Bad Request")


class HttpProtocol(asyncio.Protocol):
    """One client connection: parse requests, hand them to ``handler`` in order."""

    def __init__(self, handler: Handler, connections: set[HttpProtocol]) -> None:
        self._handler = handler
        self._connections = connections
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._queue: collections.deque[Request | _BadRequest] = collections.deque()
        self._serving: asyncio.Task[None] | None = None
        self._closing = False
        self._continued = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._connections.discard(self)
        if self._serving is not None:
            self._serving.cancel()

    def close(self) -> None:
        self._closing = True
        if self._transport is not None:
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        self._buffer += data
        try:
            while self._buffer and self._parse_one():
                pass
        except _BadRequest as exc:
            self._buffer.clear()
            self._queue.append(exc)
            self._closing = True  # nothing after a bad request is read
        if self._serving is None:
            self._serve_now()

    def _parse_one(self) -> bool:
        """Move one complete request from the buffer to the queue; False if incomplete."""
        buffer = self._buffer
        head_end, body_start = _find_head_end(buffer)
        if head_end < 0:
            if len(buffer) > MAX_HEAD_BYTES:
                raise _BadRequest("431 Request Header Fields Too Large", 431)
            return False
        request = _parse_head(bytes(buffer[:head_end]))
        headers = request.headers
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._continue(request)
            decoded = _chunked_body(buffer, body_start)
            if decoded is None:
                return False
            request.body, end = decoded
        else:
            length_text = headers.get("content-length", "0") or "0"
            if not length_text.isdigit():
                raise _BadRequest("400 Bad Request: bad Content-Length")
            end = body_start + int(length_text)
            if end > body_start:
                self._continue(request)
            if len(buffer) < end:
                return False
            request.body = bytes(buffer[body_start:end])
        del buffer[:end]
        self._continued = False
        self._queue.append(request)
        return True

    def _continue(self, request: Request) -> None:
        """Answer ``Expect: 100-continue`` once, before the body is sent."""
        if (not self._continued and self._transport is not None
                and request.headers.get("expect", "").lower() == "100-continue"):
            self._continued = True
            self._transport.write(f"{request.version} 100 Continue\r\n\r\n".encode("latin-1"))

    def _serve_now(self) -> None:
        """Answer queued requests in order; the first one whose answer must be awaited
        goes to a task, with every request after it."""
        while self._queue and self._transport is not None:
            item = self._queue.popleft()
            if isinstance(item, _BadRequest):
                self._refuse(item)
                return
            answer = self._call(item)
            if isinstance(answer, Response):
                self._answer(item, answer)
                continue
            self._serving = asyncio.get_running_loop().create_task(self._serve(item, answer))
            return

    async def _serve(self, first: Request, pending: Awaitable[Response]) -> None:
        try:
            self._answer(first, await self._awaited(first, pending))
            while self._queue and self._transport is not None:
                item = self._queue.popleft()
                if isinstance(item, _BadRequest):
                    self._refuse(item)
                    return
                answer = self._call(item)
                if not isinstance(answer, Response):
                    answer = await self._awaited(item, answer)
                self._answer(item, answer)
        finally:
            self._serving = None

    def _refuse(self, bad: _BadRequest) -> None:
        assert self._transport is not None
        self._transport.write(
            f"HTTP/1.1 {bad.text}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Connection: close\r\n\r\n{bad.text}".encode("latin-1"))
        self._transport.close()

    def _call(self, request: Request) -> Response | Awaitable[Response]:
        try:
            return self._handler(request)
        except Exception:
            return self._failed(request)

    async def _awaited(self, request: Request, pending: Awaitable[Response]) -> Response:
        try:
            return await pending
        except asyncio.CancelledError:
            raise
        except Exception:
            return self._failed(request)

    @staticmethod
    def _failed(request: Request) -> Response:
        _log.exception("%s %s failed", request.method, request.target)
        return Response(500, [("Content-Type", "text/plain; charset=utf-8"),
                              ("X-Content-Type-Options", "nosniff")],
                        b"Internal Server Error\n")

    def _answer(self, request: Request, response: Response) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        connection = request.headers.get("connection", "").lower()
        if request.version == "HTTP/1.0":
            keep_alive_10 = "keep-alive" in connection
            close = not keep_alive_10
        else:
            keep_alive_10 = False
            close = "close" in connection
        head = _head(request.version, response, close=close and not keep_alive_10
                     and request.version == "HTTP/1.1", keep_alive_10=keep_alive_10,
                     head_only=request.method == "HEAD")
        transport.write(head if request.method == "HEAD" else head + response.body)
        if close:
            self._closing = True
            self._queue.clear()
            transport.close()


class HttpServer:
    """Listen on ``host``:``port`` (0 = any free port) and answer with ``handler``."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self._server: asyncio.Server | None = None
        self._connections: set[HttpProtocol] = set()

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Bind and listen; returns the bound (host, port)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: HttpProtocol(self._handler, self._connections),
            host, port, reuse_address=True)
        sockname = self._server.sockets[0].getsockname()
        return str(sockname[0]), int(sockname[1])

    async def stop(self) -> None:
        """Stop listening and close every client connection."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for connection in list(self._connections):
            connection.close()
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2.0)
