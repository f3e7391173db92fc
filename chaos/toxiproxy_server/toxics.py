"""Toxics: their JSON model, validation, and their effect on one link.

A *toxic* is configured per proxy (``Toxic``: name, type, stream, toxicity,
attributes) and applied to every *link* of that proxy in its stream's
direction: ``upstream`` is client -> upstream server, ``downstream`` is
server -> client. A link is one direction of one proxied connection.

Each (toxic, link) pair gets a ``ToxicRun``: it decides once, by
``toxicity``, whether the toxic applies to that link (toxiproxy rolls the
probability per link), holds per-link state (bytes sent for
``limit_data``, the pacing clock for ``bandwidth``) and implements the
toxic's effect on a chunk of data (``on_data``) and on end of stream
(``on_eof``). Runs are chained in the order the toxics were added: each
run passes what it lets through to the next one with ``emit``.

Semantics follow toxiproxy 2.x (its ``toxics/*.go``): times are milliseconds
except slicer ``delay`` (microseconds); ``bandwidth`` rate is KB/s with
1 KB = 1000 bytes; a ``timeout`` toxic drops data (it does not buffer it)
and closes the connection after ``timeout`` ms, or never when 0; removing
a ``timeout`` toxic closes the links it applied to, because bytes were
dropped and the stream can no longer be trusted; ``reset_peer`` closes the
link ``timeout`` ms after the first data it sees, which is a TCP RST only
on connections opened while it existed (SO_LINGER 0, see ``link.py``).
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from chaos.toxiproxy_server.errors import ApiError, bad_request
from chaos.toxiproxy_server.gojson import Float32, float32


class Stream(enum.StrEnum):
    """Direction a toxic affects."""

    UPSTREAM = "upstream"
    DOWNSTREAM = "downstream"


#: Attribute names and defaults of each supported toxic type (all integers), in
#: the order of the Go struct's fields, which is the order the real server writes them.
TOXIC_ATTRIBUTES: Mapping[str, Mapping[str, int]] = {
    "latency": {"latency": 0, "jitter": 0},
    "bandwidth": {"rate": 0},
    "slow_close": {"delay": 0},
    "timeout": {"timeout": 0},
    "reset_peer": {"timeout": 0},
    "slicer": {"average_size": 0, "size_variation": 0, "delay": 0},
    "limit_data": {"bytes": 0},
}

#: Toxics whose input channel toxiproxy buffers (``GetBufferSize``): the reader
#: may run this many chunks ahead of them. The others get an unbuffered channel.
CHANNEL_BUFFER: Mapping[str, int] = {"latency": 1024}

#: Toxics that hand every chunk on at once (``slow_close`` acts only on close,
#: ``limit_data`` only cuts): they never keep the reader from running ahead.
PASS_THROUGH: frozenset[str] = frozenset({"slow_close", "limit_data"})

Emit = Callable[[bytes], Awaitable[None]]


@dataclass
class Toxic:
    """A toxic as the HTTP API shows it."""

    name: str
    type: str
    stream: Stream
    toxicity: Float32
    attributes: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        """Fields in ``ToxicWrapper``'s order; toxicity is a Go ``float32``."""
        return {
            "attributes": dict(self.attributes),
            "name": self.name,
            "type": self.type,
            "stream": str(self.stream),
            "toxicity": self.toxicity,
        }


def _as_int(value: object, what: str) -> int:
    # Go decodes into int fields only numbers written as integers: 1.0 and 1e3 fail.
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"{what} must be an integer, got {value!r}")
    return value


def _as_toxicity(value: object) -> Float32:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request(f"toxicity must be a number, got {value!r}")
    try:
        return float32(value)
    except OverflowError:
        raise bad_request(f"toxicity {value!r} overflows a float32") from None


def _merge_attributes(type_: str, base: Mapping[str, int], given: object) -> dict[str, int]:
    """Overlay the given JSON attributes on ``base``; unknown keys are ignored."""
    if given is None:
        return dict(base)
    if not isinstance(given, dict):
        raise bad_request(f"attributes must be an object, got {given!r}")
    merged = dict(base)
    for key in TOXIC_ATTRIBUTES[type_]:
        if key in given:
            merged[key] = _as_int(given[key], f"{type_} attribute {key!r}")
    _validate_attributes(type_, merged)
    return merged


def _validate_attributes(type_: str, attrs: Mapping[str, int]) -> None:
    for key, value in attrs.items():
        if value < 0:
            raise bad_request(f"{type_} attribute {key!r} must be >= 0, got {value}")
    if type_ == "slicer" and attrs["average_size"] < 1:
        raise bad_request("slicer attribute 'average_size' must be >= 1")


