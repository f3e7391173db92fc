"""The Python driver: serves any ``MODULE:ATTR`` implementation over the driver protocol.

Run as ``python -m conformance.drivers.python MODULE:ATTR`` (or the console
script ``zmq-conformance-python-driver MODULE:ATTR``), with ``MODULE:ATTR``
as ``--transport`` takes it: a p2p factory, a KV publisher or subscriber
factory, or a control implementation object. The suite's hello says which
contract to serve.

It is the protocol's executable reference (``docs/drivers.md``): the
reference implementations served through it must get the verdicts they
get in-process. So it adds nothing of its own. Each request becomes one
call of the Python object, each exception one error kind, and the
standard behaviours are :func:`conformance.drivers.behaviours.python_handler`.

stdout carries the protocol only: the driver keeps a private copy of
descriptor 1 and points descriptor 1 at stderr, so a ``print()`` in the
implementation lands in the log instead of breaking the framing. At the
end of stdin the process exits at once (``os._exit``): a finalizer of a
half-closed ZeroMQ context must not keep it alive.
"""

from __future__ import annotations

import dataclasses
import errno
import importlib
import inspect
import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from conformance.drivers.behaviours import python_handler
from conformance.drivers.protocol import (
    VERSION,
    FrameReader,
    ProtocolError,
    decode_body,
    encode_frame,
)

__all__ = ["main"]

_P2P_OPTIONS: Final = ("heartbeat_ivl_ms", "heartbeat_timeout_ms", "heartbeat_ttl_ms")
_PUBLISHER_OPTIONS: Final = (
    "buffer_steps", "max_queue", "shutdown_timeout_ms", "replay_stall_timeout_ms",
    "data_parallel_rank", "heartbeat_ivl_ms", "heartbeat_timeout_ms",
    "curve_server_secret_key", "curve_allowed_client_keys",
)
_SUBSCRIBER_OPTIONS: Final = ("replay_timeout_ms", "heartbeat_ivl_ms", "heartbeat_timeout_ms",
                               "curve_client_secret_key", "curve_server_key")
#: CURVE keywords (SEC-2, EVT-10, EVS-10): forwarded where the target takes them.
_P2P_CURVE: Final = ("curve_server_secret_key", "curve_allowed_client_keys",
                     "curve_client_secret_key", "curve_server_key")
_BYTES: Final = (bytes, bytearray, memoryview)
_CAPABILITIES: Final = "zmq_conformance_capabilities"


class _Refused(Exception):
    """A request this driver answers with an error of ``kind`` (not the implementation's)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


# -- loading -------------------------------------------------------------------------


def _load(path: str) -> Any:
    module_name, sep, attr_path = path.partition(":")
    if not sep or not module_name or not attr_path:
        raise _Refused("invalid", f"expected MODULE:ATTR, got {path!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr_path.split("."):
            target = getattr(target, part)
    except Exception as exc:
        raise _Refused("unsupported", f"cannot load {path!r}: {type(exc).__name__}: "
                                      f"{exc}") from None
    return target


def _accepts(factory: Any, name: str) -> bool:
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD
                                 for p in params.values())


def _declared(factory: Any) -> dict[str, Any]:
    declared = getattr(factory, _CAPABILITIES, None)
    if declared is None:
        return {}
    if dataclasses.is_dataclass(declared) and not isinstance(declared, type):
        return dataclasses.asdict(declared)
    return dict(declared)


# -- errors ------------------------------------------------------------------------------


def _address_in_use(exc: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if getattr(current, "errno", None) == errno.EADDRINUSE:
            return True
        if "address already in use" in str(current).lower():
            return True
        current = current.__cause__ or current.__context__
    return False


def _error(exc: BaseException) -> dict[str, Any]:
    """The error map for ``exc``: its kind by the reference's exception classes."""
    from reference_impl.control.interface import ClientClosed, RequestRejected, RequestTimeout
    from reference_impl.kv_events.publisher import PublisherClosedError
    from reference_impl.p2p.interface import (
        ConnectionDeadError,
        DuplicateConnectionError,
        MessageTooLargeError,
        SendQueueFullError,
    )

    message = f"{type(exc).__name__}: {exc}"
    body: dict[str, Any] = {"message": message}
    kinds: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], str], ...] = (
        (_Refused, ""),
        (DuplicateConnectionError, "duplicate"),
        (ConnectionDeadError, "dead"),
        (MessageTooLargeError, "too_large"),
        (SendQueueFullError, "queue_full"),
        (RequestRejected, "rejected"),
        ((RequestTimeout, TimeoutError), "timeout"),
        ((ClientClosed, PublisherClosedError), "closed"),
    )
    for classes, kind in kinds:
        if isinstance(exc, classes):
            body["kind"] = kind or getattr(exc, "kind", "error")
            break
    else:
        if _address_in_use(exc):
            body["kind"] = "address_in_use"
        elif isinstance(exc, NotImplementedError):
            body["kind"] = "unsupported"
        elif isinstance(exc, (ValueError, TypeError)):
            body["kind"] = "invalid"
        else:
            body["kind"] = "error"
    if body["kind"] == "rejected":
        reply = getattr(exc, "reply", None)
        body["reply"] = reply if isinstance(reply, dict) else {}
    if isinstance(exc, _Refused):
        body["message"] = str(exc)
    return body


