"""The reference engine side of the ``vllm-v1`` pipeline (an EngineCore process).

``EngineCore(addresses, *, engine_index, model, **options)`` then ``serve()``.
``addresses`` lists the handshake address of every client, in client-index
order. ``serve()`` shakes hands with each client (HELLO, then the client's
WELCOME naming its request and output addresses), connects a DEALER
(identity: the engine index, 2 bytes little endian) and a PUSH to each,
sends the DEALER's first message so the client's ROUTER knows it, says
READY, and runs two threads:

- the *input thread* receives requests from every DEALER and decodes them
  (strictly: :mod:`reference_impl.engine_pipeline.wire`). Hostile frames are
  logged, counted in :attr:`EngineCore.dropped_frames` and dropped; anything
  else it raises is handed to the main loop as a fatal error, never a
  silently dead thread (vLLM #26139).
- the *main loop* (the caller's thread) applies requests to the model,
  steps it while requests run, and sends each step's outputs itself (one
  message per client per step) through :class:`_OutputSender`, without
  blocking: a send the client cannot take now goes to that client's backlog,
  retried on every turn of the loop. A client that stops reading gets a
  backlog of its own; the others are unaffected (PIPE-4).

Why the main loop sends (vLLM has a third, output, thread): the output
thread buys overlap of encoding with GPU work, and here there is no GPU
work; under the GIL a hand-off to it only added a queue, a wake-up and a
thread switch to every step's latency, and a socket shared between threads.
Sending from the loop is safe because every send is ``NOBLOCK`` (a full
pipe costs one failed ``send``, never a wait), and each PUSH is used by
this one thread only (zmq sockets are not thread-safe).

Buffers (PIPE-3): a step's blob is encoded into a reused ``bytearray``. A
blob below pyzmq's copy threshold (64 KiB) is copied into the zmq message
by ``send`` itself, so its buffer is free as soon as ``send`` returns. A
larger blob is sent zero-copy, and its buffer is reused only when the
tracker of the frame that carries it (frame 0, the payload frame) is done;
``send_multipart`` returns the *last* frame's tracker, which says nothing
about frame 0 (vLLM #24655, PR #50053). Aux frames (arrays, large bytes)
are views of the model's own objects, sent zero-copy without a tracker:
the zmq message holds a reference to them until libzmq is done, and
nothing here writes to them again.

A fatal error (the model's step raises, the input thread fails) sends the
one-frame :data:`ENGINE_CORE_DEAD` to every client and makes ``serve()``
raise :class:`EngineFatal`, so an engine process exits non-zero.
``shutdown()`` (any thread, or SIGTERM through the caller) ends ``serve()``
normally within :data:`SHUTDOWN_BOUND_S`. The engine also ends when a client
process it was welcomed by is gone (a killed API server takes its engines
with it, vLLM #55510).

Options: ``handshake_timeout_ms`` (default 10000) bounds the wait for each
WELCOME; ``heartbeat_ivl_ms``/``heartbeat_timeout_ms`` set ZMTP heartbeats
on the engine's sockets (0: off).

CURVE (off by default): the engine connects, so it is the CURVE *client*:
``curve_client_secret_key`` (its own key) and ``curve_server_key`` (the
clients' server public key, pinned) go on every socket it opens (handshake
DEALER, request DEALER, output PUSH), before ``connect()``. A client at the
address that does not hold the matching secret never completes a handshake,
so it gets no HELLO and can send no request. The handshake socket refuses
frames past 64 KiB (``ZMQ_MAXMSGSIZE``; WELCOME and REFUSED are tiny).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import socket as _socket
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Final

import zmq

from reference_impl import _curve
from reference_impl.engine_pipeline import profiles, wire
from reference_impl.engine_pipeline.errors import (
    EngineFatal,
    HandshakeRefused,
    HandshakeTimeout,
)
from reference_impl.engine_pipeline.procwatch import ProcessWatch
from reference_impl.engine_pipeline.wire import (
    ENGINE_CORE_DEAD,
    EngineOutput,
    EngineOutputs,
    RequestType,
    UtilityOutput,
)

__all__ = ["SHUTDOWN_BOUND_S", "EngineCore"]

log = logging.getLogger(__name__)

#: How long ``serve()`` takes at most to return after ``shutdown()``.
SHUTDOWN_BOUND_S: Final = 1.0
_IDLE_WAIT_S: Final = 0.02
#: How often an idle main loop retries a backlogged client.
_BACKLOG_RETRY_S: Final = 0.005
_INPUT_POLL_MS: Final = 50
_INPUT_BATCH: Final = 1024
_WATCH_EVERY_S: Final = 0.05
#: Receive limit of the handshake socket (WELCOME, REFUSED).
_HANDSHAKE_FRAME_LIMIT: Final = 64 << 10

_NOBLOCK: Final = int(zmq.NOBLOCK)
_SNDMORE: Final = int(zmq.SNDMORE)
_SNDMORE_NOBLOCK: Final = _SNDMORE | _NOBLOCK
# Enum members bound once: a class attribute lookup on an Enum costs a descriptor call.
_ADD: Final = RequestType.ADD
_ABORT: Final = RequestType.ABORT
_UTILITY: Final = RequestType.UTILITY

_Fatal = tuple[str, BaseException]


class EngineCore:
    """One engine (see the module docstring). Build it, then call :meth:`serve` once."""

    #: The main loop's sender (a hook for variants of the reference).
    _sender_type: type[_OutputSender]

    def __init__(self, addresses: Sequence[str], *, engine_index: int, model: Any,
                 handshake_timeout_ms: int = 10_000, heartbeat_ivl_ms: int = 0,
                 heartbeat_timeout_ms: int = 0, wire: str = profiles.DEFAULT,
                 curve_client_secret_key: bytes | str | None = None,
                 curve_server_key: bytes | str | None = None) -> None:
        # Checked first: a bad key is a ValueError before any socket exists.
        self._curve = _curve.client_config(curve_client_secret_key, curve_server_key)
        if not addresses:
            raise ValueError("an engine needs the handshake address of at least one client")
        if not 0 <= engine_index < 1 << 16:
            raise ValueError(f"engine_index {engine_index} does not fit 2 bytes")
        self.addresses = list(addresses)
        #: The wire profile's codec (:mod:`.profiles`): vllm-v1 unless ``wire`` names another.
        self._codec = profiles.codec(wire)
        self.engine_index = engine_index
        self.model = model
        self.handshake_timeout_ms = handshake_timeout_ms
        self.heartbeat_ivl_ms = heartbeat_ivl_ms
        self.heartbeat_timeout_ms = heartbeat_timeout_ms or heartbeat_ivl_ms * 3
        self.dropped_frames = 0
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._stop = threading.Event()
        self._inputs: queue.SimpleQueue[tuple[RequestType, Any] | _Fatal] = queue.SimpleQueue()
        self._handshakes: list[zmq.Socket[bytes]] = []
        self._dealers: list[zmq.Socket[bytes]] = []
        self._pushes: list[zmq.Socket[bytes]] = []
        self._client_watches: list[ProcessWatch] = []
        self._served = False

    # -- public -----------------------------------------------------------------

    def shutdown(self) -> None:
        """End :meth:`serve` (thread-safe, idempotent)."""
        self._stop.set()

    def serve(self) -> None:
        """Handshake, then run until :meth:`shutdown`, a client's end, or a fatal error."""
        if self._served:
            raise RuntimeError("serve() runs once per EngineCore")
        self._served = True
        input_thread: threading.Thread | None = None
        try:
            self._handshake()
            sender = self._sender_type(self._pushes, self._codec)
            input_thread = threading.Thread(target=self._input_loop, daemon=True,
                                            name=f"engine{self.engine_index}-input")
            input_thread.start()
            try:
                fatal = self._main_loop(sender)
            except Exception as failure:  # a send, the model's add/abort: fatal, visibly
                fatal = ("the main loop", failure)
            if fatal is not None:
                where, exc = fatal
                self._send_dead()
                raise EngineFatal(f"engine {self.engine_index}: {where} failed: "
                                  f"{type(exc).__name__}: {exc}") from exc
            sender.flush(SHUTDOWN_BOUND_S / 4)
        finally:
            self._stop.set()
            if input_thread is not None:
                input_thread.join(SHUTDOWN_BOUND_S / 2)
            self._teardown()

    # -- startup ----------------------------------------------------------------

    def _socket(self, kind: int) -> zmq.Socket[bytes]:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        if self.heartbeat_ivl_ms:
            sock.setsockopt(zmq.HEARTBEAT_IVL, self.heartbeat_ivl_ms)
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, self.heartbeat_timeout_ms)
            sock.setsockopt(zmq.HEARTBEAT_TTL, self.heartbeat_timeout_ms)
        if self._curve is not None:
            self._curve.apply(sock)  # before connect(): libzmq reads it per connection
        return sock

    def _handshake(self) -> None:
        hello = wire.encode_handshake({
            "status": "HELLO", "engine_index": self.engine_index, "pid": os.getpid(),
            "host": _socket.gethostname(), "profile": self._codec.PROFILE,
        })
        for address in self.addresses:
            hs = self._socket(zmq.DEALER)
            hs.setsockopt(zmq.MAXMSGSIZE, _HANDSHAKE_FRAME_LIMIT)
            hs.setsockopt(zmq.LINGER, 500)  # READY must leave before a quick close
            hs.connect(address)
            self._handshakes.append(hs)
            hs.send(hello)
        welcomes: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + self.handshake_timeout_ms / 1000
        poller = zmq.Poller()
        for hs in self._handshakes:
            poller.register(hs, zmq.POLLIN)
        while len(welcomes) < len(self._handshakes):
            left = deadline - time.monotonic()
            if left <= 0 or self._stop.is_set():
                missing = [a for i, a in enumerate(self.addresses) if i not in welcomes]
                raise HandshakeTimeout(f"engine {self.engine_index}: no answer to HELLO from "
                                       f"{', '.join(missing)} within "
                                       f"{self.handshake_timeout_ms} ms")
            for sock, _ in poller.poll(int(min(left, 0.1) * 1000) + 1):
                position = self._handshakes.index(sock)
                try:
                    message = wire.decode_handshake(sock.recv())
                except wire.WireError as exc:
                    log.warning("engine %d: bad handshake frame from %s: %s",
                                self.engine_index, self.addresses[position], exc)
                    continue
                if message["status"] == "REFUSED":
                    raise HandshakeRefused(f"engine {self.engine_index}: "
                                           f"{self.addresses[position]} refused it: "
                                           f"{message.get('reason')}")
                if message["status"] == "WELCOME":
                    welcomes[position] = message
        for position in range(len(self._handshakes)):
            self._connect_client(position, welcomes[position])

    def _connect_client(self, position: int, welcome: dict[str, Any]) -> None:
        if welcome.get("client_index") != position:
            raise HandshakeRefused(f"engine {self.engine_index}: the client at "
                                   f"{self.addresses[position]} says it is client "
                                   f"{welcome.get('client_index')!r}, expected {position}")
        dealer = self._socket(zmq.DEALER)
        dealer.setsockopt(zmq.IDENTITY, wire.engine_identity(self.engine_index))
        dealer.connect(str(welcome["input"]))
        push = self._socket(zmq.PUSH)
        push.connect(str(welcome["output"]))
        # The first message: the ROUTER learns this identity before it sends anything.
        dealer.send(b"")
        self._dealers.append(dealer)
        self._pushes.append(push)
        pid = welcome.get("pid")
        if isinstance(pid, int) and welcome.get("host") == _socket.gethostname():
            self._client_watches.append(ProcessWatch(pid))
        self._handshakes[position].send(wire.encode_handshake(
            {"status": "READY", "engine_index": self.engine_index}))

    # -- threads ----------------------------------------------------------------

    def _input_loop(self) -> None:
        decoders = self._codec.Decoders()
        poller = zmq.Poller()
        for dealer in self._dealers:
            poller.register(dealer, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                for sock, _ in poller.poll(_INPUT_POLL_MS):
                    # Drain: with the main loop stepping, each wake-up costs a GIL hand-off.
                    for _ in range(_INPUT_BATCH):
                        try:
                            frames = wire.recv_frames(sock, _NOBLOCK)
                        except zmq.Again:
                            break
                        self._accept_frames(frames, decoders)
        except zmq.ContextTerminated:
            return
        except BaseException as exc:
            self._inputs.put(("the input thread", exc))

    def _accept_frames(self, frames: list[Any], decoders: Any) -> None:
        try:
            self._inputs.put(self._codec.decode_request(frames, decoders))
        except wire.WireError as exc:
            self.dropped_frames += 1
            log.warning("engine %d: dropped a request: %s", self.engine_index, exc)

    def _main_loop(self, sender: _OutputSender) -> _Fatal | None:
        model = self.model
        next_watch = 0.0
        while not self._stop.is_set():
            if model.has_work:
                try:
                    item = self._inputs.get_nowait()
                except queue.Empty:
                    item = None
            else:
                item = _wait_for(self._inputs,
                                _BACKLOG_RETRY_S if sender.backlogged else _IDLE_WAIT_S)
            while item is not None:
                fatal = self._apply(item, sender)
                if fatal is not None:
                    return fatal
                try:
                    item = self._inputs.get_nowait()
                except queue.Empty:
                    item = None
            if model.has_work:
                try:
                    produced = model.step()
                except Exception as exc:
                    return ("the model's step", exc)
                self._send_outputs(produced, sender)
            if sender.backlogged:
                sender.retry()
            now = time.monotonic()
            if now >= next_watch:
                next_watch = now + _WATCH_EVERY_S
                gone = [w.pid for w in self._client_watches if w.exited()]
                if gone:
                    log.warning("engine %d: client process(es) %s gone; shutting down",
                                self.engine_index, gone)
                    return None
        return None

    def _apply(self, item: tuple[RequestType, Any] | _Fatal,
               sender: _OutputSender) -> _Fatal | None:
        kind = item[0]
        value: Any = item[1]
        if isinstance(kind, str):
            return (kind, value)
        if kind is _ADD:
            if 0 <= value.client_index < len(self._pushes):
                self.model.add(value)
            else:
                self.dropped_frames += 1
                log.warning("engine %d: ADD %r names client %d of %d", self.engine_index,
                            value.request_id, value.client_index, len(self._pushes))
        elif kind is _ABORT:
            self.model.abort(value)
        elif kind is _UTILITY:
            self._run_utility(sender, *value)
        return None

    def _run_utility(self, sender: _OutputSender, client_index: int, call_id: int,
                     method: str, args: list[Any]) -> None:
        if not 0 <= client_index < len(self._pushes):
            self.dropped_frames += 1
            return
        try:
            result = UtilityOutput(call_id, None, self.model.utility(method, args))
        except Exception as exc:
            result = UtilityOutput(call_id, f"{type(exc).__name__}: {exc}", None)
        sender.send(client_index, EngineOutputs(self.engine_index, [], result))

    def _send_outputs(self, produced: list[tuple[int, EngineOutput]],
                      sender: _OutputSender) -> None:
        """One message per client per step (every client at once, in the common case)."""
        if not produced:
            return
        first = produced[0][0]
        outputs = [o for client_index, o in produced if client_index == first]
        if len(outputs) == len(produced):  # one pass for the check and the list
            sender.send(first, EngineOutputs(self.engine_index, outputs))
            return
        per_client: dict[int, list[EngineOutput]] = {}
        for client_index, output in produced:
            per_client.setdefault(client_index, []).append(output)
        for client_index, outputs in per_client.items():
            sender.send(client_index, EngineOutputs(self.engine_index, outputs))

    def _send_dead(self) -> None:
        for push in self._pushes:
            with contextlib.suppress(zmq.ZMQError):
                push.send(ENGINE_CORE_DEAD, zmq.NOBLOCK)
        # Give the I/O thread a moment to put the sentinel on the wire before teardown.
        deadline = time.monotonic() + 0.2
        for push in self._pushes:
            push.setsockopt(zmq.LINGER, max(1, int((deadline - time.monotonic()) * 1000)))

    def _teardown(self) -> None:
        for watch in self._client_watches:
            watch.close()
        for sock in (*self._dealers, *self._handshakes):
            sock.close(linger=0)
        for push in self._pushes:
            push.close()
        self._ctx.term()


#: Signals delivered to the process, not raised by a fault of the thread itself: the ones a
#: timed wait may hold back (a synchronous fault signal must never be blocked).
_DEFERRABLE_SIGNALS: Final = frozenset(signal.valid_signals()) - {
    signal.SIGKILL, signal.SIGSTOP, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE,
    signal.SIGILL, signal.SIGTRAP, signal.SIGSYS, signal.SIGABRT}

_Item = Any


def _wait_for(inputs: queue.SimpleQueue[_Item], timeout_s: float) -> _Item | None:
    """The next item of ``inputs``, waiting at most ``timeout_s``; ``None`` if none came.

    The wait runs with the deferrable signals blocked in this thread, so no signal
    handler runs inside it: CPython 3.11's ``SimpleQueue.get(timeout=...)`` waits again
    after a handler that interrupted it with the *remaining* timeout, and when the
    handler ran past the deadline that remainder is negative, which means *forever*
    (a SIGTERM whose handler calls :meth:`EngineCore.shutdown` then left the main
    loop asleep for good, its input thread already gone: PIPE-6's bounded shutdown
    broke about once in a dozen SIGTERMs under load). A signal that arrives meanwhile
    stays pending (or goes to another thread) and its handler runs as soon as the wait
    ends, within ``timeout_s`` (5-20 ms here). Two ``pthread_sigmask`` calls per idle
    wait; the busy loop never waits.
    """
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _DEFERRABLE_SIGNALS)
    try:
        return inputs.get(timeout=timeout_s)
    except queue.Empty:
        return None
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


