"""Mutants of the engine-pipeline reference: one real defect each, and the clause that kills it.

Each entry of :data:`CATALOG` names an implementation object (``MODULE:ATTR``
with ``engine``/``client`` factories and capabilities) that differs from
``reference_impl.engine_pipeline:REFERENCE`` by one defect modelled on a
failure shipped in vLLM or SGLang. Engine mutants are module-level classes:
the suite builds engines in processes of their own by name.
``zmq-conformance self-check --contract engine-pipeline`` runs the suite
against each and reports the clauses that failed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import pickle
import socket
import time
from collections.abc import Mapping
from typing import Any, Final

import msgspec
import numpy as np
import zmq

from conformance.selfcheck.mutants import Mutant
from reference_impl.engine_pipeline import (
    REFERENCE_CAPABILITIES,
    AdoptingClient,
    HeartbeatClient,
    PipelineImplementation,
    wire,
)
from reference_impl.engine_pipeline.engine import EngineCore, _OutputSender
from reference_impl.engine_pipeline.errors import EngineDead, HandshakeTimeout
from reference_impl.engine_pipeline.model import FakeModel
from reference_impl.engine_pipeline.wire import EngineOutput, FinishReason

BASE: Final = "reference_impl.engine_pipeline:REFERENCE"
_M = "conformance.contracts.engine_pipeline.mutants"


# -- clients -------------------------------------------------------------------


class _FortranBytesEncoder(wire.Encoder):
    def _encode_array(self, array: np.ndarray[Any, Any]) -> msgspec.msgpack.Ext:
        data = array.tobytes(order="A")  # the memory order, not C order
        ref: Any = data if len(data) < wire.INLINE_THRESHOLD else self._aux_index(data)
        body = msgspec.msgpack.encode([array.dtype.str, list(array.shape), ref])
        return msgspec.msgpack.Ext(wire.EXT_NDARRAY, body)


class FortranBytesClient(HeartbeatClient):
    """Sends an array's bytes in memory order: a transposed array arrives scrambled."""

    def __init__(self, addresses: Any = "tcp", **options: Any) -> None:
        super().__init__(addresses, **options)
        self._encoder = _FortranBytesEncoder()


class NoProcessWatchClient(HeartbeatClient):
    """Relies on the ENGINE_CORE_DEAD sentinel alone: no process watch, no heartbeat."""

    def __init__(self, addresses: Any = "tcp", **options: Any) -> None:
        options["heartbeat_ivl_ms"] = 0
        super().__init__(addresses, **options)

    def _io_loop(self) -> None:
        self._watches.clear()
        super()._io_loop()


class CallsNotFailedOnDeathClient(HeartbeatClient):
    """Marks itself dead but leaves pending utility futures waiting (vLLM PR #56416)."""

    def _die(self, reason: str) -> None:
        with self._state:
            if self._dead is not None or self._closed:
                return
            self._dead = EngineDead(reason)
            self._requests.clear()
            self._state.notify_all()


class NoReadyDeadlineClient(HeartbeatClient):
    """Ignores ``ready_timeout_ms``: waits 30 s for engines that never come (vLLM #17676)."""

    def wait_ready(self, timeout_ms: int | None = None) -> None:
        super().wait_ready(30_000)


class ReadyOnTcpAcceptClient(HeartbeatClient):
    """Takes an engine's output connection for up once it is accepted, before its ZMTP
    handshake, and leaves libzmq's 30 s handshake deadline: an engine stopped between its
    PUSH's connect and its greeting runs no heartbeat and is never seen dead."""

    @property
    def _handshake_deadline_ms(self) -> int:
        return 30_000

    def _adopt_output_connections(self, deadline: float, limit_ms: int) -> None:
        monitor = self._monitor
        if monitor is None:
            return
        while len(self._output_fds) < len(self.engine_indices) and time.monotonic() < deadline:
            if monitor.poll(50):
                self._on_monitor_event(monitor.recv_multipart())
        self._engine_fds = frozenset(self._output_fds)