# -- the objects ---------------------------------------------------------------------------


class _Objects:
    """Handles of the objects built so far; a handle is never reused."""

    def __init__(self) -> None:
        self._by_handle: dict[int, Any] = {}
        self._handles: dict[int, int] = {}
        self._next = 1

    def handle(self, obj: Any) -> int:
        """The handle of ``obj``, issuing one the first time it is seen."""
        found = self._handles.get(id(obj))
        if found is not None and self._by_handle.get(found) is obj:
            return found
        handle = self._next
        self._next += 1
        self._by_handle[handle] = obj
        self._handles[id(obj)] = handle
        return handle

    def get(self, handle: int) -> Any:
        try:
            return self._by_handle[handle]
        except KeyError:
            raise _Refused("invalid", f"no object has handle {handle}") from None


class _Server:
    """A control server and the log of what its standard behaviours ran."""

    def __init__(self) -> None:
        self.server: Any = None
        self._log: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def note(self, request: dict[str, Any]) -> None:
        with self._lock:
            self._log.append(dict(request))

    def drain(self) -> list[dict[str, Any]]:
        with self._lock:
            log, self._log = self._log, []
        return log


class _Service:
    """One contract's calls on one implementation (``docs/drivers.md``, sections 5 to 7)."""

    def __init__(self, contract: str, target: Any) -> None:
        self.contract = contract
        self.target = target
        self.objects = _Objects()
        self.kinds: dict[int, str] = {}
        self.overhead_ns = 0
        if contract == "control":
            if not (hasattr(target, "server") or hasattr(target, "client")) and callable(target):
                try:
                    self.target = target()
                except Exception as exc:
                    raise _Refused("unsupported", f"{_target_name(target)} is no control "
                                                  f"implementation: calling it for one raised "
                                                  f"{type(exc).__name__}: {exc}") from None
            if all(getattr(self.target, side, None) is None for side in ("server", "client")):
                raise _Refused("unsupported", f"{_target_name(target)} has neither a 'server' "
                                              "nor a 'client' factory")
        elif contract not in ("p2p", "kv-events-publisher", "kv-events-subscriber"):
            raise _Refused("unsupported", f"the Python driver does not serve the contract "
                                          f"{contract!r} yet")

    # -- the hello ----------------------------------------------------------------

    def hello(self) -> dict[str, Any]:
        answer: dict[str, Any] = {"type": "hello", "protocol": VERSION,
                                  "contract": self.contract,
                                  "implementation": f"Python driver: {_target_name(self.target)}"}
        if self.contract == "control":
            sides = [s for s in ("server", "client") if getattr(self.target, s, None) is not None]
            answer["sides"] = sides
            server = getattr(self.target, "server", None)
            answer["capabilities"] = _declared(server) if server is not None else {}
            return answer
        candidates = {"p2p": _P2P_OPTIONS, "kv-events-publisher": _PUBLISHER_OPTIONS,
                      "kv-events-subscriber": _SUBSCRIBER_OPTIONS}[self.contract]
        answer["capabilities"] = _declared(self.target)
        answer["options"] = [o for o in candidates if _accepts(self.target, o)]
        if self.contract == "p2p":
            if len(answer["options"]) < len(_P2P_OPTIONS):
                answer["options"] = []  # the suite passes heartbeats as all three or none
            answer["options"] += [o for o in _P2P_CURVE if _accepts(self.target, o)]
        return answer

    # -- calls ----------------------------------------------------------------------

    def call(self, handle: int, name: str, args: dict[str, Any]) -> Any:
        """Run one request; :attr:`overhead_ns` is then the driver's own share of it
        (converting arguments and results), which ``elapsed_ns`` leaves out."""
        self.overhead_ns = 0
        if handle == 0:
            return self._construct(name, args)
        obj = self.objects.get(handle)
        kind = self.kinds[handle]
        method = getattr(self, f"_{kind}_{name}", None)
        if method is None:
            raise _Refused("unsupported", f"a {kind} has no call {name!r}")
        return method(obj, **args)

    def _new(self, kind: str, obj: Any) -> int:
        handle = self.objects.handle(obj)
        self.kinds.setdefault(handle, kind)
        return handle

    def _construct(self, name: str, args: dict[str, Any]) -> Any:
        expected = {"p2p": ("transport",), "kv-events-publisher": ("publisher",),
                    "kv-events-subscriber": ("subscriber",),
                    "control": ("server", "client")}[self.contract]
        if name not in expected:
            raise _Refused("unsupported", f"no constructor {name!r} in contract "
                                          f"{self.contract!r}")
        if name == "transport":
            opts = {k: args.pop(k) for k in (*_P2P_OPTIONS, *_P2P_CURVE) if k in args}
            obj = self.target(args["local_id"], args["host"], args["port"], **opts)
            return {"handle": self._new("transport", obj)}
        if name in ("publisher", "subscriber"):
            endpoint, replay = args.pop("endpoint"), args.pop("replay_endpoint")
            obj = self.target(endpoint, replay, **args)
            result: dict[str, Any] = {"handle": self._new(name, obj)}
            if name == "publisher":
                result["endpoint"] = str(getattr(obj, "endpoint", endpoint))
                result["replay_endpoint"] = str(getattr(obj, "replay_endpoint", replay))
            return result
        side = getattr(self.target, name, None)
        if side is None:
            raise _Refused("unsupported", f"the implementation has no {name}")
        if name == "server":
            holder = _Server()
            handlers = {kind: python_handler(behaviour, holder.note)
                        for kind, behaviour in dict(args["handlers"]).items()}
            curve = {k: args[k] for k in ("curve_server_secret_key", "curve_allowed_client_keys")
                     if k in args}
            holder.server = side(args["endpoint"], handlers, **curve)
            return {"handle": self._new("server", holder)}
        register = args.pop("register", None)
        obj = side(args.pop("endpoint"), register=tuple(register) if register else None, **args)
        return {"handle": self._new("client", obj)}

    # p2p: transport

    def _transport_connect(self, obj: Any, peer_id: str) -> Any:
        conn = obj.connect(peer_id)
        return {"handle": self._new("connection", conn), "peer_id": conn.peer_id}

    def _transport_poll(self, obj: Any) -> Any:
        return [{"handle": self._new("connection", c), "peer_id": c.peer_id}
                for c in obj.poll()]

    def _transport_close(self, obj: Any) -> None:
        obj.close()

    # p2p: connection

    def _connection_peer_id(self, obj: Any) -> Any:
        return obj.peer_id

    def _connection_alive(self, obj: Any) -> Any:
        return bool(obj.alive)

    def _connection_send(self, obj: Any, msg: Any) -> None:
        obj.send(msg)

    def _connection_recv(self, obj: Any) -> Any:
        return list(obj.recv())

    def _connection_mark_dead(self, obj: Any) -> None:
        obj.mark_dead()

    def _connection_close(self, obj: Any) -> None:
        obj.close()

    # kv-events-publisher

    def _publisher_publish(self, obj: Any, batch: Any) -> None:
        from reference_impl.kv_events.schema import KVEventBatch

        started = time.perf_counter_ns()
        try:
            typed = msgspec.convert(batch, KVEventBatch)
        except msgspec.ValidationError as exc:
            raise _Refused("invalid", f"not a KVEventBatch: {exc}") from None
        finally:
            self.overhead_ns += time.perf_counter_ns() - started
        obj.publish(typed)

    # publish_many, publish_copies (docs/drivers.md, section 6): a burst runs here, back to
    # back; the kv_events family's driver module holds the logic.

    def _publisher_publish_many(self, obj: Any, batches: list[Any]) -> Any:
        from conformance.contracts.kv_events.driver import publish_many_in_driver

        outcomes, overhead_ns = publish_many_in_driver(obj, batches, _as_batch, _error)
        self.overhead_ns += overhead_ns
        return outcomes

    def _publisher_publish_copies(self, obj: Any, batch: Any, count: int) -> Any:
        from conformance.contracts.kv_events.driver import publish_copies_in_driver

        outcomes, overhead_ns = publish_copies_in_driver(obj, batch, count, _as_batch, _error)
        self.overhead_ns += overhead_ns
        return outcomes

    def _publisher_shutdown(self, obj: Any) -> None:
        obj.shutdown()

    def _publisher_stats(self, obj: Any) -> Any:
        return _stats(obj)

    # kv-events-subscriber

    def _subscriber_poll(self, obj: Any, timeout_ms: int) -> Any:
        got = obj.poll(timeout_ms)
        started = time.perf_counter_ns()
        try:
            return [[seq, msgspec.to_builtins(batch, builtin_types=_BYTES)] for seq, batch in got]
        finally:
            self.overhead_ns += time.perf_counter_ns() - started

    def _subscriber_close(self, obj: Any) -> None:
        obj.close()

    def _subscriber_stats(self, obj: Any) -> Any:
        return _stats(obj)

    # control

    def _server_serve(self, holder: _Server, timeout_ms: int) -> Any:
        serve = getattr(holder.server, "serve", None)
        if callable(serve):
            serve(timeout_ms)
        else:  # a server with its own I/O thread
            threading.Event().wait(timeout_ms / 1000)
        return {"log": holder.drain()}

    def _server_close(self, holder: _Server) -> None:
        holder.server.close()

    def _client_request(self, obj: Any, type: str, body: Mapping[str, Any]) -> Any:
        return obj.request(type, dict(body))

    def _client_tick(self, obj: Any) -> None:
        obj.tick()

    def _client_alive(self, obj: Any) -> Any:
        return bool(obj.alive)

    def _client_close(self, obj: Any) -> None:
        obj.close()


