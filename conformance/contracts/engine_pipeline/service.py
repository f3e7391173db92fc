"""The Python driver's side of ``engine-pipeline``, and the payloads both sides convert.

``python -m conformance.drivers.python MODULE:ATTR`` serves an engine-pipeline
implementation through :class:`PipelineService` (the registry's
``python_service``): engines built here and then handed the process
(``serve``: the driver process *is* the engine's), clients behind handles,
utility calls as tickets (``docs/drivers.md``, section 8). Numpy arrays cross
the protocol as the MessagePack extension :data:`EXT_ARRAY` (``[dtype.str,
shape, raw C-order bytes]``), both ways: :func:`to_protocol` and
:func:`from_protocol`, which the suite's proxies
(:mod:`conformance.contracts.engine_pipeline.driver`) use too.

This module runs in every driver process: it imports only the protocol's
serving helpers and the reference's interface, never the suite's bridge.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, wait
from typing import Any, Final

import msgspec
import numpy as np

from conformance.drivers.serving import Refused, TwoSidedService
from reference_impl.engine_pipeline.errors import (
    AddressInUse,
    ClientClosed,
    DuplicateRequest,
    EngineDead,
    MessageTooLarge,
    UtilityFailed,
)

__all__ = ["EXT_ARRAY", "PipelineService", "from_protocol", "to_protocol"]

#: The MessagePack extension type of a numpy array on the driver protocol.
EXT_ARRAY: Final = 16
_PACK = msgspec.msgpack.Encoder()
_UNPACK = msgspec.msgpack.Decoder()
_BYTES: Final = (bytearray, memoryview)


def to_protocol(value: Any) -> Any:
    """``value`` as protocol values: arrays as :data:`EXT_ARRAY`, bytes-likes as bytes."""
    if isinstance(value, np.ndarray):
        body = _PACK.encode([value.dtype.str, list(value.shape), value.tobytes()])
        return msgspec.msgpack.Ext(EXT_ARRAY, body)
    if isinstance(value, _BYTES):
        return bytes(value)
    if isinstance(value, Mapping):
        return {k: to_protocol(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_protocol(v) for v in value]
    return value


def from_protocol(value: Any) -> Any:
    """``value`` from the protocol: :data:`EXT_ARRAY` extensions become numpy arrays."""
    if isinstance(value, msgspec.msgpack.Ext):
        if value.code != EXT_ARRAY:
            raise ValueError(f"unknown MessagePack extension {value.code} in a payload")
        dtype, shape, data = _UNPACK.decode(value.data)
        kind = np.dtype(dtype)
        if kind.hasobject:
            raise ValueError(f"an array of dtype {dtype!r} (objects) cannot cross the protocol")
        return np.frombuffer(data, dtype=kind).reshape(shape)
    if isinstance(value, dict):
        return {k: from_protocol(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_protocol(v) for v in value]
    return value


class PipelineService(TwoSidedService):
    """The Python driver's side of ``engine-pipeline``: engines serving in this process,
    clients behind handles, utility calls as tickets."""

    constructors = ("engine", "client")
    family = "engine-pipeline"
    error_kinds = (
        (EngineDead, "dead_engine"),
        (ClientClosed, "closed"),
        (MessageTooLarge, "too_large"),
        (DuplicateRequest, "duplicate"),
        (UtilityFailed, "rejected"),
        (TimeoutError, "timeout"),
        (AddressInUse, "address_in_use"),
    )

    def __init__(self, contract: str, target: Any) -> None:
        super().__init__(contract, target)
        self._tickets: dict[int, Future[Any]] = {}
        self._ticket_ids = itertools.count(1)

    def hello(self) -> dict[str, Any]:
        answer = super().hello()
        declared = getattr(self.target, "capabilities", None)
        answer["capabilities"] = dict(declared) if isinstance(declared, Mapping) else {}
        return answer

    # engine

    def _construct_engine(self, args: dict[str, Any]) -> Any:
        from conformance.contracts.engine_pipeline.engine_host import apply_log_level
        from reference_impl.engine_pipeline.model import FakeModel

        model = FakeModel.from_options(args.get("model"))
        options = from_protocol(args.get("options") or {})
        apply_log_level(options)
        engine = self._side("engine")(list(args["addresses"]), engine_index=args["engine_index"],
                                      model=model, **options)
        return {"handle": self.new("engine", engine)}

    def _engine_serve(self, engine: Any) -> None:
        from conformance.contracts.engine_pipeline.engine_host import serve, stop_on_sigterm

        stop_on_sigterm(engine)

        def run() -> None:
            threading.Thread(target=_exit_at_end_of_stdin, daemon=True,
                             name="driver-stdin").start()
            status = serve(engine)
            sys.stderr.flush()
            os._exit(status)

        self.after_reply = run

    # client

    def _construct_client(self, args: dict[str, Any]) -> Any:
        from conformance.contracts.engine_pipeline.engine_host import apply_log_level

        options = from_protocol(args.get("options") or {})
        apply_log_level(options)
        client = self._side("client")(
            from_protocol(args["addresses"]), client_index=args["client_index"],
            client_count=args["client_count"], engine_indices=list(args["engine_indices"]),
            **options)
        bound = getattr(client, "addresses", None)
        return {"handle": self.new("client", client),
                "addresses": {str(k): str(v) for k, v in dict(bound or {}).items()}}

    def _client_wait_ready(self, client: Any, timeout_ms: int | None = None) -> None:
        if timeout_ms is None:
            client.wait_ready()
        else:
            client.wait_ready(timeout_ms)

    def _client_add(self, client: Any, request_id: str, prompt: list[int], max_tokens: int,
                    payload: Any = None, engine: int | None = None) -> None:
        kwargs: dict[str, Any] = {}
        if payload is not None:
            started = time.perf_counter_ns()
            kwargs["payload"] = from_protocol(payload)
            self.overhead_ns += time.perf_counter_ns() - started
        if engine is not None:
            kwargs["engine"] = engine
        client.add(request_id, prompt, max_tokens, **kwargs)

    def _client_abort(self, client: Any, request_ids: list[str]) -> None:
        client.abort(request_ids)

    def _client_call(self, client: Any, method: str, args: list[Any],
                     timeout_ms: int | None = None, engine: int | None = None) -> Any:
        kwargs: dict[str, Any] = {}
        if timeout_ms is not None:
            kwargs["timeout_ms"] = timeout_ms
        if engine is not None:
            kwargs["engine"] = engine
        values = from_protocol(args)
        future: Future[Any] = Future()

        def run() -> None:
            try:
                future.set_result(client.call(method, *values, **kwargs))
            except BaseException as exc:
                future.set_exception(exc)

        ticket = next(self._ticket_ids)
        self._tickets[ticket] = future
        threading.Thread(target=run, daemon=True, name=f"call-{ticket}").start()
        return {"ticket": ticket}

    def _client_call_result(self, client: Any, ticket: int, wait_ms: int = 0) -> Any:
        future = self._tickets.get(ticket)
        if future is None:
            raise Refused("invalid", f"no pending utility call has ticket {ticket}")
        wait([future], timeout=wait_ms / 1000)
        if not future.done():
            return {"done": False}
        del self._tickets[ticket]
        return {"done": True, "result": to_protocol(future.result())}

    def _client_outputs(self, client: Any, timeout_ms: int = 0) -> Any:
        got = client.outputs(timeout_ms)
        started = time.perf_counter_ns()
        try:
            return [_output_map(out) for out in got]
        finally:
            self.overhead_ns += time.perf_counter_ns() - started

    def _client_alive(self, client: Any) -> Any:
        return bool(client.alive)

    def _client_close(self, client: Any) -> None:
        client.close()


def _output_map(out: Any) -> dict[str, Any]:
    reason = getattr(out, "finish_reason", None)
    return {"request_id": out.request_id, "token_ids": list(out.token_ids),
            "finish_reason": None if reason is None else int(reason),
            "engine_index": int(getattr(out, "engine_index", 0) or 0),
            "payload": to_protocol(getattr(out, "payload", None)),
            "detail": to_protocol(getattr(out, "detail", None))}


def _exit_at_end_of_stdin() -> None:
    """A serving engine's driver reads no more requests; the end of stdin still ends it."""
    while os.read(0, 1 << 16):
        pass
    os._exit(0)