def parse_new_toxic(body: object) -> Toxic:
    """Build a toxic from a create request body (toxiproxy defaults applied).

    Raises ``ApiError`` (400) naming the offending field.
    """
    if not isinstance(body, dict):
        raise bad_request("expected a JSON object")
    stream_name = body.get("stream")
    if stream_name is None:  # absent or null: toxiproxy's default
        stream_name = "downstream"
    try:
        stream = Stream(stream_name)
    except ValueError:
        raise ApiError("stream was invalid, can be either upstream or downstream", 400) from None
    type_ = body.get("type")
    if not isinstance(type_, str) or type_ not in TOXIC_ATTRIBUTES:
        raise ApiError("invalid toxic type", 400)
    name = body.get("name") or f"{type_}_{stream}"
    if not isinstance(name, str):
        raise bad_request(f"name must be a string, got {name!r}")
    given = body.get("toxicity")
    toxicity = _as_toxicity(given) if given is not None else float32(1.0)
    attributes = _merge_attributes(type_, TOXIC_ATTRIBUTES[type_], body.get("attributes"))
    return Toxic(name=name, type=type_, stream=stream, toxicity=toxicity, attributes=attributes)


def parse_toxic_update(current: Toxic, body: object) -> Toxic:
    """Apply an update body: attributes overlay the current ones, toxicity may change.

    Name, type and stream cannot be changed (as in toxiproxy).
    """
    if not isinstance(body, dict):
        raise bad_request("expected a JSON object")
    given = body.get("toxicity")
    toxicity = _as_toxicity(given) if given is not None else current.toxicity
    attributes = _merge_attributes(current.type, current.attributes, body.get("attributes"))
    return Toxic(
        name=current.name,
        type=current.type,
        stream=current.stream,
        toxicity=toxicity,
        attributes=attributes,
    )


def _release(held: asyncio.Future[None]) -> None:
    if not held.done():
        held.set_result(None)


class LinkControl(Protocol):
    """What a toxic may do to the link (one direction of a connection) it runs on."""

    def close(self) -> None:
        """End the link: its destination socket is closed, and the other
        direction follows (a TCP RST when the connection lingers zero, i.e.
        it had a ``reset_peer`` toxic when it was opened; else a FIN)."""