def _as_batch(batch: Any) -> Any:
    from reference_impl.kv_events.schema import KVEventBatch

    try:
        return msgspec.convert(batch, KVEventBatch)
    except msgspec.ValidationError as exc:
        raise _Refused("invalid", f"not a KVEventBatch: {exc}") from None


def _stats(obj: Any) -> Any:
    stats = getattr(obj, "stats", None)
    if not callable(stats):
        raise _Refused("unsupported", "the implementation has no stats()")
    got = stats()
    return {str(k): v for k, v in dict(got).items()} if isinstance(got, Mapping) else {}


def _target_name(target: Any) -> str:
    module = getattr(target, "__module__", None) or type(target).__module__
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}:{name}"


# -- the loop ---------------------------------------------------------------------------------


class _Pipe:
    """Frames in from stdin, frames out to the private copy of stdout."""

    def __init__(self) -> None:
        self._in = sys.stdin.buffer.fileno()
        self._out = os.dup(1)
        os.dup2(2, 1)  # print() of the implementation goes to the log, not the protocol
        sys.stdout = sys.stderr
        self._reader = FrameReader()
        self._bodies: list[bytes] = []

    def read(self) -> dict[str, Any] | None:
        """The next request, or ``None`` at the end of stdin."""
        while not self._bodies:
            data = os.read(self._in, self._reader.read_size())
            if not data:
                return None
            self._bodies.extend(self._reader.feed(data))
        return decode_body(self._bodies.pop(0))

    def write(self, body: Mapping[str, Any]) -> None:
        try:
            frame = encode_frame(body)
        except (TypeError, ValueError, OverflowError) as exc:
            frame = encode_frame({"id": body.get("id"), "error": {
                "kind": "error", "message": f"the result cannot be encoded: {exc}"}})
        view = memoryview(frame)
        while view:
            written = os.write(self._out, view)
            view = view[written:]


