"""Raw peers: the suite playing an engine or a client, byte for byte, on a wire profile.

:class:`RawEngine` shakes hands with a client under test (HELLO, WELCOME,
the DEALER's first message, READY) and then reads its requests as frames and
writes whatever output frames a test wants, hostile ones included.
:class:`RawClient` binds the three client sockets, welcomes an engine under
test, and sends request frames (hostile ones included) and reads outputs;
it can stop reading (tiny receive buffers), as a stalled API server does.
Both use the codec of their ``wire`` profile (:mod:`reference_impl.engine_pipeline.profiles`:
``vllm-v1`` by default, or ``vllm-0.33``) for valid frames, so a hostile
frame is exactly one deliberate deviation from the profile.
``secure`` (a function applied to every socket before it connects or binds,
as :func:`conformance.testing.credentials.as_client`/``as_server`` return)
makes either a CURVE peer: an honest one, a stranger with a key of its own,
or an impostor server.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket as _socket
import time
from collections.abc import Callable
from typing import Any

import zmq

from reference_impl.engine_pipeline import profiles, wire
from reference_impl.engine_pipeline.wire import (
    ENGINE_CORE_DEAD,
    AddRequest,
    EngineOutput,
    EngineOutputs,
    RequestType,
)

__all__ = ["RawClient", "RawEngine"]

_ids = itertools.count(1)
#: Applied to a socket before connect/bind (CURVE options).
Secure = Callable[[zmq.Socket[bytes]], None]


class RawEngine:
    """The suite as engine ``engine_index`` of one client (see the module docstring)."""

    def __init__(self, handshake_address: str, *, engine_index: int = 0,
                 pid: int | None = None, secure: Secure | None = None,
                 wire: str = profiles.DEFAULT) -> None:
        self.engine_index = engine_index
        #: The codec of the profile this peer plays.
        self.codec = profiles.codec(wire)
        self._secure = secure
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._hs = self._socket(zmq.DEALER)
        self._hs.connect(handshake_address)
        self._pid = os.getpid() if pid is None else pid
        self.dealer: zmq.Socket[bytes] | None = None
        self.push: zmq.Socket[bytes] | None = None
        #: The output connection of :meth:`join` with ``silent_output``.
        self.silent_output: _socket.socket | None = None
        self._encoder = self.codec.Encoder()
        self.decoders = self.codec.Decoders()

    def _socket(self, kind: int) -> zmq.Socket[bytes]:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        if self._secure is not None:
            self._secure(sock)
        return sock

    def hello(self, timeout_s: float = 5.0) -> dict[str, Any] | None:
        """Send HELLO; the client's answer (WELCOME or REFUSED), ``None`` if none came."""
        # NOBLOCK: a client that refused this peer's handshake (a stranger) may already
        # have dropped the DEALER's only pipe, and a blocking send would wait forever.
        with contextlib.suppress(zmq.Again):
            self._hs.send(wire.encode_handshake({
                "status": "HELLO", "engine_index": self.engine_index, "pid": self._pid,
                "host": _socket.gethostname(), "profile": self.codec.PROFILE}), zmq.NOBLOCK)
        if not self._hs.poll(int(timeout_s * 1000)):
            return None
        return wire.decode_handshake(self._hs.recv())

    def join(self, timeout_s: float = 5.0, *, say_ready: bool = True,
             silent_output: bool = False) -> dict[str, Any]:
        """The whole handshake; returns the WELCOME (AssertionError if refused or silent).
        With ``say_ready`` False it stops short of READY (an engine dying in startup).
        With ``silent_output`` the output connection is a plain stream socket, connected
        before the DEALER registers, that never sends a ZMTP greeting: an engine stopped
        between its PUSH's connect and its greeting (READY is still said)."""
        welcome = self.hello(timeout_s)
        assert welcome is not None, "the client never answered the suite engine's HELLO"
        assert welcome["status"] == "WELCOME", f"the client refused the suite engine: {welcome}"
        self.dealer = self._socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.IDENTITY, wire.engine_identity(self.engine_index))
        self.dealer.connect(str(welcome["input"]))
        if silent_output:
            self.silent_output = _stream_connection(str(welcome["output"]), timeout_s)
        else:
            self.push = self._socket(zmq.PUSH)
            self.push.connect(str(welcome["output"]))
        self.dealer.send(b"")
        if say_ready:
            self._hs.send(wire.encode_handshake({"status": "READY",
                                                 "engine_index": self.engine_index}))
        return welcome

    def intrude(self, input_address: str, output_address: str) -> None:
        """Connect the request DEALER (this engine's identity) and the output PUSH without
        a WELCOME, and register on the client's ROUTER: a stranger trying the data
        sockets directly."""
        self.dealer = self._socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.IDENTITY, wire.engine_identity(self.engine_index))
        self.dealer.connect(input_address)
        self.push = self._socket(zmq.PUSH)
        self.push.connect(output_address)
        # NOBLOCK: a refused CURVE handshake may already have dropped the DEALER's only
        # pipe, and a DEALER without a pipe blocks in send() forever (the stranger tried).
        with contextlib.suppress(zmq.Again):
            self.dealer.send(b"", zmq.NOBLOCK)

    def requests(self, timeout_s: float) -> list[list[bytes]]:
        """Request frame lists received within ``timeout_s`` (stops at the first pause)."""
        assert self.dealer is not None
        got: list[list[bytes]] = []
        deadline = time.monotonic() + timeout_s
        wait_s = timeout_s
        while self.dealer.poll(int(max(0.0, min(wait_s, deadline - time.monotonic())) * 1000)):
            got.append(self.dealer.recv_multipart())
            wait_s = 0.05
        return got

    def send_frames(self, frames: list[Any]) -> None:
        assert self.push is not None
        self.push.send_multipart(frames)

    def send_outputs(self, outputs: list[EngineOutput], utility: Any = None) -> None:
        message = EngineOutputs(self.engine_index, outputs, utility)
        self.send_frames([bytes(f) if isinstance(f, bytearray) else f
                          for f in self._encoder.encode(message)])

    def outputs_frames(self, outputs: list[EngineOutput], utility: Any = None) -> list[Any]:
        """The frames of one output message under this peer's profile."""
        message = EngineOutputs(self.engine_index, outputs, utility)
        return [bytes(f) if isinstance(f, bytearray) else f for f in self._encoder.encode(message)]

    def decode_add(self, frames: list[Any]) -> AddRequest:
        """An ADD's ``[blob, aux...]`` decoded strictly under this peer's profile."""
        request: AddRequest = self.codec.decode_add(frames, self.decoders)
        return request

    def send_dead(self) -> None:
        self.send_frames([ENGINE_CORE_DEAD])

    def close(self) -> None:
        for sock in (self._hs, self.dealer, self.push):
            if sock is not None:
                sock.close(linger=0)
        if self.silent_output is not None:
            self.silent_output.close()
        self._ctx.term()