class ToxicRun:
    """One toxic applied to one link; see the module docstring."""

    def __init__(
        self,
        toxic: Toxic,
        link: LinkControl,
        *,
        previous: ToxicRun | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.toxic = toxic
        self._link = link
        self._rng = rng or random.Random()
        self.applies = self._rng.random() < toxic.toxicity
        # limit_data keeps its byte count across updates of the same toxic.
        self._sent: int = previous._sent if previous is not None else 0
        self._pace_at = 0.0
        self._reset_armed = False
        self._stopped = False
        #: The latency toxic's wait for the chunk it holds (one at a time per link).
        self._held: asyncio.Future[None] | None = None
        self._timer: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Begin the toxic's own clock (the ``timeout`` toxic's close timer)."""
        timeout_ms = self.toxic.attributes.get("timeout", 0)
        if self.applies and self.toxic.type == "timeout" and timeout_ms > 0:
            self._timer = asyncio.get_running_loop().create_task(self._close_after(timeout_ms))

    def stop(self, *, removed: bool) -> None:
        """Stop the run; a removed ``timeout`` toxic closes its connection.

        A slicer stopped in the middle of a chunk passes the rest of it on in
        one piece, as toxiproxy's interrupted slicer does.
        """
        self._stopped = True
        held, self._held = self._held, None
        if held is not None and not held.done():
            held.set_result(None)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if removed and self.applies and self.toxic.type == "timeout":
            self._link.close()

    async def _close_after(self, timeout_ms: int) -> None:
        await asyncio.sleep(timeout_ms / 1000)
        self._link.close()

    async def on_data(self, data: bytes, arrived: float, emit: Emit) -> None:
        """Pass ``data`` (read at loop time ``arrived``) on through ``emit``, or not."""
        attrs = self.toxic.attributes
        kind = self.toxic.type
        loop = asyncio.get_running_loop()
        if kind == "latency":
            jitter = attrs["jitter"]
            # rand.Int63n(2 * jitter) - jitter: from -jitter to jitter - 1.
            offset = self._rng.randrange(2 * jitter) - jitter if jitter > 0 else 0
            delay_ms = attrs["latency"] + offset
            wait = arrived + max(delay_ms, 0) / 1000 - loop.time()
            if wait > 0 and not self._stopped:
                await self._hold(loop, wait)
            await emit(data)
        elif kind == "bandwidth":
            await self._paced(data, attrs["rate"], emit)
        elif kind == "slicer":
            await self._sliced(data, attrs, emit)
        elif kind == "limit_data":
            remaining = attrs["bytes"] - self._sent
            part = data[: max(remaining, 0)]
            if part:
                self._sent += len(part)
                await emit(part)
            if attrs["bytes"] - self._sent <= 0:
                self._link.close()
        elif kind == "timeout":
            return  # dropped on the floor, as toxiproxy does
        elif kind == "reset_peer":
            if not self._reset_armed:
                self._reset_armed = True
                await asyncio.sleep(attrs["timeout"] / 1000)
                self._link.close()
        else:  # slow_close and anything that only acts on close
            await emit(data)

    async def _hold(self, loop: asyncio.AbstractEventLoop, wait: float) -> None:
        """Wait ``wait`` seconds, or until the run stops: removing or updating the
        toxic releases the chunk it holds at once, as toxiproxy's interrupted
        LatencyToxic does. One future and one timer per chunk (``wait_for`` on an
        event made a task per chunk, most of a delayed link's CPU)."""
        held: asyncio.Future[None] = loop.create_future()
        self._held = held
        timer = loop.call_later(wait, _release, held)
        try:
            await held
        finally:
            timer.cancel()
            if self._held is held:
                self._held = None

    async def on_eof(self) -> None:
        """Called when the link's source closed, before the close is passed on."""
        if self.toxic.type == "slow_close":
            await asyncio.sleep(self.toxic.attributes["delay"] / 1000)

    async def _paced(self, data: bytes, rate_kbps: int, emit: Emit) -> None:
        if rate_kbps <= 0:
            await emit(data)
            return
        loop = asyncio.get_running_loop()
        bytes_per_s = rate_kbps * 1000
        piece = max(rate_kbps * 100, 1)  # at most 100 ms worth of data per write
        self._pace_at = max(self._pace_at, loop.time())
        for start in range(0, len(data), piece):
            part = data[start : start + piece]
            self._pace_at += len(part) / bytes_per_s
            wait = self._pace_at - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            await emit(part)

    def slice_bounds(self, size: int) -> list[int]:
        """Cut points of a ``size``-byte chunk: ``[0, b1, ..., size]``.

        toxiproxy's ``SlicerToxic.chunk``: a piece longer than ``average_size
        + size_variation`` is halved, the cut moved by a random offset in
        ``[-size_variation, size_variation)``, and each half cut again, so
        pieces vary evenly around the average with no short piece at the
        start or end. (A variation of ``average_size`` or more makes the real
        server cut out of bounds and panic; here it is capped below it.)
        """
        attrs = self.toxic.attributes
        average = max(attrs["average_size"], 1)
        variation = min(attrs["size_variation"], average - 1)
        bounds = [0]
        pending = [(0, size)]
        while pending:
            start, end = pending.pop()
            if (end - start) - average <= variation:
                bounds.append(end)
                continue
            mid = start + (end - start) // 2
            if variation > 0:
                mid += self._rng.randrange(2 * variation) - variation
            pending.append((mid, end))  # the left half is cut (and emitted) first
            pending.append((start, mid))
        return bounds

    async def _sliced(self, data: bytes, attrs: Mapping[str, int], emit: Emit) -> None:
        """Write each slice, then wait ``delay`` us (after the last slice too).

        The wait is a real timer, as toxiproxy's ``time.After(delay)``, started
        when the slice is handed on (in toxiproxy the writer goroutine writes
        it while the timer runs). Both Go's runtime and asyncio wait for
        timers in ``epoll_wait``, whose timeout is whole milliseconds rounded
        up, so when nothing else wakes the process a 100 us delay lasts about
        1.1 ms in both and the stream crosses at about one slice per
        millisecond; other traffic that wakes the process lets a due timer
        fire sooner, in both. That is the real cost of a slicer (toxiproxy
        2.12.0 took 1,160 ms for a 25 KB exchange through ``slicer(32, 24,
        100)``); pacing the delays exactly would be ten times faster than the
        server it stands in for. A delay of 0 still yields, so other traffic
        passes between slices.
        """
        delay_s = attrs["delay"] / 1_000_000
        loop = asyncio.get_running_loop()
        bounds = self.slice_bounds(len(data))
        for start, end in itertools.pairwise(bounds):
            if self._stopped:
                await emit(data[start:])
                return
            due = loop.time() + delay_s
            await emit(data[start:end])
            await asyncio.sleep(max(due - loop.time(), 0))