class _OutputSender:
    """The main loop's sending state: encoder, buffer pool, per-client backlogs.

    Used by one thread only (the main loop), as are the PUSH sockets it sends on.
    """

    def __init__(self, pushes: list[zmq.Socket[bytes]], codec: Any = wire) -> None:
        self._pushes = pushes
        self._encoder = codec.Encoder()
        self._free: list[bytearray] = []
        #: Buffers in flight: the tracker of the frame that carries each.
        self._in_flight: deque[tuple[zmq.MessageTracker, bytearray]] = deque()
        self._backlog: dict[int, deque[list[Any]]] = {}

    @property
    def backlogged(self) -> bool:
        return any(self._backlog.values())

    def _buffer(self) -> bytearray:
        """The most recently released buffer (warm in cache), else one whose frame is done."""
        if not self._free:
            while self._in_flight and self._in_flight[-1][0].done:
                self._free.append(self._in_flight.pop()[1])
        return self._free.pop() if self._free else bytearray()

    def send(self, client_index: int, outputs: EngineOutputs) -> None:
        buffer = self._buffer()
        frames = self._encoder.encode(outputs, into=buffer)
        backlog = self._backlog.get(client_index)
        if backlog:
            backlog.append(frames)
            return
        if not self._try_send(client_index, frames):
            self._backlog.setdefault(client_index, deque()).append(frames)

    def _try_send(self, client_index: int, frames: list[Any]) -> bool:
        sock = self._pushes[client_index]
        try:
            tracker = self._send_frames(sock, frames)
        except zmq.Again:
            return False
        self._track(tracker, frames[0])
        return True

    def _send_frames(self, sock: zmq.Socket[bytes], frames: list[Any]) -> zmq.MessageTracker:
        """Send one message; return the tracker of frame 0 (the payload frame).

        Below ``sock.copy_threshold`` (64 KiB) pyzmq copies the blob into
        the zmq message and returns a finished tracker: the buffer is free
        at once, and no tracker or garbage-collector hand-off is paid.
        Above it the blob goes zero-copy and the tracker guards its buffer.
        Only the first frame is ``NOBLOCK``: once it is queued, libzmq
        takes the rest of a multipart message whole.
        """
        last = len(frames) - 1
        # Plain int flags: OR-ing pyzmq's enum flags costs more than a small send.
        tracker = sock.send(frames[0], _SNDMORE_NOBLOCK if last else _NOBLOCK,
                            copy=False, track=True)
        for position in range(1, last + 1):
            sock.send(frames[position], _SNDMORE if position < last else 0, copy=False)
        assert isinstance(tracker, zmq.MessageTracker)
        return tracker

    def _track(self, tracker: zmq.MessageTracker, buffer: bytearray) -> None:
        if tracker.done:
            self._free.append(buffer)
        else:
            self._in_flight.appendleft((tracker, buffer))

    def retry(self) -> None:
        for client_index, backlog in self._backlog.items():
            while backlog and self._try_send(client_index, backlog[0]):
                backlog.popleft()

    def flush(self, timeout_s: float) -> None:
        """Send what the backlogs hold, waiting (on POLLOUT) at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        self.retry()
        while self.backlogged:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            poller = zmq.Poller()
            for client_index, backlog in self._backlog.items():
                if backlog:
                    poller.register(self._pushes[client_index], zmq.POLLOUT)
            poller.poll(int(left * 1000) + 1)
            self.retry()


EngineCore._sender_type = _OutputSender
