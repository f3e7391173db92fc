"""Hostile peers: raw pyzmq sockets that talk to a transport's ROUTER (POLL-3, SEC-1).

A hostile peer is anything a transport's bound socket may meet on the wire:
an anonymous DEALER (libzmq hands it a 5-byte routing id starting with
``0x00``, usually not UTF-8), a DEALER claiming any identity it likes,
frames in any number and of any content, floods of messages or of
connections. Peers below ZeroMQ (plain TCP clients that never speak ZMTP, a
listener that never completes a handshake) are every family's, in
:mod:`conformance.testing.hostile_wire`.

The suite does not assume how an honest node frames a message: a
:class:`WireFormat` is *learned* by letting the transport under test send one
probe message to a raw ROUTER (:func:`learn_wire_format`), so a hostile peer
can also speak the honest format, e.g. to deliver an oversized but otherwise
valid message.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final

import msgspec
import zmq

from conformance.contracts.p2p.harness import Cluster
from conformance.supervision import watchdog
from conformance.testing.net import HOST
from reference_impl._monitor import monitor_event

__all__ = [
    "Flooder",
    "HostilePeer",
    "RawRouter",
    "WireFormat",
    "learn_wire_format",
]

_monitor_serial = itertools.count()
#: The flooding process's count of messages sent, in a page shared with the test.
_COUNT: Final = struct.Struct("q")

#: Marker the probe message carries, to find the payload among the frames.
_PROBE_KEY = "zmq-conformance-probe"


@dataclass(frozen=True)
class WireFormat:
    """How the transport under test frames one message on a DEALER.

    ``frames`` is the probe's multipart message as sent (without the routing
    identity a ROUTER prepends); ``payload_index`` is where the encoded
    message sits. ``identity`` is the routing id the probing node presented.
    """

    frames: tuple[bytes, ...]
    payload_index: int
    identity: bytes

    def frames_for(self, payload: bytes) -> list[bytes]:
        """The honest frames with ``payload`` in place of the probe."""
        out = list(self.frames)
        out[self.payload_index] = payload
        return out


_formats: dict[str, WireFormat] = {}


def learn_wire_format(cluster: Cluster, *, timeout: float = 5.0) -> WireFormat:
    """Let a fresh node of ``cluster`` send one probe to a raw ROUTER and record the frames.

    Cached per transport spec name. Raises ``AssertionError`` when no frame
    holds the MessagePack encoding of the probe (MSG-1: messages are
    MessagePack on the wire).
    """
    cached = _formats.get(cluster.spec.name)
    if cached is not None:
        return cached
    with RawRouter() as router:
        node = cluster.add_node("wire-probe")
        probe = {_PROBE_KEY: 1}
        conn = node.connect(router.address)
        conn.send(probe)
        deadline = time.monotonic() + timeout
        frames: list[bytes] | None = None
        while frames is None:
            node.poll()
            frames = router.recv(0.001)
            if frames is None and time.monotonic() > deadline:
                raise AssertionError(
                    f"no probe message reached a raw ROUTER within {timeout:.0f} s "
                    "(CONN-1: messages sent right after connect() are delivered)"
                )
        node.close()
    identity, body = frames[0], frames[1:]
    for index, frame in enumerate(body):
        try:
            decoded = msgspec.msgpack.decode(frame)
        except msgspec.DecodeError:
            continue
        if decoded == probe:
            found = WireFormat(tuple(body), index, identity)
            _formats[cluster.spec.name] = found
            return found
    raise AssertionError(
        f"the probe message {probe!r} is not MessagePack-encoded in any frame of {body!r}"
    )


class HostilePeer(contextlib.AbstractContextManager["HostilePeer"]):
    """A DEALER connected to ``target`` (``"host:port"``), sending whatever it is told.

    ``identity=None`` leaves the routing id to libzmq (anonymous peer).
    Sends never block: ``send`` returns False when the peer's queue is full.
    With ``monitor=True``, :meth:`was_disconnected` tells whether the target
    has dropped the TCP connection (e.g. after an oversize frame). Use as a
    context manager or call :meth:`close`.
    """

    def __init__(
        self,
        target: str,
        *,
        identity: bytes | None = None,
        sndhwm: int = 1000,
        monitor: bool = False,
        ctx: zmq.Context[Any] | None = None,
    ) -> None:
        self.target = target
        self.identity = identity
        self._ctx = ctx or zmq.Context.instance()
        self.socket: zmq.Socket[bytes] = self._ctx.socket(zmq.DEALER)
        self.socket.linger = 0
        self.socket.sndhwm = sndhwm
        if identity is not None:
            self.socket.setsockopt(zmq.ROUTING_ID, identity)
        self._monitor: zmq.Socket[bytes] | None = None
        self._disconnected = False
        if monitor:
            # A never-reused endpoint: libzmq frees inproc names asynchronously.
            endpoint = f"inproc://zmq-conformance-hostile-{next(_monitor_serial)}"
            self.socket.monitor(endpoint, zmq.EVENT_DISCONNECTED)
            self._monitor = self._ctx.socket(zmq.PAIR)
            self._monitor.linger = 0
            self._monitor.connect(endpoint)
        self.socket.connect(f"tcp://{target}")

    def was_disconnected(self) -> bool:
        """True once the target has dropped this peer's connection (needs ``monitor=True``)."""
        if self._monitor is None:
            raise RuntimeError("HostilePeer(monitor=True) is needed to watch disconnects")
        while not self._disconnected:
            try:
                frames = self._monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if monitor_event(frames) == zmq.EVENT_DISCONNECTED:
                self._disconnected = True
        return self._disconnected

    def send(self, frames: Sequence[bytes]) -> bool:
        """Send one multipart message; False if it would block.

        An empty list sends one empty frame (ZeroMQ cannot send zero frames).
        """
        parts = list(frames) or [b""]
        try:
            with watchdog.guard(f"hostile send to {self.target}", 2.0):
                self.socket.send_multipart(parts, zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def flood(self, frames: Sequence[bytes], count: int) -> int:
        """Send ``frames`` up to ``count`` times without blocking; returns how many went out."""
        sent = 0
        for _ in range(count):
            if not self.send(frames):
                break
            sent += 1
        return sent

    def close(self, *, linger_ms: int = 0) -> None:
        """Close the peer; ``linger_ms`` > 0 lets libzmq flush what is queued first
        (in the background, for at most that long) before the TCP connection closes."""
        # Stop the monitor, close the socket, then the monitor's reader:
        # closing the reader first can hang libzmq's teardown.
        if self._monitor is not None:
            with contextlib.suppress(zmq.ZMQError):
                self.socket.disable_monitor()
        self.socket.close(linger=linger_ms)
        if self._monitor is not None:
            self._monitor.close(linger=0)

    def __exit__(self, *exc: object) -> None:
        self.close()


#: The flooding process: a DEALER that sends the frames (msgpack on stdin) until
#: ``max_messages`` went out, then holds the socket until stdin closes (or its parent is
#: gone). Its count is kept in a shared page, so the test can read it at any moment.
_FLOODER_CODE: Final = """
import mmap, os, struct, sys, time
import msgspec, zmq
parent = os.getppid()
os.nice(int(sys.argv[3]))
count = struct.Struct("q")
shared = mmap.mmap(int(sys.argv[1]), count.size)
job = msgspec.msgpack.decode(sys.stdin.buffer.read(int(sys.argv[2])))
ctx = zmq.Context(io_threads=1)
sock = ctx.socket(zmq.DEALER)
sock.setsockopt(zmq.LINGER, 0)
sock.setsockopt(zmq.SNDHWM, job["sndhwm"])
if job["identity"] is not None:
    sock.setsockopt(zmq.IDENTITY, job["identity"])
sock.connect("tcp://" + job["target"])
frames, sent, limit = job["frames"] or [b""], 0, job["max_messages"]
while sent < limit and os.getppid() == parent:
    try:
        sock.send_multipart(frames, zmq.NOBLOCK)
    except zmq.Again:
        time.sleep(0.0005)
        continue
    sent += 1
    if sent % 64 == 0 or sent == limit:
        count.pack_into(shared, 0, sent)
sys.stdin.buffer.read()  # keep the socket (and what it still queues) until stopped
sock.close(0)
ctx.term()
"""

#: The flooding process's niceness: the suite's own load yields the host's CPUs to the
#: nodes under test (an idle host floods at full speed all the same). A node whose
#: heartbeat thread waits for a CPU behind the suite's flood would be judged for the
#: suite's host.
_FLOODER_NICE: Final = 10
#: How long the test waits for a new flooding process's first messages.
_FLOODER_START_S: Final = 30.0
#: How long a stopped flooding process may take to exit before it is killed.
_FLOODER_EXIT_S: Final = 5.0


class Flooder:
    """A child *process* whose own DEALER floods ``target`` until stopped.

    A process, not a thread of the test: a hostile peer is another program, and a
    flooding thread here would hold the GIL that an in-process implementation's
    ``poll()`` needs, so on a loaded host the flood stalled ``poll()`` for seconds
    (measured: 5.3 s of wall time for 0.08 s of its own CPU) through a lock no remote
    peer can take, and the watchdog called a correct implementation blocked.

    ``sent`` counts messages that went out (read live, every 64 messages);
    ``sndhwm=0`` queues without limit, so the flood outpaces any reader. Use as a
    context manager: the flood starts on entry and stops on exit, and the process
    never outlives the flood (nor its parent).
    """

    def __init__(
        self,
        target: str,
        frames: Sequence[bytes],
        *,
        identity: bytes | None = None,
        max_messages: int = 1_000_000,
        sndhwm: int = 1000,
    ) -> None:
        self.target = target
        self.frames = list(frames)
        self.identity = identity
        self.max_messages = max_messages
        self.sndhwm = sndhwm
        self._count: mmap.mmap | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def sent(self) -> int:
        """Messages the flooding process has sent so far."""
        if self._count is None:
            return 0
        (sent,) = _COUNT.unpack_from(self._count, 0)
        return int(sent)

    def __enter__(self) -> Flooder:
        job = msgspec.msgpack.encode({"target": self.target, "frames": self.frames,
                                      "identity": self.identity,
                                      "max_messages": self.max_messages,
                                      "sndhwm": self.sndhwm})
        with tempfile.TemporaryFile() as backing:
            backing.write(bytes(_COUNT.size))
            backing.flush()
            self._count = mmap.mmap(backing.fileno(), _COUNT.size)
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _FLOODER_CODE, str(backing.fileno()), str(len(job)),
                 str(_FLOODER_NICE)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                pass_fds=(backing.fileno(),))
        assert self._proc.stdin is not None
        self._proc.stdin.write(job)
        self._proc.stdin.flush()
        # The flood is on once its first messages went out (a process takes a moment to
        # start, longer on a loaded host); the test's honest traffic follows it.
        deadline = time.monotonic() + _FLOODER_START_S
        while not self.sent and self._proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        proc = self._proc
        if proc is None:
            return
        self._proc = None
        assert proc.stdin is not None and proc.stderr is not None
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
        try:
            proc.wait(timeout=_FLOODER_EXIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        error = proc.stderr.read().decode(errors="replace").strip()
        proc.stderr.close()
        if self._count is not None:
            # Keep the final count readable after the flood (the page is private now).
            final = bytes(self._count[:_COUNT.size])
            self._count.close()
            self._count = mmap.mmap(-1, _COUNT.size)
            self._count[:_COUNT.size] = final
        if proc.returncode not in (0, -signal.SIGKILL) and exc is None:
            tail = error.splitlines()[-1] if error else f"exit status {proc.returncode}"
            raise AssertionError(f"the flooding process failed: {tail}")


class RawRouter(contextlib.AbstractContextManager["RawRouter"]):
    """A bare ROUTER standing in for a remote node that only listens.

    Lets a test watch one connection of the transport in isolation (no
    remote transport state, no connection back). ``address`` is its
    ``"host:port"``; :meth:`recv` returns one multipart message (routing id
    first) or ``None`` when nothing arrived within ``timeout``.
    """

    def __init__(self, host: str = HOST) -> None:
        self.socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        # A peer reconnecting under the same identity takes over at once
        # (without this, libzmq drops the newcomer while the old one lingers).
        self.socket.setsockopt(zmq.ROUTER_HANDOVER, 1)
        port: int = self.socket.bind_to_random_port(f"tcp://{host}")
        self.address = f"{host}:{port}"

    def recv(self, timeout: float = 0.0) -> list[bytes] | None:
        if not self.socket.poll(int(timeout * 1000)):
            return None
        frames: list[bytes] = self.socket.recv_multipart()
        return frames

    def close(self) -> None:
        self.socket.close(linger=0)

    def __exit__(self, *exc: object) -> None:
        self.close()
