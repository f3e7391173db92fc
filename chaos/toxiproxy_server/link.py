"""One proxied TCP connection: two links (directions) through their toxic chains.

Each link has a reader task that reads from its source socket, stamping
every chunk with its arrival time, and a writer task that passes each chunk
through the link's toxic runs in order and writes what comes out to the
destination socket. Toxics that delay (latency) wait until *arrival +
delay*, so a delayed link keeps its throughput, as toxiproxy's does. The
toxic chain of a link can change while data flows (toxics are added,
updated and removed through the API and apply to live connections).

Chunking follows toxiproxy's ``link.go``, since a slicer cuts each chunk on
its own and its cost is per slice: reads are of at most 32 KiB (``io.Copy``'s
buffer), and the reader runs at most one chunk ahead of the chunk being
processed (toxiproxy's unbuffered channels: the reader blocks with one
chunk while the hidden noop toxic holds the next), or 1024 more when a
latency toxic, whose input channel is buffered, comes before any toxic
that holds data back. Data that arrives meanwhile waits in the socket and
is read later as a larger chunk. (Without toxics chunk sizes cannot be
observed, and reads are larger, for speed.)

With no toxic, nothing pending and nothing unsent, the reader writes a chunk
itself rather than handing it to the writer task: one event-loop hop per
direction, about what toxiproxy's goroutine hand-offs cost in added round
trip. When the destination is slower, chunks go through the writer task,
so reading the next chunk overlaps waiting for the destination, as it
does across toxiproxy's reader and writer goroutines.

Closing goes one direction at a time, as in toxiproxy's ``link.go``: when
a link's source reaches end of stream (after the toxics saw it: a
``slow_close`` toxic delays it), a write fails, or a toxic ends the link
(``limit_data`` used up, a ``timeout`` expired or removed, ``reset_peer``),
that link closes its *destination* socket, whole (Go's ``Close``, not a
half-close). The other link, reading from that socket, then sees end of
stream, passes on what its toxics still hold (data held by a latency toxic
is delivered), and closes its own destination. A proxy that is disabled or
deleted closes both sockets at once. A connection that had a
``reset_peer`` toxic when it was opened has SO_LINGER 0 on both sockets
(toxiproxy sets it in ``ToxicLink.Start``), so every close of it is a TCP
RST; one added later closes with a FIN.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from chaos.toxiproxy_server.toxics import (
    CHANNEL_BUFFER,
    PASS_THROUGH,
    Emit,
    Stream,
    Toxic,
    ToxicRun,
)

_log = logging.getLogger(__name__)

_READ_SIZE = 32 * 1024
#: Without toxics chunk sizes are not observable: larger reads cost less Python per byte.
_BULK_READ_SIZE = 256 * 1024
_CLOSE_GRACE_S = 2.0


@dataclass
class _Chunk:
    data: bytes
    arrived: float


class _Link:
    """One direction of a connection."""

    def __init__(
        self,
        conn: Connection,
        stream: Stream,
        source: asyncio.StreamReader,
        dest: asyncio.StreamWriter,
        toxics: Iterable[Toxic],
    ) -> None:
        self._conn = conn
        self.stream = stream
        self._source = source
        self._dest = dest
        self._pending: collections.deque[_Chunk | None] = collections.deque()
        self._has_data = asyncio.Event()
        self._has_room = asyncio.Event()
        self._writer_idle = False
        self.ended = False
        self._runs: dict[str, ToxicRun] = {}
        for toxic in toxics:
            self._runs[toxic.name] = ToxicRun(toxic, self)

    def start(self) -> list[asyncio.Task[None]]:
        for run in self._runs.values():
            run.start()
        loop = asyncio.get_running_loop()
        return [loop.create_task(self._read()), loop.create_task(self._write())]

    def stop_runs(self) -> None:
        for run in self._runs.values():
            run.stop(removed=False)

    def close(self) -> None:
        """End this direction: close the destination socket (see the module docstring)."""
        if self.ended:
            return
        self.ended = True
        self._has_room.set()
        self._has_data.set()
        self._conn.link_ended(self, self._dest)

    def add_toxic(self, toxic: Toxic) -> None:
        run = ToxicRun(toxic, self)
        self._runs[toxic.name] = run
        run.start()
        self._has_room.set()  # the reader's allowance may have changed

    def update_toxic(self, toxic: Toxic) -> None:
        old = self._runs.get(toxic.name)
        if old is not None:
            old.stop(removed=False)
        run = ToxicRun(toxic, self, previous=old)
        self._runs[toxic.name] = run  # an existing key keeps its place in the chain
        run.start()
        self._has_room.set()

    def remove_toxic(self, name: str) -> None:
        run = self._runs.pop(name, None)
        if run is not None:
            run.stop(removed=True)
        self._has_room.set()

    def _chain(self) -> list[ToxicRun]:
        return [run for run in self._runs.values() if run.applies]

    def _ahead(self) -> int:
        """How many chunks the reader may hold that the chain has not taken yet.

        One (the hidden noop's), plus the buffers of the toxics' input
        channels up to the first toxic that holds data back: toxics that pass
        every chunk straight on (those that do not apply run as a noop in
        toxiproxy) do not stop the chunks from reaching the next buffer.
        """
        ahead = 1
        for run in self._runs.values():
            ahead += CHANNEL_BUFFER.get(run.toxic.type, 0)
            if run.applies and run.toxic.type not in PASS_THROUGH:
                break
        return ahead

    async def _put(self, chunk: _Chunk | None) -> None:
        while len(self._pending) >= self._ahead() and not self.ended:
            self._has_room.clear()
            await self._has_room.wait()
        self._pending.append(chunk)
        self._has_data.set()

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        dest = self._dest
        try:
            while True:
                data = await self._source.read(_READ_SIZE if self._runs else _BULK_READ_SIZE)
                if not data:
                    break
                if (
                    self._writer_idle
                    and not self._runs
                    and not self._pending
                    and not dest.transport.get_write_buffer_size()
                ):
                    if self.ended:
                        break
                    dest.write(data)  # sent at once; else the writer task drains it
                    continue
                await self._put(_Chunk(data, loop.time()))
        except OSError:
            pass
        await self._put(None)

    async def _write(self) -> None:
        try:
            while not self.ended:
                while not self._pending and not self.ended:
                    self._writer_idle = True
                    self._has_data.clear()
                    await self._has_data.wait()
                self._writer_idle = False
                if self.ended:
                    break
                chunk = self._pending.popleft()
                self._has_room.set()
                chain = self._chain()
                if chunk is None:
                    for run in chain:
                        await run.on_eof()
                    break
                await self._through(chunk.data, chunk.arrived, chain, 0)
        except OSError as exc:
            _log.debug("%s link failed: %s", self.stream, exc)
        self.close()

    async def _through(self, data: bytes, arrived: float, chain: list[ToxicRun], i: int) -> None:
        if self.ended:
            return
        if i == len(chain):
            self._dest.write(data)
            await self._dest.drain()
            return

        async def emit(part: bytes) -> None:
            await self._through(part, arrived, chain, i + 1)

        next_stage: Emit = emit
        await chain[i].on_data(data, arrived, next_stage)


class Connection:
    """A client connection and its upstream connection, with both links."""

    def __init__(
        self,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        toxics: Iterable[Toxic],
        on_closed: Callable[[Connection], None],
    ) -> None:
        self._writers = (client[1], upstream[1])
        self._on_closed = on_closed
        self._closed = False
        self._tasks: list[asyncio.Task[None]] = []
        toxic_list = list(toxics)
        self._lingers_zero = any(t.type == "reset_peer" for t in toxic_list)
        if self._lingers_zero:
            for writer in self._writers:
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
        self._links = {
            Stream.UPSTREAM: _Link(
                self,
                Stream.UPSTREAM,
                client[0],
                upstream[1],
                [t for t in toxic_list if t.stream is Stream.UPSTREAM],
            ),
            Stream.DOWNSTREAM: _Link(
                self,
                Stream.DOWNSTREAM,
                upstream[0],
                client[1],
                [t for t in toxic_list if t.stream is Stream.DOWNSTREAM],
            ),
        }

    @property
    def closed(self) -> bool:
        return self._closed

    def start(self) -> None:
        for link in self._links.values():
            self._tasks.extend(link.start())

    def add_toxic(self, toxic: Toxic) -> None:
        if not self._closed:
            self._links[toxic.stream].add_toxic(toxic)

    def update_toxic(self, toxic: Toxic) -> None:
        if not self._closed:
            self._links[toxic.stream].update_toxic(toxic)

    def remove_toxic(self, toxic: Toxic) -> None:
        if not self._closed:
            self._links[toxic.stream].remove_toxic(toxic.name)

    def close(self) -> None:
        """Close both sockets at once (a disabled or deleted proxy)."""
        if self._closed:
            return
        for link in self._links.values():
            link.ended = True
        for writer in self._writers:
            self._close_socket(writer)
        self._finish()

    def link_ended(self, link: _Link, dest: asyncio.StreamWriter) -> None:
        """``link`` is done: close its destination; the connection ends with both links."""
        if self._closed:
            return
        self._close_socket(dest)
        if all(other.ended for other in self._links.values()):
            self._finish()

    def _close_socket(self, writer: asyncio.StreamWriter) -> None:
        if writer.transport.is_closing():
            return
        if self._lingers_zero:
            writer.transport.abort()  # SO_LINGER 0: the peer gets a TCP RST
            return
        # Flush what is buffered, but never wait forever on a peer that stopped
        # reading: the socket is closed for good after a grace period.
        writer.close()
        asyncio.get_running_loop().call_later(_CLOSE_GRACE_S, writer.transport.abort)

    def _finish(self) -> None:
        self._closed = True
        for link in self._links.values():
            link.stop_runs()
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        self._on_closed(self)