def _stream_connection(endpoint: str, timeout_s: float) -> _socket.socket:
    """A plain connection to a ``tcp://host:port`` or ``ipc://path`` endpoint."""
    if endpoint.startswith("ipc://"):
        conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        conn.settimeout(timeout_s)
        conn.connect(endpoint[len("ipc://"):])
        return conn
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    return _socket.create_connection((host.strip("[]"), int(port)), timeout_s)


class RawClient:
    """The suite as client ``client_index`` of engines under test (module docstring)."""

    def __init__(self, *, client_index: int = 0, stalled: bool = False,
                 secure: Secure | None = None, wire: str = profiles.DEFAULT) -> None:
        self.client_index = client_index
        #: The codec of the profile this peer plays.
        self.codec = profiles.codec(wire)
        self._secure = secure
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.handshake = self._bind(zmq.ROUTER)
        self.input = self._bind(zmq.ROUTER)
        if stalled:
            self.output = self._ctx.socket(zmq.PULL)
            self.output.setsockopt(zmq.LINGER, 0)
            if secure is not None:
                secure(self.output)
            self.output.setsockopt(zmq.RCVHWM, 1)
            self.output.setsockopt(zmq.RCVBUF, 4096)
            self.output.bind("tcp://127.0.0.1:*")
        else:
            self.output = self._bind(zmq.PULL)
        self.addresses = {
            "handshake": self.handshake.getsockopt_string(zmq.LAST_ENDPOINT),
            "input": self.input.getsockopt_string(zmq.LAST_ENDPOINT),
            "output": self.output.getsockopt_string(zmq.LAST_ENDPOINT),
        }
        self.engines: dict[int, bytes] = {}
        self._encoder = self.codec.Encoder()
        self.decoders = self.codec.Decoders()

    @property
    def handshake_address(self) -> str:
        return self.addresses["handshake"]

    def _bind(self, kind: int) -> zmq.Socket[bytes]:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        if self._secure is not None:
            self._secure(sock)
        if kind == zmq.PULL:
            sock.setsockopt(zmq.RCVHWM, 0)
        sock.bind("tcp://127.0.0.1:*")
        return sock

    def wait_ready(self, engines: int = 1, timeout_s: float = 60.0) -> None:
        """Welcome engines until ``engines`` of them said READY and registered."""
        ready: set[int] = set()
        registered: set[int] = set()
        deadline = time.monotonic() + timeout_s
        poller = zmq.Poller()
        poller.register(self.handshake, zmq.POLLIN)
        poller.register(self.input, zmq.POLLIN)
        while len(ready & registered) < engines:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"PIPE-9: engine(s) not ready within {timeout_s} s "
                                     f"(READY from {sorted(ready)}, registered "
                                     f"{sorted(registered)})")
            for sock, _ in poller.poll(int(min(left, 0.05) * 1000) + 1):
                frames = sock.recv_multipart()
                if sock is self.input:
                    index = wire.identity_index(frames[0])
                    if index is not None:
                        registered.add(index)
                        self.engines[index] = frames[0]
                    continue
                message = wire.decode_handshake(frames[1])
                if message["status"] == "HELLO":
                    self.handshake.send_multipart([frames[0], wire.encode_handshake({
                        "status": "WELCOME", "client_index": self.client_index,
                        "input": self.addresses["input"], "output": self.addresses["output"],
                        "pid": os.getpid(), "host": _socket.gethostname()})])
                elif message["status"] == "READY":
                    ready.add(int(message["engine_index"]))

    def handshake_frames(self, timeout_s: float) -> list[list[bytes]]:
        """Frames received on the handshake ROUTER within ``timeout_s`` (not answered):
        what an impostor at a client's address learns from an engine."""
        got: list[list[bytes]] = []
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.handshake.poll(int(left * 1000) + 1):
                return got
            got.append(self.handshake.recv_multipart())

    def send_raw(self, frames: list[Any], engine_index: int = 0) -> None:
        self.input.send_multipart([wire.engine_identity(engine_index), *frames])

    def add(self, rid: str, max_tokens: int, *, prompt: list[int] | None = None,
            payload: Any = None, engine_index: int = 0) -> None:
        request = AddRequest(rid, prompt or [1], max_tokens, self.client_index,
                             self.codec.prepare(payload))
        self.send_raw([RequestType.ADD.value, *self._encoded(request)], engine_index)

    def abort(self, rids: list[str], engine_index: int = 0) -> None:
        self.send_raw([RequestType.ABORT.value, *self._encoded(rids)], engine_index)

    def utility(self, method: str, *args: Any, engine_index: int = 0) -> int:
        call_id = next(_ids)
        body = (self.client_index, call_id, method, list(args))
        self.send_raw([RequestType.UTILITY.value, *self._encoded(body)], engine_index)
        return call_id

    def add_frames(self, request: AddRequest) -> list[bytes]:
        """``[ADD type byte, blob, aux...]`` of ``request`` under this peer's profile."""
        return [RequestType.ADD.value, *self._encoded(request)]

    def decode_add(self, frames: list[Any]) -> AddRequest:
        """An ADD's ``[blob, aux...]`` decoded strictly under this peer's profile."""
        request: AddRequest = self.codec.decode_add(frames, self.decoders)
        return request

    def _encoded(self, value: Any) -> list[Any]:
        return [bytes(f) if isinstance(f, bytearray) else f for f in self._encoder.encode(value)]

    def messages(self, timeout_s: float) -> list[list[zmq.Frame]]:
        """Output messages received within ``timeout_s`` (stops early at the first pause)."""
        got: list[list[zmq.Frame]] = []
        deadline = time.monotonic() + timeout_s
        wait_s = timeout_s
        while self.output.poll(int(max(0.0, min(wait_s, deadline - time.monotonic())) * 1000)):
            got.append(self.output.recv_multipart(copy=False))
            wait_s = 0.05
        return got

    def decoded(self, timeout_s: float) -> list[EngineOutputs | bytes]:
        """Messages decoded (``ENGINE_CORE_DEAD`` as bytes)."""
        out: list[EngineOutputs | bytes] = []
        for frames in self.messages(timeout_s):
            if len(frames) == 1 and frames[0].bytes == ENGINE_CORE_DEAD:
                out.append(ENGINE_CORE_DEAD)
            else:
                out.append(self.codec.decode_outputs(frames, self.decoders))
        return out

    def close(self) -> None:
        for sock in (self.handshake, self.input, self.output):
            sock.close(linger=0)
        self._ctx.term()