class FixedIpcPathClient(HeartbeatClient):
    """Binds ipc pipelines at one fixed directory: a second pipeline cannot start."""

    def _endpoints(self, addresses: str | Mapping[str, Any]) -> dict[str, str]:
        if addresses == "ipc":
            import os
            import tempfile

            base = os.path.join(tempfile.gettempdir(), "zmqep-fixed")
            os.makedirs(base, exist_ok=True)
            return {role: f"ipc://{base}/{role[:2]}" for role in ("handshake", "input",
                                                                 "output")}
        return super()._endpoints(addresses)


class OldIncarnationClient(HeartbeatClient):
    """After a death, still delivers outputs of the requests that were in flight."""

    def _die(self, reason: str) -> None:
        with self._state:
            kept = dict(self._requests)
        super()._die(reason)
        with self._state:
            self._requests.update(kept)
            self._dead_at_reason = reason
            self._dead = None
            self._late_dead = EngineDead(reason)

    @property
    def alive(self) -> bool:
        return False if getattr(self, "_late_dead", None) is not None else super().alive

    def _check_usable(self) -> None:
        late = getattr(self, "_late_dead", None)
        if late is not None:
            raise EngineDead(str(late))
        super()._check_usable()

    def outputs(self, timeout_ms: int = 0) -> list[Any]:
        got = super().outputs(timeout_ms)
        late = getattr(self, "_late_dead", None)
        if not got and late is not None:
            raise EngineDead(str(late))
        return got


class FifoUtilityClient(HeartbeatClient):
    """Hands each utility result to the oldest waiting call, not the one with its call id."""

    def _on_output(self, frames: list[Any], decoders: wire.Decoders) -> None:
        try:
            message = wire.decode_outputs(frames, decoders)
        except wire.WireError:
            return super()._on_output(frames, decoders)
        utility = message.utility_output
        if utility is not None:
            with self._state:
                waiting = sorted(self._calls)
                if waiting:
                    utility = wire.UtilityOutput(waiting[0], utility.failure_message,
                                                 utility.result)
                    message = wire.EngineOutputs(message.engine_index, message.outputs, utility)
            frames = [zmq.Frame(bytes(memoryview(f).cast("B")))
                      for f in wire.Encoder().encode(message)]
        super()._on_output(frames, decoders)


class AdoptsOldIncarnationClient(AdoptingClient):
    """Adopts a replacement but keeps the dead incarnation's requests in flight: routing by
    engine index alone, so that incarnation's late outputs are delivered."""

    def _die(self, reason: str) -> None:
        with self._state:
            if self._dead is None and not self._closed:
                self._stale_requests = dict(self._requests)
        super()._die(reason)

    def _complete_adoptions(self, poller: zmq.Poller) -> None:
        super()._complete_adoptions(poller)
        stale = getattr(self, "_stale_requests", None)
        if stale and self._dead is None:
            with self._state:
                self._requests.update(stale)
            self._stale_requests = {}


class StartupDeathIgnoredClient(HeartbeatClient):
    """``wait_ready()`` does not watch greeted engines: one that dies between HELLO and
    READY is waited for until the ready deadline."""

    def _startup_death(self) -> str | None:
        return None


class ProbeThenBindClient(HeartbeatClient):
    """Picks each tcp port by binding a probe socket to port 0 and closing it, then binds
    the port (vLLM #24756: another process may take it in between)."""

    def _endpoints(self, addresses: str | Mapping[str, Any]) -> dict[str, str]:
        if addresses != "tcp":
            return super()._endpoints(addresses)
        chosen: dict[str, str] = {}
        for role in ("handshake", "input", "output"):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind(("127.0.0.1", 0))
                chosen[role] = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
        return chosen


# -- engines -------------------------------------------------------------------


class _LastFrameTrackerSender(_OutputSender):
    def _send_frames(self, sock: zmq.Socket[bytes], frames: list[Any]) -> zmq.MessageTracker:
        tracker = sock.send_multipart(frames, zmq.NOBLOCK, copy=False, track=True)
        assert isinstance(tracker, zmq.MessageTracker)
        return tracker


