"""The reference client side of the ``vllm-v1`` pipeline (an API server's engine client).

``EngineClient(addresses, *, client_index, client_count, engine_indices, **options)``
binds a handshake ROUTER, a request ROUTER and an output PULL, then
``wait_ready()`` shakes hands with every expected engine: a HELLO from an
engine index it expects gets WELCOME (the request and output addresses, this
client's index and pid); an unknown or duplicate index gets REFUSED. Ready
means every engine said READY and its DEALER's first message arrived (the
ROUTER can route to it). ``wait_ready`` raises :class:`ReadyTimeout` after
``ready_timeout_ms`` naming the engines still missing, and
:class:`EngineDead` at once when a greeted engine's process ends.

Addresses are late-bound: ``"tcp"`` (loopback, port 0 for all three) or
``"ipc"`` (a fresh private directory) or a mapping ``{"handshake": ...,
"input": ..., "output": ...}`` whose tcp ports may be 0; :attr:`addresses`
holds what was bound. An explicit ipc path that a live pipeline holds is
refused (:class:`AddressInUse`; libzmq would silently take it over); a stale
one is replaced. Every ipc file this client bound is removed by ``close()``.

After ready an I/O thread owns the output PULL and the handshake socket. It
delivers outputs of requests in flight (per request, in arrival order),
resolves utility calls by call id (late results are dropped), and watches
for death three ways: the one-frame ``ENGINE_CORE_DEAD``, the end of an
engine process (a pidfd, for engines on this host), and, with
``heartbeat_ivl_ms``, ZMTP heartbeats on the PULL (a paused engine: its
connection is dropped after ``heartbeat_timeout_ms``). Heartbeats run only on
a connection whose ZMTP handshake is done, so with them the PULL also bounds
the handshake (``ZMQ_HANDSHAKE_IVL``: interval plus timeout) and ready waits
for the engines' output handshakes, not only their TCP connections: an
engine stopped between its connect and its greeting is dead as soon as a
paused one would be (PIPE-5). On death every
waiter and pending call is released with :class:`EngineDead`, later calls
raise it at once, and outputs that arrive afterwards are dropped.

What follows a death is the ``restart`` option:

- ``"none"`` (the default, as vLLM): the client stays dead; a HELLO after
  ready is refused.
- ``"adopt"``: a replacement engine with a dead engine's index is welcomed
  once the dead incarnation's process is gone (for engines on this host: its
  pidfd; a paused incarnation is still running and keeps the replacement
  out, so it can never come back as a second engine of that index). When
  the replacement said READY and its DEALER registered (the request ROUTER
  hands the identity over to it), and every engine's process is running, the
  client is alive again: ``alive`` is True, calls work. Requests and calls
  of the dead incarnation were ended at the death and stay ended, so nothing
  that incarnation sent, however late it arrives, is delivered.

Callers may use the client from several threads (requests are sent under a
lock); ``close()`` is bounded and idempotent.

CURVE (off by default): the client binds, so it is the CURVE *server* on all
three sockets (handshake ROUTER, request ROUTER, output PULL), and engines
authenticate to it with their own key pairs. ``curve_server_secret_key``
plus either ``curve_allowed_client_keys`` (the engines' public keys) or
``curve_zap_handler`` (``(engine_public_key, address) -> bool``) turn it
on; every option is set before ``bind()``. A ZAP handler in a small thread
of the client's own (``engine-client<N>-zap``, joined by ``close()``)
answers each engine's handshake, so authentication never waits for the
output I/O loop. Every socket refuses frames past a receive limit
(``ZMQ_MAXMSGSIZE``): 64 KiB on the handshake and request sockets (engines
send HELLO/READY and one empty registration message there), and
``max_message_bytes`` plus framing on the output PULL.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import socket as _socket
import struct
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Final

import msgspec
import zmq
from msgspec.structs import force_setattr

from reference_impl import _curve
from reference_impl.engine_pipeline import profiles, wire
from reference_impl.engine_pipeline.errors import (
    AddressInUse,
    ClientClosed,
    DuplicateRequest,
    EngineDead,
    MessageTooLarge,
    ReadyTimeout,
    UtilityFailed,
    UtilityTimeout,
)
from reference_impl.engine_pipeline.procwatch import ProcessWatch
from reference_impl.engine_pipeline.wire import (
    ENGINE_CORE_DEAD,
    AddRequest,
    EngineOutputs,
    FinishReason,
    RequestType,
    UtilityOutput,
)

__all__ = ["CLOSE_BOUND_S", "IPC_PATH_MAX", "RESTART_POLICIES", "EngineClient", "RequestOutput"]

log = logging.getLogger(__name__)

#: ``close()`` returns within this bound.
CLOSE_BOUND_S: Final = 1.0
#: sun_path holds 108 bytes on Linux, the terminating NUL included.
IPC_PATH_MAX: Final = 107
_ROLES: Final = ("handshake", "input", "output")
_IO_POLL_MS: Final = 50
#: The I/O thread's poll while a replacement registers (it reads the request ROUTER then).
_ADOPT_POLL_MS: Final = 5
#: What follows an engine's death (see the module docstring).
RESTART_POLICIES: Final = ("none", "adopt")
_monitor_ids = itertools.count()
_SNDMORE: Final = int(zmq.SNDMORE)
#: Bound once: a class attribute lookup on an Enum costs a descriptor call.
_ADD: Final = RequestType.ADD
_NOBLOCK: Final = int(zmq.NOBLOCK)
_IDENTITIES: Final = {i: wire.engine_identity(i) for i in range(64)}
#: Receive limit of the handshake and request sockets (HELLO, READY, a registration).
CONTROL_FRAME_LIMIT: Final = 64 << 10
#: What an output frame may carry beyond ``max_message_bytes`` (MessagePack framing).
_OUTPUT_FRAME_SLACK: Final = 64 << 10
_ZAP_POLL_MS: Final = 50


class RequestOutput(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One output of one request, as :meth:`EngineClient.outputs` returns it.

    ``finish_reason`` is a :class:`~reference_impl.engine_pipeline.wire.FinishReason`
    (or ``None`` while the request runs); a value the profile does not know arrives as
    ``ERROR``. ``engine_index`` names the engine whose message carried it.

    The client decodes each output of an engine's message straight into this struct
    (its first five fields are the wire's ``EngineOutput``, in the wire's order, with the
    same types and defaults, so the same frames decode and the same are refused), then
    sets ``engine_index`` from the message and maps the finish reason: one object per
    token instead of a decoded ``EngineOutput`` plus a copy of it (docs/engine_pipeline.md,
    Performance, has what it saves). A sixth element, which an ``EngineOutput`` would
    ignore, must be an integer here and is overwritten (unless it already names the
    message's engine).

    Not tracked by the cyclic garbage collector (one per token; no cycle runs
    through it, as for the wire structs: see :mod:`.wire`).
    """

    request_id: str
    token_ids: list[int]
    finish_reason: int | None = None
    payload: Any = None
    detail: Any = None
    engine_index: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class _DeliveredOutputs(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """An output message as the client decodes it: :class:`~.wire.EngineOutputs` with its
    outputs as :class:`RequestOutput` (the same fields, types and defaults)."""

    engine_index: int
    outputs: list[RequestOutput] = []
    utility_output: UtilityOutput | None = None


class EngineClient:
    """One API server's client of its engines (see the module docstring)."""

    def __init__(self, addresses: str | Mapping[str, Any] = "tcp", *, client_index: int = 0,
                 client_count: int = 1, engine_indices: Sequence[int] = (0,),
                 ready_timeout_ms: int = 10_000, heartbeat_ivl_ms: int = 0,
                 heartbeat_timeout_ms: int = 0, max_message_bytes: int = 64 << 20,
                 restart: str = "none", wire: str = profiles.DEFAULT,
                 curve_server_secret_key: bytes | str | None = None,
                 curve_allowed_client_keys: Sequence[bytes | str] | None = None,
                 curve_zap_handler: _curve.ZapPolicy | None = None) -> None:
        # Checked first: a bad key is a ValueError before any socket exists.
        self._curve = _curve.server_config(curve_server_secret_key, curve_allowed_client_keys,
                                           curve_zap_handler)
        if not 0 <= client_index < client_count:
            raise ValueError(f"client_index {client_index} not in range({client_count})")
        if not engine_indices or len(set(engine_indices)) != len(engine_indices):
            raise ValueError(f"engine_indices {list(engine_indices)} must be distinct, and "
                             "at least one")
        if restart not in RESTART_POLICIES:
            raise ValueError(f"restart must be one of {', '.join(RESTART_POLICIES)}; got "
                             f"{restart!r:.40}")
        self.restart = restart
        #: The wire profile's codec (:mod:`.profiles`): vllm-v1 unless ``wire`` names another.
        self._codec = profiles.codec(wire)
        self.client_index = client_index
        self.client_count = client_count
        self.engine_indices = list(engine_indices)
        self.ready_timeout_ms = ready_timeout_ms
        self.heartbeat_ivl_ms = heartbeat_ivl_ms
        self.heartbeat_timeout_ms = heartbeat_timeout_ms or heartbeat_ivl_ms * 3
        self.max_message_bytes = max_message_bytes
        self.dropped_frames = 0
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._ipc_dir: str | None = None
        self._ipc_files: list[str] = []
        self._send_lock = threading.Lock()
        #: Guards the client's state; ``_state`` waits and notifies on it. The hot paths
        #: take the lock itself (a C call) instead of the Condition's Python-level
        #: ``__enter__``/``__exit__``.
        self._lock = threading.RLock()
        self._state = threading.Condition(self._lock)
        self._encoder = self._codec.Encoder()
        self._outputs: list[RequestOutput] = []
        #: Output messages delivered so far (the I/O thread wakes readers once per batch).
        self._delivered = 0
        self._requests: dict[str, int] = {}
        self._calls: dict[int, Future[Any]] = {}
        self._call_ids = itertools.count(1)
        self._round_robin = itertools.cycle(self.engine_indices)
        self._watches: dict[int, ProcessWatch] = {}
        self._dead: EngineDead | None = None
        #: Replacements being adopted (restart "adopt"), by engine index; the I/O thread's.
        self._adopting: dict[int, _Adoption] = {}
        #: Replacements swapped in, waiting for the client to come back to life.
        self._adopted: list[int] = []
        #: How many times the client came back to life by adopting (restart "adopt").
        self.adoptions = 0
        self._closed = False
        self._ready = False
        self._io_thread: threading.Thread | None = None
        self._monitor: zmq.Socket[bytes] | None = None
        #: Output connections accepted and still up (fds, from the monitor).
        self._output_fds: set[int] = set()
        #: Output connections whose ZMTP handshake succeeded, so far (the monitor's event
        #: names no fd: a count), and that count when ``_engine_fds`` was last taken.
        self._output_handshakes = 0
        self._handshakes_at_adoption = 0
        #: The engines' output connections: those up when the client became ready.
        self._engine_fds: frozenset[int] | None = None
        self._sockets: list[zmq.Socket[bytes]] = []
        self._zap: _curve.ZapHandler | None = None
        self._zap_thread: threading.Thread | None = None
        self._zap_stop = threading.Event()
        try:
            self._start_zap()
            endpoints = self._endpoints(addresses)
            self._handshake = self._bind(zmq.ROUTER, endpoints["handshake"])
            self._input = self._bind(zmq.ROUTER, endpoints["input"], mandatory=True)
            self._output = self._bind(zmq.PULL, endpoints["output"], heartbeat=True)
            if self.heartbeat_ivl_ms:
                self._monitor = self._start_monitor()
        except BaseException:
            self._release()
            raise
        self.addresses = {
            role: sock.getsockopt_string(zmq.LAST_ENDPOINT)
            for role, sock in zip(_ROLES, (self._handshake, self._input, self._output),
                                  strict=True)
        }
        advertise = addresses.get("advertise") if isinstance(addresses, Mapping) else None
        #: What WELCOME tells engines to connect to (a proxy in front, for instance).
        self.advertised = {role: str((advertise or {}).get(role, self.addresses[role]))
                           for role in ("input", "output")}

    # -- addresses ----------------------------------------------------------------

    @property
    def handshake_address(self) -> str:
        """What engines are given to reach this client."""
        return self.addresses["handshake"]

    def _endpoints(self, addresses: str | Mapping[str, Any]) -> dict[str, str]:
        if addresses == "tcp":
            return dict.fromkeys(_ROLES, "tcp://127.0.0.1:0")
        if addresses == "ipc":
            self._ipc_dir = tempfile.mkdtemp(prefix="zmqep-")
            if len(self._ipc_dir) + 12 > IPC_PATH_MAX:
                shutil.rmtree(self._ipc_dir, ignore_errors=True)
                self._ipc_dir = tempfile.mkdtemp(prefix="zmqep-", dir="/tmp")
            return {role: f"ipc://{self._ipc_dir}/{role[:2]}" for role in _ROLES}
        if isinstance(addresses, Mapping):
            missing = [r for r in _ROLES if r not in addresses]
            if missing:
                raise ValueError(f"addresses lack {', '.join(missing)}; give all of "
                                 f"{', '.join(_ROLES)}, or 'tcp' or 'ipc'")
            return {role: str(addresses[role]) for role in _ROLES}
        raise ValueError(f"addresses must be 'tcp', 'ipc' or a mapping of {', '.join(_ROLES)}; "
                         f"got {addresses!r:.80}")

    def _bind(self, kind: int, endpoint: str, *, mandatory: bool = False,
              heartbeat: bool = False) -> zmq.Socket[bytes]:
        sock = self._ctx.socket(kind)
        self._sockets.append(sock)
        sock.setsockopt(zmq.LINGER, 0)
        self._secure(sock, kind)
        if mandatory:
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
            if self.restart == "adopt":
                # A replacement's DEALER takes the identity over even if the dead
                # incarnation's connection is not torn down yet.
                sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        if kind == zmq.PULL:
            sock.setsockopt(zmq.RCVHWM, 0)
        if heartbeat and self.heartbeat_ivl_ms:
            sock.setsockopt(zmq.HEARTBEAT_IVL, self.heartbeat_ivl_ms)
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, self.heartbeat_timeout_ms)
            sock.setsockopt(zmq.HEARTBEAT_TTL, self.heartbeat_timeout_ms)
            # A connection still in its handshake has no heartbeat (libzmq starts it after
            # the handshake); this bounds that phase as the heartbeat bounds the rest, so a
            # peer stopped mid-handshake is dropped (DISCONNECTED) as a paused one is,
            # instead of after libzmq's default 30 s.
            sock.setsockopt(zmq.HANDSHAKE_IVL, self._handshake_deadline_ms)
        if endpoint.startswith("ipc://"):
            path = endpoint[len("ipc://"):]
            _claim_ipc_path(path)
            sock.bind(endpoint)
            self._ipc_files.append(path)
        elif endpoint.startswith("tcp://") and endpoint.endswith(":0"):
            sock.bind(endpoint[:-2] + ":*")
        else:
            sock.bind(endpoint)
        return sock

    # -- security -----------------------------------------------------------------

    def _secure(self, sock: zmq.Socket[bytes], kind: int) -> None:
        """The receive limit and (when on) CURVE: before bind(), as libzmq copies options
        into a listener when it is created and ignores later changes."""
        limit = (self.max_message_bytes + _OUTPUT_FRAME_SLACK if kind == zmq.PULL
                 else CONTROL_FRAME_LIMIT)
        sock.setsockopt(zmq.MAXMSGSIZE, limit)
        if self._curve is not None:
            self._curve.apply(sock)

    def _start_zap(self) -> None:
        """Bind the ZAP handler (before any CURVE socket binds) and start its thread."""
        if self._curve is None:
            return
        self._zap = _curve.ZapHandler(self._ctx, self._curve.policy)
        self._zap_thread = threading.Thread(target=self._zap_loop, args=(self._zap,),
                                            daemon=True,
                                            name=f"engine-client{self.client_index}-zap")
        self._zap_thread.start()

    def _zap_loop(self, zap: _curve.ZapHandler) -> None:
        """The ZAP thread: answers handshakes until close(); it closes the ZAP socket."""
        try:
            while not self._zap_stop.is_set():
                if zap.socket.poll(_ZAP_POLL_MS):
                    zap.serve()
        except zmq.ZMQError:
            pass  # the context is terminating
        finally:
            zap.close()

    def _stop_zap(self) -> None:
        self._zap_stop.set()
        if self._zap_thread is not None:
            self._zap_thread.join(CLOSE_BOUND_S / 4)
        elif self._zap is not None:
            self._zap.close()

    # -- startup ------------------------------------------------------------------

    def wait_ready(self, timeout_ms: int | None = None) -> None:
        """Shake hands until every expected engine is ready (see the module docstring)."""
        self._check_usable()
        if self._ready:
            return
        limit_ms = self.ready_timeout_ms if timeout_ms is None else timeout_ms
        deadline = time.monotonic() + limit_ms / 1000
        expected = set(self.engine_indices)
        said_ready: set[int] = set()
        registered: set[int] = set()
        poller = zmq.Poller()
        poller.register(self._handshake, zmq.POLLIN)
        poller.register(self._input, zmq.POLLIN)
        while not (said_ready >= expected and registered >= expected):
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(expected - (said_ready & registered))
                raise ReadyTimeout(f"client {self.client_index}: engine(s) {missing} not ready "
                                   f"within {limit_ms} ms (greeted: {sorted(self._watches)}, "
                                   f"said READY: {sorted(said_ready)})")
            for sock, _ in poller.poll(int(min(left, 0.05) * 1000) + 1):
                if sock is self._input:
                    frames = sock.recv_multipart()
                    index = wire.identity_index(frames[0])
                    if index in expected:
                        registered.add(index)
                else:
                    self._on_handshake(sock.recv_multipart(), expected, said_ready)
            death = self._startup_death()
            if death is not None:
                self._die(death)
                raise self._dead_error()
        self._adopt_output_connections(deadline, limit_ms)
        self._ready = True
        self._io_thread = threading.Thread(target=self._io_loop, daemon=True,
                                           name=f"engine-client{self.client_index}-io")
        self._io_thread.start()

    def _startup_death(self) -> str | None:
        """Why startup failed: a greeted engine's process ended before it was ready."""
        for index, watch in self._watches.items():
            if watch.exited():
                return f"engine {index} (pid {watch.pid}) exited during startup"
        return None

    def _on_handshake(self, frames: list[bytes], expected: set[int] | None,
                      said_ready: set[int]) -> None:
        if len(frames) != 2:
            self.dropped_frames += 1
            return
        routing_id, frame = frames
        try:
            message = wire.decode_handshake(frame)
        except wire.WireError as exc:
            self.dropped_frames += 1
            log.warning("client %d: bad handshake frame: %s", self.client_index, exc)
            return
        index = message.get("engine_index")
        status = message["status"]
        if status == "HELLO":
            reason = self._refusal(index, expected)
            if reason is not None:
                self._handshake.send_multipart([routing_id, wire.encode_handshake(
                    {"status": "REFUSED", "reason": reason})])
                return
            assert isinstance(index, int)
            pid = message.get("pid")
            watch = (ProcessWatch(pid) if isinstance(pid, int)
                     and message.get("host") == _socket.gethostname() else None)
            if expected is None:  # after ready: a replacement (restart "adopt")
                self._adopting[index] = _Adoption(watch)
            elif watch is not None:
                self._watches[index] = watch
            self._handshake.send_multipart([routing_id, wire.encode_handshake({
                "status": "WELCOME", "client_index": self.client_index,
                "input": self.advertised["input"], "output": self.advertised["output"],
                "pid": os.getpid(), "host": _socket.gethostname(),
            })])
        elif status == "READY" and expected is None:
            adoption = self._adopting.get(index) if isinstance(index, int) else None
            if adoption is not None:
                adoption.ready = True
        elif status == "READY" and isinstance(index, int) and index in self._watches:
            said_ready.add(index)
        elif status == "READY" and isinstance(index, int) and expected is not None \
                and index in expected:
            said_ready.add(index)  # an engine on another host (no pid watch)

    def _refusal(self, index: Any, expected: set[int] | None) -> str | None:
        if not isinstance(index, int) or isinstance(index, bool):
            return f"engine_index {index!r:.20} is not an integer"
        if expected is None:
            return self._adopt_refusal(index)
        if index not in expected:
            return f"engine {index} is not one of {sorted(expected)}"
        watch = self._watches.get(index)
        if watch is not None and not watch.exited():
            return f"engine {index} is already greeted (pid {watch.pid}): a duplicate"
        return None

    def _adopt_refusal(self, index: int) -> str | None:
        """Why a HELLO after ready is refused; ``None``: welcome a replacement."""
        if self.restart != "adopt":
            return (f"engine {index}: this client is running and adopts no engine "
                    "(restart policy none)")
        if index not in self.engine_indices:
            return f"engine {index} is not one of {self.engine_indices}"
        if self._dead is None:
            return (f"engine {index} is running: a replacement is adopted only after an "
                    "engine's death")
        pending = self._adopting.get(index)
        if pending is not None:
            if pending.watch is None or not pending.watch.exited():
                return f"engine {index} already has a replacement being adopted: a duplicate"
            del self._adopting[index]  # it died before its adoption: this one may take over
            pending.close()
        old = self._watches.get(index)
        if old is not None and not old.exited():
            return (f"engine {index}'s previous incarnation (pid {old.pid}) is still running; "
                    "its replacement is adopted once that process is gone")
        return None

    def _register_replacements(self) -> None:
        """Read the request ROUTER for replacements' first messages (under the send lock:
        the socket is the callers' otherwise)."""
        with self._send_lock:
            while True:
                try:
                    frames = self._input.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    return
                index = wire.identity_index(frames[0])
                adoption = None if index is None else self._adopting.get(index)
                if adoption is not None:
                    adoption.registered = True

    def _complete_adoptions(self, poller: zmq.Poller) -> None:
        """Swap in every replacement that is ready and registered; alive again when every
        engine's process is running. A replacement that died before it was adopted is
        forgotten (the next one is welcome)."""
        for index in [i for i, a in self._adopting.items()
                      if a.watch is not None and a.watch.exited()]:
            log.warning("client %d: replacement engine %d died before its adoption",
                        self.client_index, index)
            self._adopting.pop(index).close()
        done = [i for i, a in self._adopting.items() if a.ready and a.registered]
        for index in done:
            adoption = self._adopting.pop(index)
            old = self._watches.pop(index, None)
            if old is not None:
                if old.fd is not None:
                    with contextlib.suppress(KeyError):
                        poller.unregister(old.fd)
                old.close()
            if adoption.watch is not None:
                self._watches[index] = adoption.watch
                if adoption.watch.fd is not None:
                    poller.register(adoption.watch.fd, zmq.POLLIN)
        self._adopted += done
        if not self._adopted or self._adopting \
                or any(w.exited() for w in self._watches.values()):
            return
        if self._monitor is not None:
            # The output connections up now are the engines' again (as at ready): the dead
            # incarnation's are gone, the replacement's must be there, handshake done
            # (PIPE-14, PIPE-5).
            while self._monitor.poll(0):
                self._on_monitor_event(self._monitor.recv_multipart())
            if len(self._output_fds) < len(self.engine_indices) or \
                    self._output_handshakes - self._handshakes_at_adoption < len(self._adopted):
                return  # the replacement's PUSH is not up yet: the next turn
            self._engine_fds = frozenset(self._output_fds)
            self._handshakes_at_adoption = self._output_handshakes
        with self._state:
            if self._closed:
                return
            log.warning("client %d: adopted replacement engine(s) %s", self.client_index,
                        self._adopted)
            self._adopted = []
            self._dead = None
            self.adoptions += 1
            self._state.notify_all()

    # -- requests -----------------------------------------------------------------

    def add(self, request_id: str, prompt: Sequence[int], max_tokens: int,
            payload: Any = None, engine: int | None = None) -> None:
        """Send one request; its outputs come from :meth:`outputs`."""
        self._check_usable()
        target = next(self._round_robin) if engine is None else engine
        if target not in self.engine_indices:
            raise ValueError(f"engine {target} is not one of {self.engine_indices}")
        # The request is encoded below and dropped: a caller's list needs no copy.
        tokens = prompt if type(prompt) is list else list(prompt)
        request = AddRequest(request_id, tokens, max_tokens, self.client_index,
                             None if payload is None else self._codec.prepare(payload))
        with self._send_lock:
            frames = self._encoder.encode(request)
            size = (len(frames[0]) if len(frames) == 1  # the blob alone: a bytearray
                    else sum(memoryview(f).nbytes for f in frames))
            if size > self.max_message_bytes:
                raise MessageTooLarge(f"request {request_id!r} encodes to {size} bytes; "
                                      f"max_message_bytes is {self.max_message_bytes}")
            with self._lock:
                self._check_usable()
                if request_id in self._requests:
                    raise DuplicateRequest(f"request {request_id!r} is still in flight")
                self._requests[request_id] = target
            try:
                self._send(target, _ADD, frames)
            except BaseException:
                with self._lock:
                    self._requests.pop(request_id, None)
                raise

    def abort(self, request_ids: Iterable[str]) -> None:
        """Abort requests in flight; each ends with one ABORT finish (unknown ids: ignored)."""
        self._check_usable()
        per_engine: dict[int, list[str]] = {}
        with self._state:
            for rid in request_ids:
                target = self._requests.get(rid)
                if target is not None:
                    per_engine.setdefault(target, []).append(rid)
        with self._send_lock:
            for target, ids in per_engine.items():
                self._send(target, RequestType.ABORT, self._encoder.encode(ids))

    def call(self, method: str, *args: Any, timeout_ms: int = 5000,
             engine: int | None = None) -> Any:
        """Run a utility on an engine (default: the first) and return its result."""
        self._check_usable()
        target = self.engine_indices[0] if engine is None else engine
        if target not in self.engine_indices:
            raise ValueError(f"engine {target} is not one of {self.engine_indices}")
        call_id = next(self._call_ids)
        future: Future[Any] = Future()
        with self._state:
            self._check_usable()
            self._calls[call_id] = future
        try:
            with self._send_lock:
                body = (self.client_index, call_id, method, self._codec.prepare(list(args)))
                self._send(target, RequestType.UTILITY, self._encoder.encode(body))
            return future.result(timeout_ms / 1000)
        except FutureTimeout:
            raise UtilityTimeout(f"utility {method!r} (call {call_id}) got no result within "
                                 f"{timeout_ms} ms") from None
        finally:
            with self._state:
                self._calls.pop(call_id, None)

    def _send(self, target: int, kind: RequestType, frames: list[Any]) -> None:
        """``[identity, type byte, blob, aux...]`` on the request ROUTER (send lock held).

        One ``send`` per frame with plain int flags: ``send_multipart`` ORs an
        enum flag per frame and checks every part again, which cost about
        three times the sends themselves. Blob and aux frames go
        ``copy=False``: pyzmq copies those below its 64 KiB threshold anyway
        and sends larger ones zero-copy (the blob is a fresh buffer; aux
        frames are the caller's arrays and bytes, as before). The identity
        frame goes first: with ``ROUTER_MANDATORY`` an engine that is not
        connected fails it with ``EHOSTUNREACH`` before anything is queued.
        """
        sock = self._input
        try:
            sock.send(_IDENTITIES.get(target) or wire.engine_identity(target), _SNDMORE)
            sock.send(kind, _SNDMORE)  # a bytes enum: the member is its type byte
            last = len(frames) - 1
            for position, frame in enumerate(frames):
                sock.send(frame, _SNDMORE if position < last else 0, copy=False)
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                self._die(f"engine {target} is not connected (EHOSTUNREACH)")
                raise self._dead_error() from None
            raise

    # -- outputs ------------------------------------------------------------------

    def outputs(self, timeout_ms: int = 0) -> list[RequestOutput]:
        """Outputs received since the last call, waiting up to ``timeout_ms`` for one.

        Outputs already received are returned even after a death; once none
        is left, a dead client raises :class:`EngineDead` (a closed one
        :class:`ClientClosed`).
        """
        deadline = time.monotonic() + timeout_ms / 1000
        with self._state:
            while not self._outputs:
                if self._closed:
                    raise ClientClosed("the client is closed")
                if self._dead is not None:
                    raise self._dead_error()
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self._state.wait(left)
            taken = self._outputs
            self._outputs = []  # a fresh list: no copy of what is taken
            return taken

    @property
    def alive(self) -> bool:
        return self._dead is None and not self._closed

    def _io_loop(self) -> None:
        # The vllm-v1 codec decodes outputs straight into RequestOutput (_DeliveredOutputs);
        # another profile's decodes to the suite's EngineOutputs, copied in _on_output.
        decoders = (wire.Decoders(outputs_type=_DeliveredOutputs) if self._codec is wire
                    else self._codec.Decoders())
        poller = zmq.Poller()
        poller.register(self._output, zmq.POLLIN)
        poller.register(self._handshake, zmq.POLLIN)
        if self._monitor is not None:
            poller.register(self._monitor, zmq.POLLIN)
        for watch in self._watches.values():
            if watch.fd is not None:
                poller.register(watch.fd, zmq.POLLIN)
        try:
            while not self._closed:
                events = dict(poller.poll(_ADOPT_POLL_MS if self._adopting or self._adopted
                                          else _IO_POLL_MS))
                if self._output in events:
                    before = self._delivered
                    for _ in range(256):
                        try:
                            frames = wire.recv_frames(self._output, _NOBLOCK)
                        except zmq.Again:
                            break
                        self._on_output(frames, decoders)
                    if self._delivered != before:
                        # One wake-up per batch read, not per message: a reader woken
                        # mid-batch would only contend for the GIL with this thread.
                        with self._state:
                            self._state.notify_all()
                if self._handshake in events:
                    self._on_handshake(self._handshake.recv_multipart(), None, set())
                if self._monitor is not None and self._monitor in events:
                    self._on_monitor_event(self._monitor.recv_multipart())
                for index, watch in self._watches.items():
                    if (watch.fd is None or watch.fd in events) and watch.exited():
                        if watch.fd is not None:
                            poller.unregister(watch.fd)  # readable for good: no busy loop
                        self._die(f"engine {index} (pid {watch.pid}) exited")
                if self._adopting or self._adopted:
                    self._register_replacements()
                    self._complete_adoptions(poller)
        except zmq.ContextTerminated:
            return
        except Exception as exc:
            self._die(f"the client's I/O thread failed: {type(exc).__name__}: {exc}")

    def _on_output(self, frames: list[Any], decoders: Any) -> None:
        if len(frames) == 1 and len(frames[0]) == len(ENGINE_CORE_DEAD) \
                and frames[0].bytes == ENGINE_CORE_DEAD:
            self._die("an engine reported a fatal error (ENGINE_CORE_DEAD)")
            return
        try:
            message: Any = self._codec.decode_outputs(frames, decoders)
        except wire.WireError as exc:
            self.dropped_frames += 1
            log.warning("client %d: dropped an output message: %s", self.client_index, exc)
            return
        with self._lock:
            if self._dead is not None or self._closed:
                return
            utility = message.utility_output
            if utility is not None:
                future = self._calls.get(utility.call_id)
                if future is not None and not future.done():
                    if utility.failure_message is not None:
                        future.set_exception(UtilityFailed(utility.failure_message))
                    else:
                        future.set_result(utility.result)
            pending = self._outputs
            before = len(pending)
            if type(message) is _DeliveredOutputs:
                self._deliver_decoded(message, pending)
            else:  # another profile's codec decodes to the suite's EngineOutputs
                self._deliver_copies(message, pending)
            if len(pending) != before:
                self._delivered += 1

    def _deliver_decoded(self, message: _DeliveredOutputs,
                         pending: list[RequestOutput]) -> None:
        """``_on_output``'s routing and delivery (state lock held) of outputs decoded
        straight into :class:`RequestOutput` (the vllm-v1 codec): each output of a request
        in flight on this engine is delivered as it is, its engine index and finish
        reason set; any other is dropped and counted."""
        requests = self._requests
        append = pending.append
        reasons = _FINISH_REASONS
        engine = message.engine_index
        for out in message.outputs:
            rid = out.request_id
            if requests.get(rid) != engine:
                self.dropped_frames += 1  # unknown, finished, or another engine's
                continue
            if out.engine_index != engine:  # the default (0), or a sixth element
                force_setattr(out, "engine_index", engine)
            reason = out.finish_reason
            if reason is not None:
                force_setattr(out, "finish_reason", reasons.get(reason, _ERROR))
                del requests[rid]
            append(out)

    def _deliver_copies(self, message: EngineOutputs, pending: list[RequestOutput]) -> None:
        """``_on_output``'s routing and delivery for a profile that decodes to the suite's
        :class:`~.wire.EngineOutputs` (state lock held): a :class:`RequestOutput` per output."""
        requests = self._requests
        engine = message.engine_index
        for out in message.outputs:
            rid = out.request_id
            if requests.get(rid) != engine:
                self.dropped_frames += 1  # unknown, finished, or another engine's
                continue
            reason = out.finish_reason
            if reason is not None:
                reason = _FINISH_REASONS.get(reason, _ERROR)
                del requests[rid]
            pending.append(RequestOutput(rid, out.new_token_ids, reason, out.payload,
                                         out.detail, engine))

    def _start_monitor(self) -> zmq.Socket[bytes]:
        """Watch the output PULL from its bind on, so every engine's connection is seen."""
        endpoint = f"inproc://engine-client-monitor-{os.getpid()}-{next(_monitor_ids)}"
        self._output.monitor(endpoint, zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
                             | zmq.EVENT_HANDSHAKE_SUCCEEDED)
        monitor = self._ctx.socket(zmq.PAIR)
        monitor.setsockopt(zmq.LINGER, 0)
        monitor.connect(endpoint)
        self._sockets.append(monitor)
        return monitor

    @property
    def _handshake_deadline_ms(self) -> int:
        """How long an output connection may take its ZMTP handshake (with heartbeats):
        what a heartbeat needs to notice a paused peer, interval plus timeout."""
        return self.heartbeat_ivl_ms + self.heartbeat_timeout_ms

    def _adopt_output_connections(self, deadline: float, limit_ms: int) -> None:
        """At ready: the output connections up now are the engines' (PIPE-14).

        A lost connection is a dead engine only if it was one of these: a stranger's
        garbage, a refused CURVE handshake or a port scan on the output port also
        end in a disconnection, after ready (restart ``none``: no engine joins later;
        ``adopt`` renews the set at each adoption). Waits, within the ready deadline,
        until one connection per engine is up and as many handshakes succeeded (an
        engine connects its PUSH with its DEALER, so it is there already, but its ZMTP
        handshake may still be under way: an engine stopped then would never start
        the heartbeat that detects it; the handshake deadline covers what is left).
        :class:`ReadyTimeout` if they are not all there by the deadline: an engine whose
        outputs cannot arrive is not ready.
        """
        monitor = self._monitor
        if monitor is None:
            return
        while True:
            while monitor.poll(0):
                self._on_monitor_event(monitor.recv_multipart())
            left = deadline - time.monotonic()
            engines = len(self.engine_indices)
            if len(self._output_fds) >= engines and self._output_handshakes >= engines:
                break
            if left <= 0:
                raise ReadyTimeout(
                    f"client {self.client_index}: the engines' output connections were not "
                    f"all up within {limit_ms} ms ({len(self._output_fds)} of {engines} "
                    f"connected; {self._output_handshakes} ZMTP handshake(s) done)")
            monitor.poll(int(min(left, 0.05) * 1000) + 1)
        self._engine_fds = frozenset(self._output_fds)
        self._handshakes_at_adoption = self._output_handshakes

    def _on_monitor_event(self, frames: list[bytes]) -> None:
        if not frames or len(frames[0]) < 6:
            return
        event, fd = struct.unpack("=HI", frames[0][:6])
        if event == zmq.EVENT_ACCEPTED:
            self._output_fds.add(fd)
        elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self._output_handshakes += 1
        elif event == zmq.EVENT_DISCONNECTED:
            self._output_fds.discard(fd)
            if self._engine_fds is not None and fd in self._engine_fds:
                self._die("an engine's output connection was lost (no heartbeat within "
                          f"{self.heartbeat_timeout_ms} ms, no handshake within "
                          f"{self._handshake_deadline_ms} ms, or the "
                          "engine went away)")

    # -- death and close ------------------------------------------------------------

    def _die(self, reason: str) -> None:
        with self._state:
            if self._dead is not None or self._closed:
                return
            log.warning("client %d: engine dead: %s", self.client_index, reason)
            self._dead = EngineDead(reason)
            self._requests.clear()
            for future in self._calls.values():
                if not future.done():
                    future.set_exception(EngineDead(reason))
            self._state.notify_all()

    def _dead_error(self) -> EngineDead:
        assert self._dead is not None
        return EngineDead(str(self._dead))

    def _check_usable(self) -> None:
        if self._closed:
            raise ClientClosed("the client is closed")
        if self._dead is not None:
            raise self._dead_error()

    def close(self) -> None:
        """Release everything (bounded, idempotent); waiters get :class:`ClientClosed`."""
        with self._state:
            if self._closed:
                return
            self._closed = True
            for future in self._calls.values():
                if not future.done():
                    future.set_exception(ClientClosed("the client was closed"))
            self._state.notify_all()
        if self._io_thread is not None:
            self._io_thread.join(CLOSE_BOUND_S / 2)
        if self._monitor is not None and (self._io_thread is None
                                          or not self._io_thread.is_alive()):
            self._output.disable_monitor()
        self._release()

    def _release(self) -> None:
        self._stop_zap()
        for watch in self._watches.values():
            watch.close()
        for adoption in self._adopting.values():
            adoption.close()
        for sock in self._sockets:
            sock.close(linger=0)
        self._ctx.term()
        for path in self._ipc_files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        if self._ipc_dir is not None:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Adoption:
    """A replacement engine between its WELCOME and its adoption (restart "adopt")."""

    def __init__(self, watch: ProcessWatch | None) -> None:
        self.watch = watch
        self.ready = False
        self.registered = False

    def close(self) -> None:
        if self.watch is not None:
            self.watch.close()


#: The wire's finish reason values, as the enum (anything else: ERROR).
_FINISH_REASONS: Final[dict[int, FinishReason]] = {int(reason): reason for reason in FinishReason}
_ERROR: Final = FinishReason.ERROR


def _claim_ipc_path(path: str) -> None:
    """Refuse a path a live socket listens on; remove a stale one (libzmq would take over)."""
    if len(path.encode()) > IPC_PATH_MAX:
        raise ValueError(f"ipc path {path!r} is {len(path.encode())} bytes; the socket path "
                         f"limit is {IPC_PATH_MAX}")
    if not os.path.exists(path):
        return
    probe = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        probe.settimeout(0.5)
        probe.connect(path)
    except OSError:
        os.unlink(path)  # nobody listens: a leftover of a dead pipeline
        return
    finally:
        probe.close()
    raise AddressInUse(f"ipc path {path} is held by a live pipeline; refusing to take it over")
