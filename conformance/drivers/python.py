"""The Python driver: serves any ``MODULE:ATTR`` implementation over the driver protocol.

Run as ``python -m conformance.drivers.python MODULE:ATTR`` (or the console
script ``zmq-conformance-python-driver MODULE:ATTR``), with ``MODULE:ATTR``
as ``--transport`` takes it, for any contract of the registry. The suite's
hello says which contract to serve.

It is the protocol's executable reference (``docs/drivers.md``): the
reference implementations served through it must get the verdicts they
get in-process. So it adds nothing of its own. This module is the loop
(frames in, replies out) and knows no contract: each family's
:class:`~conformance.drivers.serving.Service` (the registry's
``python_service``, in the family's ``driver.py``) turns each request into
one call of the Python object and each exception into one error kind.

stdout carries the protocol only: the driver keeps a private copy of
descriptor 1 and points descriptor 1 at stderr, so a ``print()`` in the
implementation lands in the log instead of breaking the framing. At the
end of stdin the process exits at once (``os._exit``): a finalizer of a
half-closed ZeroMQ context must not keep it alive.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from conformance.drivers.protocol import (
    VERSION,
    FrameReader,
    ProtocolError,
    decode_body,
    encode_frame,
)
from conformance.drivers.serving import Refused, Service, let_waiting_threads_run

__all__ = ["main"]


# -- loading -------------------------------------------------------------------------


def _load(path: str) -> Any:
    module_name, sep, attr_path = path.partition(":")
    if not sep or not module_name or not attr_path:
        raise Refused("invalid", f"expected MODULE:ATTR, got {path!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr_path.split("."):
            target = getattr(target, part)
    except Exception as exc:
        raise Refused("unsupported", f"cannot load {path!r}: {type(exc).__name__}: "
                                     f"{exc}") from None
    return target


def _service(contract_name: str, target: Any) -> Service:
    """The family's service for ``contract_name`` (the registry's ``python_service``)."""
    from conformance import contracts

    contract = contracts.CONTRACTS.get(contract_name)
    if contract is None or not contract.python_service:
        raise Refused("unsupported", f"the Python driver does not serve the contract "
                                     f"{contract_name!r}")
    service: Service = contracts.resolve(contract.python_service)(contract_name, target)
    return service


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
        service = _service(contract, _load(target_path))
    except Refused as refused:
        pipe.write({"type": "error", "kind": refused.kind, "message": str(refused)})
        return
    pipe.write({**service.hello(), "protocol": VERSION})
    while True:
        request = pipe.read()
        if request is None:
            return
        request_id = request.get("id")
        elapsed = 0
        try:
            handle, name = request.get("handle"), request.get("call")
            if not isinstance(handle, int) or not isinstance(name, str):
                raise Refused("invalid", f"a request needs an integer handle and a call name: "
                                          f"{request!r}")
            args = dict(request.get("args") or {})
            let_waiting_threads_run()  # the decoding held the lock (see its doc)
            started = time.perf_counter_ns()
            try:
                result = service.call(handle, name, args)
            finally:
                elapsed = max(0, time.perf_counter_ns() - started - service.overhead_ns)
        except Exception as exc:
            pipe.write({"id": request_id, "error": service.error(exc), "elapsed_ns": elapsed})
        else:
            pipe.write({"id": request_id, "result": result, "elapsed_ns": elapsed})
        handover, service.after_reply = service.after_reply, None
        if handover is not None:
            sys.stderr.flush()
            handover()  # the implementation owns the process from here (never returns)


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