class LastFrameTrackerEngine(EngineCore):
    """Reuses a blob buffer when the *last* frame's tracker is done (vLLM #24655)."""

    _sender_type = _LastFrameTrackerSender


class _BlockingSender(_OutputSender):
    def _try_send(self, client_index: int, frames: list[Any]) -> bool:
        sock = self._pushes[client_index]
        tracker = sock.send_multipart(frames, copy=False, track=True)  # blocks at the HWM
        assert isinstance(tracker, zmq.MessageTracker)
        self._track(tracker, frames[0])
        return True


class BlockingSendEngine(EngineCore):
    """A bounded output queue with blocking sends: one stalled client stops all (#53859)."""

    _sender_type = _BlockingSender

    def _socket(self, kind: int) -> zmq.Socket[bytes]:
        sock = super()._socket(kind)
        if kind == zmq.PUSH:
            sock.setsockopt(zmq.SNDHWM, 4)  # before connect: libzmq copies it then
        return sock


class FatalExitsZeroEngine(EngineCore):
    """Catches its own fatal error and returns from serve(): the process exits 0 (#48966)."""

    def serve(self) -> None:
        try:
            super().serve()
        except Exception:
            return


class InputThreadDiesEngine(EngineCore):
    """Its input thread raises on an unknown type byte and ends silently (vLLM #26139)."""

    def _input_loop(self) -> None:
        decoders = wire.Decoders()
        poller = zmq.Poller()
        for dealer in self._dealers:
            poller.register(dealer, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                for sock, _ in poller.poll(50):
                    frames = sock.recv_multipart(copy=False)
                    if frames and frames[0].bytes not in {t.value for t in wire.RequestType}:
                        raise ValueError(f"{frames[0].bytes!r} is not a valid request type")
                    self._accept_frames(frames, decoders)
        except zmq.ContextTerminated:
            return


def _unpickling_ext_hook(code: int, data: memoryview) -> Any:
    if code == wire.EXT_PICKLE:
        return pickle.loads(data)
    return msgspec.msgpack.Ext(code, bytes(data))


class AcceptsPickleEngine(EngineCore):
    """Decodes with a pickle fallback for extension 1, as vLLM did (CVE-2025-30165)."""

    def _accept_frames(self, frames: list[Any], decoders: wire.Decoders) -> None:
        if len(frames) >= 2:
            with contextlib.suppress(Exception):
                msgspec.msgpack.decode(frames[1].bytes, ext_hook=_unpickling_ext_hook)
        super()._accept_frames(frames, decoders)


class _KeepsRunningModel(FakeModel):
    def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            running = self._running.get(rid)
            if running is not None:
                self._endings.append((running.request.client_index,
                                      EngineOutput(rid, [], int(FinishReason.ABORT))))


class RunsAfterAbortEngine(EngineCore):
    """Acknowledges an abort with a finish but keeps generating the request."""

    def __init__(self, addresses: Any, *, engine_index: int, model: Any, **options: Any) -> None:
        model.__class__ = _KeepsRunningModel
        super().__init__(addresses, engine_index=engine_index, model=model, **options)


class _ClientZeroEndingsModel(FakeModel):
    def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            if self._running.pop(rid, None) is not None:
                self._endings.append((0, EngineOutput(rid, [], int(FinishReason.ABORT))))

    def add(self, request: wire.AddRequest) -> None:
        before = len(self._endings)
        super().add(request)
        self._endings[before:] = [(0, out) for _, out in self._endings[before:]]


class AbortsToClientZeroEngine(EngineCore):
    """Sends aborts and rejections to client 0 whoever asked (SGLang #33858)."""

    def __init__(self, addresses: Any, *, engine_index: int, model: Any, **options: Any) -> None:
        model.__class__ = _ClientZeroEndingsModel
        super().__init__(addresses, engine_index=engine_index, model=model, **options)


# -- authentication and hostile input (PIPE-13, PIPE-14) ---------------------------

_log = logging.getLogger("reference_impl.engine_pipeline")


class HandshakeOnlyCurveClient(HeartbeatClient):
    """A CURVE server on its handshake ROUTER only; the request and output sockets plain."""

    def _secure(self, sock: zmq.Socket[bytes], kind: int) -> None:
        secured = getattr(self, "_secured_sockets", 0)
        self._secured_sockets = secured + 1
        curve = self._curve
        if secured:
            self._curve = None  # MUTATION: only the first socket bound gets CURVE
        try:
            super()._secure(sock, kind)
        finally:
            self._curve = curve


class HandshakeOnlyCurveEngine(EngineCore):
    """CURVE on its handshake DEALER only (the pair to :class:`HandshakeOnlyCurveClient`)."""

    def _connect_client(self, position: int, welcome: dict[str, Any]) -> None:
        curve, self._curve = self._curve, None  # MUTATION: data sockets plain
        try:
            super()._connect_client(position, welcome)
        finally:
            self._curve = curve


class CurveAfterBindClient(HeartbeatClient):
    """Sets its CURVE server options after bind(): libzmq's listeners stay plain."""

    def _secure(self, sock: zmq.Socket[bytes], kind: int) -> None:
        curve, self._curve = self._curve, None
        try:
            super()._secure(sock, kind)
        finally:
            self._curve = curve

    def _bind(self, kind: int, endpoint: str, **options: Any) -> zmq.Socket[bytes]:
        sock = super()._bind(kind, endpoint, **options)
        if self._curve is not None:
            self._curve.apply(sock)  # MUTATION: after bind()
        return sock


class ZapAllowsEveryoneClient(HeartbeatClient):
    """Its ZAP handler lets in every engine key."""

    def _start_zap(self) -> None:
        if self._curve is not None:
            self._curve = dataclasses.replace(self._curve,
                                              policy=lambda key, address: True)  # MUTATION
        super()._start_zap()


class KeysLoggedClient(HeartbeatClient):
    """Logs its CURVE configuration, secret key included, at DEBUG."""

    def __init__(self, addresses: Any = "tcp", **options: Any) -> None:
        super().__init__(addresses, **options)
        secret = options.get("curve_server_secret_key")
        if secret is not None:
            _log.debug("client CURVE server secret key %r", secret)  # MUTATION


class KeysLoggedEngine(EngineCore):
    """Logs its CURVE client secret key at DEBUG."""

    def __init__(self, addresses: Any, *, engine_index: int, model: Any, **options: Any) -> None:
        super().__init__(addresses, engine_index=engine_index, model=model, **options)
        secret = options.get("curve_client_secret_key")
        if secret is not None:
            _log.debug("engine %d CURVE secret key %r", engine_index, secret)  # MUTATION


class PlainHandshakeRetryEngine(EngineCore):
    """Retries a handshake that got no WELCOME within 300 ms on a new socket, plain: it
    does not insist on the server key it was given, so auth is gone after a retry."""

    def _handshake(self) -> None:
        timeout_ms = self.handshake_timeout_ms
        self.handshake_timeout_ms = 300
        try:
            super()._handshake()
            return
        except HandshakeTimeout:
            pass
        finally:
            self.handshake_timeout_ms = timeout_ms
        for sock in self._handshakes:
            sock.close(linger=0)
        self._handshakes.clear()
        self._curve = None  # MUTATION: the retry's sockets are plain
        super()._handshake()


class NoReceiveLimitClient(HeartbeatClient):
    """Binds without ZMQ_MAXMSGSIZE: a stranger's announced 1 GiB frame is buffered."""

    def _secure(self, sock: zmq.Socket[bytes], kind: int) -> None:
        super()._secure(sock, kind)
        sock.setsockopt(zmq.MAXMSGSIZE, -1)  # MUTATION: no receive limit


# -- implementations and the catalog ---------------------------------------------

_CAPS: dict[str, Any] = dict(REFERENCE_CAPABILITIES)


def _impl(engine: Any = EngineCore, client: Any = HeartbeatClient,
          **caps: Any) -> PipelineImplementation:
    return PipelineImplementation(engine=engine, client=client, capabilities={**_CAPS, **caps})


FORTRAN_BYTES = _impl(client=FortranBytesClient)
RUNS_AFTER_ABORT = _impl(engine=RunsAfterAbortEngine)
LAST_FRAME_TRACKER = _impl(engine=LastFrameTrackerEngine)
BLOCKING_SEND = _impl(engine=BlockingSendEngine)
NO_PROCESS_WATCH = _impl(client=NoProcessWatchClient, detects_hang=False)
CALLS_NOT_FAILED = _impl(client=CallsNotFailedOnDeathClient)
FATAL_EXITS_ZERO = _impl(engine=FatalExitsZeroEngine)
INPUT_THREAD_DIES = _impl(engine=InputThreadDiesEngine)
ACCEPTS_PICKLE = _impl(engine=AcceptsPickleEngine)
ABORTS_TO_CLIENT_ZERO = _impl(engine=AbortsToClientZeroEngine)
NO_READY_DEADLINE = _impl(client=NoReadyDeadlineClient)
READY_ON_TCP_ACCEPT = _impl(client=ReadyOnTcpAcceptClient)
FIXED_IPC_PATH = _impl(client=FixedIpcPathClient)
OLD_INCARNATION = _impl(client=OldIncarnationClient)
FIFO_UTILITY = _impl(client=FifoUtilityClient)
ADOPTS_OLD_INCARNATION = _impl(client=AdoptsOldIncarnationClient, restart="adopt")
STARTUP_DEATH_IGNORED = _impl(client=StartupDeathIgnoredClient)
PROBE_THEN_BIND = _impl(client=ProbeThenBindClient)
CURVE_HANDSHAKE_ONLY = _impl(engine=HandshakeOnlyCurveEngine, client=HandshakeOnlyCurveClient)
CURVE_AFTER_BIND = _impl(client=CurveAfterBindClient)
ZAP_ALLOWS_EVERYONE = _impl(client=ZapAllowsEveryoneClient)
KEYS_LOGGED = _impl(engine=KeysLoggedEngine, client=KeysLoggedClient)
PLAIN_HANDSHAKE_RETRY = _impl(engine=PlainHandshakeRetryEngine)
NO_RECEIVE_LIMIT = _impl(client=NoReceiveLimitClient)


def _m(name: str, attr: str, description: str, *clauses: str) -> Mutant:
    return Mutant(name, f"{_M}:{attr}", description, name.removeprefix("pipe_").replace("_", "-"),
                  tuple(clauses), base=BASE)


CATALOG: Final[tuple[Mutant, ...]] = (
    _m("pipe_array_bytes_in_memory_order", "FORTRAN_BYTES",
       "the client sends an array's bytes in memory order, so a transposed array arrives "
       "scrambled", "PIPE-1"),
    _m("pipe_runs_after_abort", "RUNS_AFTER_ABORT",
       "the engine acknowledges an abort with a finish but keeps generating", "PIPE-2"),
    _m("pipe_tracker_of_last_frame", "LAST_FRAME_TRACKER",
       "the engine reuses an output buffer once the last frame's tracker is done, not the "
       "payload frame's (vLLM #24655)", "PIPE-3"),
    _m("pipe_blocking_output_send", "BLOCKING_SEND",
       "the engine's output send blocks on a stalled client's high-water mark (#53859)",
       "PIPE-4"),
    _m("pipe_sentinel_without_process_watch", "NO_PROCESS_WATCH",
       "the client waits for ENGINE_CORE_DEAD only: a SIGKILLed engine is never noticed "
       "(vLLM PRs #21443, #21728)", "PIPE-5"),
    _m("pipe_calls_not_failed_on_death", "CALLS_NOT_FAILED",
       "pending utility calls are not released when the engine dies (vLLM PR #56416)",
       "PIPE-5"),
    _m("pipe_fatal_error_exits_zero", "FATAL_EXITS_ZERO",
       "an engine whose step raised exits with status 0 (vLLM #48966)", "PIPE-6"),
    _m("pipe_input_thread_dies_on_unknown_type", "INPUT_THREAD_DIES",
       "the engine's input thread dies silently on an unknown type byte (vLLM #26139)",
       "PIPE-7"),
    _m("pipe_accepts_pickle", "ACCEPTS_PICKLE",
       "the engine unpickles MessagePack extension 1 (CVE-2025-30165)", "PIPE-7"),
    _m("pipe_aborts_routed_to_client_zero", "ABORTS_TO_CLIENT_ZERO",
       "engine-originated aborts and rejections go to client 0 (SGLang #33858)", "PIPE-8"),
    _m("pipe_no_ready_deadline", "NO_READY_DEADLINE",
       "wait_ready() ignores its ready timeout (vLLM #17676)", "PIPE-9"),
    _m("pipe_fixed_ipc_path", "FIXED_IPC_PATH",
       "every ipc pipeline binds the same paths, so a second one cannot start", "PIPE-10"),
    _m("pipe_old_incarnation_outputs_delivered", "OLD_INCARNATION",
       "after an engine's death the client still delivers outputs for its requests",
       "PIPE-11"),
    _m("pipe_utility_results_by_arrival", "FIFO_UTILITY",
       "utility results go to the oldest waiting call, so a late reply answers the next call",
       "PIPE-12"),
    _m("pipe_adopted_with_old_incarnation_outputs", "ADOPTS_OLD_INCARNATION",
       "restart adopt: the replacement is adopted but the dead incarnation's requests stay in "
       "flight, so its late outputs are delivered", "PIPE-11"),
    _m("pipe_ready_on_tcp_accept", "READY_ON_TCP_ACCEPT",
       "the client takes an engine's output connection for up at its TCP accept, before the "
       "ZMTP handshake (where no heartbeat runs) and with libzmq's 30 s handshake deadline: an "
       "engine stopped in between is never seen dead", "PIPE-5"),
    _m("pipe_startup_death_waits_for_deadline", "STARTUP_DEATH_IGNORED",
       "wait_ready() does not watch greeted engines: an engine dead between HELLO and READY "
       "is waited for until the ready deadline", "PIPE-5"),
    _m("pipe_probe_then_bind_ports", "PROBE_THEN_BIND",
       "the client probes a free tcp port (bind to 0, close) and binds it afterwards "
       "(vLLM #24756)", "PIPE-10"),
    _m("pipe_curve_on_handshake_only", "CURVE_HANDSHAKE_ONLY",
       "CURVE on the handshake sockets only: the client's request ROUTER and output PULL "
       "(and the engine's DEALER and PUSH) are plain", "PIPE-13"),
    _m("pipe_curve_set_after_bind", "CURVE_AFTER_BIND",
       "the client sets its CURVE server options after bind(), which libzmq ignores",
       "PIPE-13"),
    _m("pipe_zap_allows_everyone", "ZAP_ALLOWS_EVERYONE",
       "the client's ZAP handler lets in every engine key", "PIPE-13"),
    _m("pipe_curve_keys_logged", "KEYS_LOGGED",
       "client and engine log their CURVE secret keys at DEBUG", "PIPE-13"),
    _m("pipe_plain_handshake_retry", "PLAIN_HANDSHAKE_RETRY",
       "an engine whose HELLO got no WELCOME retries on a new plain socket: it does not "
       "insist on the server key, so an impostor client gets it after one retry", "PIPE-13"),
    _m("pipe_no_receive_limit", "NO_RECEIVE_LIMIT",
       "the client binds without ZMQ_MAXMSGSIZE, so a stranger's announced 1 GiB frame is "
       "buffered", "PIPE-14"),
)