def _serve(pipe: _Pipe, target_path: str) -> None:
    first = pipe.read()
    if first is None:
        return
    contract = str(first.get("contract", ""))
    if first.get("type") != "hello":
        pipe.write({"type": "error", "kind": "invalid",
                    "message": "the first message must be the suite's hello"})
        return
    try:
        service = _Service(contract, _load(target_path))
    except _Refused as refused:
        pipe.write({"type": "error", "kind": refused.kind, "message": str(refused)})
        return
    pipe.write(service.hello())
    while True:
        request = pipe.read()
        if request is None:
            return
        request_id = request.get("id")
        elapsed = 0
        try:
            handle, name = request.get("handle"), request.get("call")
            if not isinstance(handle, int) or not isinstance(name, str):
                raise _Refused("invalid", f"a request needs an integer handle and a call name: "
                                          f"{request!r}")
            args = dict(request.get("args") or {})
            started = time.perf_counter_ns()
            try:
                result = service.call(handle, name, args)
            finally:
                elapsed = max(0, time.perf_counter_ns() - started - service.overhead_ns)
        except Exception as exc:
            pipe.write({"id": request_id, "error": _error(exc), "elapsed_ns": elapsed})
        else:
            pipe.write({"id": request_id, "result": result, "elapsed_ns": elapsed})


def main(argv: list[str] | None = None) -> int:
    """Serve the implementation ``argv[0]`` names until stdin ends."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m conformance.drivers.python MODULE:ATTR", file=sys.stderr)
        return 2
    pipe = _Pipe()
    try:
        _serve(pipe, args[0])
    except ProtocolError as exc:
        print(f"conformance.drivers.python: {exc}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(3)
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
