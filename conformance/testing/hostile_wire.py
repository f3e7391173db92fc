"""What a hostile peer on the network sends below ZeroMQ: raw ZMTP byte streams.

Every family's fuzz clause (SEC-3, EVT-11, CTL-9, PIPE-14) opens plain TCP
connections to the implementation's bound endpoints and writes streams no
honest libzmq peer would: random greetings, greetings cut short, NULL and
CURVE handshakes with garbage commands (a CURVE HELLO whose boxes are random
bytes), a command or frame announcing a size past any sane
``ZMQ_MAXMSGSIZE``, followed by real bytes, so an implementation without a
receive limit buffers them. :func:`rss_peak_kb` measures what that costs the
process (the implementation runs in the suite's process). The plainer raw
peers live here too: :func:`send_raw_tcp` writes bytes that are not ZMTP at
all, and a :class:`StalledListener` accepts connections and never answers
(a peer stalled in the handshake, MSG-4).

The stream layout follows ZMTP 3.0/3.1 (RFC 23, RFC 37) and CURVE (RFC 26):
a 64-byte greeting (signature ``FF 00*8 7F``, version, 20-byte mechanism,
as-server flag, filler), then commands (flags ``0x04``/``0x06``) and frames
(``0x00``/``0x02`` for short/long final frames).
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from conformance.testing.net import HOST

__all__ = [
    "ANNOUNCED_OVERSIZE",
    "HostileListener",
    "HostileStream",
    "PeakRss",
    "StalledListener",
    "hostile_streams",
    "rss_kb",
    "send_raw_tcp",
    "send_streams",
]

#: The size an "oversize" stream announces: far past any receive limit of this suite.
ANNOUNCED_OVERSIZE: Final = 1 << 30
#: Real bytes an oversize stream sends after its header (buffered if nothing refuses).
OVERSIZE_PAYLOAD: Final = 1 << 20

_SIGNATURE: Final = b"\xff" + bytes(8) + b"\x7f"


def greeting(mechanism: bytes = b"NULL", *, as_server: bool = False, minor: int = 0) -> bytes:
    """A well-formed 64-byte ZMTP 3.x greeting."""
    return (_SIGNATURE + bytes([3, minor]) + mechanism.ljust(20, b"\x00")
            + bytes([1 if as_server else 0]) + bytes(31))


def command(name: bytes, body: bytes) -> bytes:
    """One ZMTP command frame (short or long form)."""
    data = bytes([len(name)]) + name + body
    if len(data) < 256:
        return bytes([0x04, len(data)]) + data
    return b"\x06" + struct.pack(">Q", len(data)) + data


def ready(socket_type: bytes, **properties: bytes) -> bytes:
    """A NULL-mechanism READY command with ``Socket-Type`` and extra properties."""
    props = {"Socket-Type": socket_type, **properties}
    body = b"".join(bytes([len(k)]) + k.encode() + struct.pack(">I", len(v)) + v
                    for k, v in props.items())
    return command(b"READY", body)


def curve_hello(rng: random.Random) -> bytes:
    """A CURVE HELLO of the right size whose key, nonce and box are random bytes."""
    body = (b"\x01\x00" + bytes(72) + rng.randbytes(32) + rng.randbytes(8)
            + rng.randbytes(80))
    return command(b"HELLO", body)


@dataclass(frozen=True)
class HostileStream:
    """A named byte stream; ``hold`` keeps the connection open after writing it."""

    name: str
    data: bytes
    hold: bool = True


def hostile_streams(seed: int, *, socket_type: bytes = b"DEALER") -> list[HostileStream]:
    """One of each kind, drawn from ``seed`` (reproducible)."""
    rng = random.Random(seed)
    oversize_frame = b"\x02" + struct.pack(">Q", ANNOUNCED_OVERSIZE) + rng.randbytes(
        OVERSIZE_PAYLOAD)
    oversize_command = b"\x06" + struct.pack(">Q", ANNOUNCED_OVERSIZE) + rng.randbytes(
        OVERSIZE_PAYLOAD)
    return [
        HostileStream("random-bytes", rng.randbytes(rng.randint(1, 200))),
        HostileStream("random-greeting", _SIGNATURE + rng.randbytes(54)),
        HostileStream("truncated-greeting", greeting()[: rng.randint(1, 63)]),
        HostileStream("wrong-version", _SIGNATURE + b"\x09\x09" + rng.randbytes(52)),
        HostileStream("null-garbage-command", greeting() + bytes([0x04, 40])
                      + rng.randbytes(40)),
        HostileStream("null-truncated-ready", greeting() + ready(socket_type)[:7]),
        HostileStream("curve-garbage-hello", greeting(b"CURVE") + curve_hello(rng)),
        HostileStream("curve-truncated-hello", greeting(b"CURVE") + curve_hello(rng)[:60]),
        HostileStream("curve-oversize-command", greeting(b"CURVE") + oversize_command),
        HostileStream("null-oversize-frame", greeting() + ready(socket_type)
                      + oversize_frame),
        HostileStream("null-then-close", greeting() + ready(socket_type), hold=False),
    ]


def send_streams(host: str, port: int, streams: list[HostileStream], *, copies: int,
                 hold_s: float = 0.2) -> dict[str, int]:
    """Open ``copies`` TCP connections per stream, write it, hold, close.

    Returns how many connections each stream got written in full (a peer that
    drops the connection early is the expected answer, not an error).
    """
    written = dict.fromkeys((s.name for s in streams), 0)
    with _connections() as held:
        for stream in streams:
            for _ in range(copies):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.settimeout(2.0)
                try:
                    sock.connect((host, port))
                    sock.sendall(stream.data)
                    written[stream.name] += 1
                except OSError:
                    pass
                if stream.hold:
                    held.append(sock)
                else:
                    sock.close()
        if held:
            time.sleep(hold_s)  # a window with the connections open (a hold, not a sync)
    return written


def send_raw_tcp(target: str, data: bytes, *, timeout: float = 2.0) -> None:
    """Open a plain TCP connection to ``target``, write ``data`` (not ZMTP), close it."""
    host, _, port = target.rpartition(":")
    # The peer may hang up on garbage: that is its right.
    with socket.create_connection((host, int(port)), timeout=timeout) as sock, \
            contextlib.suppress(OSError):
        sock.sendall(data)


@contextlib.contextmanager
def _connections() -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    try:
        yield held
    finally:
        for sock in held:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()


_STATUS: Final = Path("/proc/self/status")
_CLEAR_REFS: Final = Path("/proc/self/clear_refs")


def _status_kb(field: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_kb() -> int | None:
    """This process's resident set size in KiB (``None`` where /proc is missing)."""
    return _status_kb("VmRSS")


def reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark (Linux 4.0+); False when not possible."""
    try:
        with _CLEAR_REFS.open("w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def rss_peak_kb() -> int | None:
    """The peak RSS since :func:`reset_peak` (or process start), in KiB."""
    return _status_kb("VmHWM")


class PeakRss:
    """Peak RSS growth of this process over a ``with`` block, in KiB.

    The kernel's peak mark is reset on entry where possible; otherwise the
    growth is the RSS at exit over the RSS at entry. ``growth_kb`` is ``None``
    where /proc is missing.
    """

    def __enter__(self) -> PeakRss:
        self._peak_reset = reset_peak()
        self.start_kb = rss_kb()
        self.growth_kb: int | None = None
        return self

    def __exit__(self, *exc: object) -> None:
        end = rss_peak_kb() if self._peak_reset else rss_kb()
        if self.start_kb is not None and end is not None:
            self.growth_kb = max(0, end - self.start_kb)


class HostileListener:
    """A raw TCP server on ``host:port`` that answers every connection with the next
    hostile stream, then closes it: an impostor on an endpoint a client connects to.

    Runs in a thread of its own while in the ``with`` block; ``served`` counts the
    connections it answered.
    """

    def __init__(self, host: str, port: int, streams: list[HostileStream]) -> None:
        self.served = 0
        self._streams = streams
        self._stop = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        deadline = time.monotonic() + 3.0
        while True:
            try:
                self._listener.bind((host, port))
                break
            except OSError:
                if time.monotonic() > deadline:
                    self._listener.close()
                    raise
                time.sleep(0.01)
        self._listener.listen(64)
        self._listener.settimeout(0.05)
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"hostile-listener-{port}")

    def __enter__(self) -> HostileListener:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5.0)
        self._listener.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            stream = self._streams[self.served % len(self._streams)]
            self.served += 1
            with conn:
                conn.settimeout(1.0)
                with contextlib.suppress(OSError):
                    conn.sendall(stream.data)
                    if stream.hold:
                        self._stop.wait(0.05)
                with contextlib.suppress(OSError):
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class StalledListener(contextlib.AbstractContextManager["StalledListener"]):
    """A TCP port that accepts connections into its backlog and never reads.

    A transport connecting here sees a peer that never completes the ZMTP
    handshake: a stalled peer (MSG-4). ``address`` is its ``"host:port"``.
    """

    def __init__(self, host: str = HOST) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind((host, 0))
        self._sock.listen(1)
        self.address = f"{host}:{self._sock.getsockname()[1]}"

    def close(self) -> None:
        self._sock.close()

    def __exit__(self, *exc: object) -> None:
        self.close()
