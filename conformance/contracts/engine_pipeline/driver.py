"""The ``engine-pipeline`` contract through a driver: engine processes and client proxies.

:class:`PipelineDriver` is the implementation object the suite receives
(``engine`` and/or ``client`` as the driver's hello ``sides`` declares, and
its ``capabilities``). Calls follow ``docs/drivers.md``, section 8.

- **Engines.** The suite runs every engine under test in a process of its
  own (:mod:`.engine_host`). Through a driver, that process *is* the driver
  process: :meth:`EngineFactory.engine_process` builds the engine in a
  driver (``engine``), hands it the process (``serve``) and returns a
  :class:`DriverEngine`, which the harness uses exactly as an
  :class:`~conformance.contracts.engine_pipeline.harness.EngineProcess`:
  SIGKILL, SIGSTOP, SIGCONT and SIGTERM go to the driver's pid, and the
  clauses judge the driver's exit status.
- **Clients.** A :class:`DriverClient` is a client in a driver process.
  The suite calls a client from several threads at once (a pending utility
  call while another thread reads outputs or closes it), and the protocol
  has one request in flight per process, so the calls that wait are cut
  into short requests: ``outputs`` waits at most :data:`WAIT_SLICE_MS` per
  request, and a utility call is a ticket (``call``) whose result is
  fetched in slices (``call_result``).
- **Payloads.** Numpy arrays cross the protocol as an extension, both ways
  (:func:`~conformance.contracts.engine_pipeline.service.to_protocol` and
  ``from_protocol``).

The Python driver's side of the contract is
:mod:`conformance.contracts.engine_pipeline.service`.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Final

from conformance.contracts.engine_pipeline.faults import ProcessFaults
from conformance.contracts.engine_pipeline.service import from_protocol, to_protocol
from conformance.drivers import process as processes
from conformance.drivers.process import DriverProcess, DriverReplyError
from conformance.drivers.protocol import Hello
from conformance.drivers.remote import ErrorTable, Remote, build, to_exception
from conformance.errors import CallBlocked, ConfigError
from conformance.supervision import watchdog
from reference_impl.engine_pipeline.client import RequestOutput
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
from reference_impl.engine_pipeline.wire import FinishReason

__all__ = [
    "WAIT_SLICE_MS",
    "ClientFactory",
    "DriverClient",
    "DriverEngine",
    "EngineFactory",
    "PipelineDriver",
]

CONTRACT: Final = "engine-pipeline"
#: The longest a client request waits in the driver (``outputs``, ``call_result``).
WAIT_SLICE_MS: Final = 50
#: How long a client's ``wait_ready()`` may take when neither the call nor the factory
#: named a ready timeout (the suite always names one).
_READY_FALLBACK_MS: Final = 60_000
#: Extra time for an ``add()`` that carries a payload (up to the 64 MiB default limit
#: crosses two pipes and is encoded twice).
_PAYLOAD_ALLOWANCE_S: Final = 10.0

ERRORS: ErrorTable = {
    "dead_engine": lambda message, error: EngineDead(message),
    "closed": lambda message, error: ClientClosed(message),
    "timeout": lambda message, error: UtilityTimeout(message),
    "too_large": lambda message, error: MessageTooLarge(message),
    "duplicate": lambda message, error: DuplicateRequest(message),
    "rejected": lambda message, error: UtilityFailed(message),
    "address_in_use": lambda message, error: AddressInUse(message),
}


def _output(entry: Any) -> Any:
    """One output map as the :class:`RequestOutput` a Python client returns (anything else
    is returned as the driver sent it, for the suite to judge)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("request_id"), str):
        return entry
    reason = entry.get("finish_reason")
    try:
        finish = None if reason is None else FinishReason(reason)
    except ValueError:
        return entry
    return RequestOutput(entry["request_id"], list(entry.get("token_ids") or []), finish,
                         payload=from_protocol(entry.get("payload")),
                         detail=from_protocol(entry.get("detail")),
                         engine_index=int(entry.get("engine_index") or 0))


# -- the suite's side: the implementation object ---------------------------------------


class PipelineDriver:
    """The implementation object: ``engine`` and ``client`` as the hello's ``sides`` say."""

    def __init__(self, command: str, hello: Hello) -> None:
        sides = set(hello.sides)
        if not sides:
            raise ConfigError(f"driver {command!r} declares no 'sides' in its hello; the "
                              "engine-pipeline contract needs 'engine' and/or 'client' "
                              "(docs/drivers.md, section 3)")
        unknown = sides - {"engine", "client"}
        if unknown:
            raise ConfigError(f"driver {command!r}: unknown side {sorted(unknown)[0]!r} in its "
                              "hello; the engine-pipeline contract has 'engine' and 'client'")
        self.driver_command = command
        self.engine = EngineFactory(command) if "engine" in sides else None
        self.client = ClientFactory(command) if "client" in sides else None
        self.capabilities = dict(hello.capabilities)

    def __call__(self) -> PipelineDriver:
        return self

    def __repr__(self) -> str:
        return f"<engine-pipeline driver {self.driver_command!r}>"


def _plain(value: Any) -> Any:
    """Mappings and sequences of the suite's arguments as dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


class EngineFactory:
    """The engine side: each engine is a driver process of its own (:class:`DriverEngine`)."""

    resources_counted: Final = True

    def __init__(self, command: str) -> None:
        self.driver_command = command

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise ConfigError("an engine through a driver runs in its driver process; the suite "
                          "starts it with engine_process(), never in the test process")

    def engine_process(self, addresses: Sequence[str], *, engine_index: int,
                       model: Mapping[str, Any] | None,
                       options: Mapping[str, Any]) -> DriverEngine:
        """An engine built in a driver process and serving there (``engine``, ``serve``)."""
        return DriverEngine(self.driver_command, addresses, engine_index=engine_index,
                            model=model, options=options)

    def __repr__(self) -> str:
        return f"<engine-pipeline engine driver {self.driver_command!r}>"


class ClientFactory:
    """``client(addresses, *, client_index, client_count, engine_indices, **options)``: one
    client in one driver process. Every option is passed through as it is."""

    resources_counted: Final = True
    #: The client logs in its driver process, not the test's: the suite passes the host
    #: option ``log_level`` (section 8) where it reads the client's logs (PIPE-13).
    accepts_log_level: Final = True

    def __init__(self, command: str) -> None:
        self.driver_command = command

    def __call__(self, addresses: Any = "tcp", *, client_index: int = 0, client_count: int = 1,
                 engine_indices: Sequence[int] = (0,), **options: Any) -> DriverClient:
        args = {"addresses": _plain(addresses), "client_index": client_index,
                "client_count": client_count, "engine_indices": list(engine_indices),
                "options": to_protocol(_plain(options))}
        process, result = build(self.driver_command, CONTRACT, "client", args, ERRORS,
                                what=f"client factory(client_index={client_index})")
        bound = result.get("addresses")
        return DriverClient(process, int(result["handle"]),
                            f"client {client_index} ({process.label})",
                            dict(bound) if isinstance(bound, dict) else {},
                            options.get("ready_timeout_ms"))

    def client_process(self, addresses: Any, *, options: Mapping[str, Any]) -> DriverClientHost:
        """A client under test whose death the suite causes: the driver process is its host."""
        return DriverClientHost(self(addresses, **options))

    def __repr__(self) -> str:
        return f"<engine-pipeline client driver {self.driver_command!r}>"


class DriverClient(Remote):
    """A client in a driver process (see the module docstring for the sliced waits)."""

    errors: ClassVar[ErrorTable] = ERRORS

    def __init__(self, process: DriverProcess, handle: int, name: str,
                 addresses: dict[str, Any], ready_timeout_ms: Any) -> None:
        super().__init__(process, handle, name)
        #: The endpoints the client bound, by role (``handshake``, ``input``, ``output``).
        self.addresses = {str(k): str(v) for k, v in addresses.items()}
        self._ready_timeout_ms = ready_timeout_ms if isinstance(ready_timeout_ms, int) \
            else _READY_FALLBACK_MS
        self._guard = threading.RLock()
        self._closed = False

    @property
    def handshake_address(self) -> str:
        return self.addresses.get("handshake", "")

    def _call(self, call: str, args: Mapping[str, Any] | None = None, *,
              limit: float | None = None) -> Any:
        with self._guard:
            if self._closed:  # its process may serve another object by now
                raise ClientClosed(f"{call}() on a closed client ({self._name})")
            return super()._call(call, args, limit=limit)

    def wait_ready(self, timeout_ms: int | None = None) -> None:
        limit_ms = self._ready_timeout_ms if timeout_ms is None else timeout_ms
        try:
            self._call("wait_ready", {"timeout_ms": timeout_ms},
                       limit=limit_ms / 1000 + watchdog.default_limit())
        except UtilityTimeout as exc:
            raise ReadyTimeout(str(exc)) from None

    def add(self, request_id: str, prompt: Sequence[int], max_tokens: int,
            payload: Any = None, engine: int | None = None) -> None:
        args: dict[str, Any] = {"request_id": request_id, "prompt": list(prompt),
                                "max_tokens": max_tokens}
        limit = None
        if payload is not None:
            args["payload"] = to_protocol(payload)
            limit = watchdog.default_limit() + _PAYLOAD_ALLOWANCE_S
        if engine is not None:
            args["engine"] = engine
        self._call("add", args, limit=limit)

    def abort(self, request_ids: Sequence[str]) -> None:
        self._call("abort", {"request_ids": list(request_ids)})

    def call(self, method: str, *args: Any, timeout_ms: int = 5000,
             engine: int | None = None) -> Any:
        start: dict[str, Any] = {"method": method, "args": to_protocol(list(args)),
                                 "timeout_ms": timeout_ms}
        if engine is not None:
            start["engine"] = engine
        got = self._call("call", start)
        ticket = got.get("ticket") if isinstance(got, dict) else None
        if not isinstance(ticket, int):
            raise processes.DriverCrashed(f"call() on {self._name}: {self._process.label} "
                                          f"answered {got!r:.200}, not a map with an integer "
                                          "'ticket'")
        allowed = timeout_ms / 1000 + watchdog.default_limit()
        deadline = time.monotonic() + allowed
        while True:
            result = self._call("call_result", {"ticket": ticket, "wait_ms": WAIT_SLICE_MS})
            if isinstance(result, dict) and result.get("done"):
                return from_protocol(result.get("result"))
            if time.monotonic() >= deadline:
                raise CallBlocked(f"call({method!r}) on {self._name}", allowed)

    def outputs(self, timeout_ms: int = 0) -> Any:
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            left_ms = max(0, int((deadline - time.monotonic()) * 1000))
            got = self._call("outputs", {"timeout_ms": min(left_ms, WAIT_SLICE_MS)})
            if not isinstance(got, list):
                return got  # judged as a Python client's odd result would be
            if got or left_ms <= WAIT_SLICE_MS:
                return [_output(entry) for entry in got]

    @property
    def alive(self) -> Any:
        if self._closed:
            return False
        return self._call("alive")

    def close(self) -> None:
        with self._guard:
            if self._closed:
                return
            try:
                self._closing("close")
            finally:
                self._closed = True


# -- the suite's side: driver processes as engine processes ------------------------------


class _DriverHost(ProcessFaults):
    """A driver process the suite faults and judges as a process (the harness's
    ``EngineProcess`` interface): signals go to the driver's pid."""

    def __init__(self, process: DriverProcess, name: str) -> None:
        from chaos.process_faults import ProcessFault

        self._process = process
        self.name = name
        self.started_at = time.monotonic()
        self.faults: list[ProcessFault] = []

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process.state() != "dead"

    def exit_status(self, timeout_s: float) -> int | None:
        return self._process.exit_status(timeout_s)

    def wait_line(self, text: str, timeout_s: float) -> bool:
        raise NotImplementedError

    def _signal(self, sig: signal.Signals) -> None:
        self._process.signal(sig)

    def _stopped(self) -> bool:
        return self._process.state() != "running"

    def stderr_tail(self, chars: int = 1500) -> str:
        """The last ``chars`` characters of the driver's stderr (its whole log if less)."""
        try:
            with open(self._process.log_path, "rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - chars * 4))
                return log.read().decode("utf-8", "replace")[-chars:]
        except OSError:
            return ""

    def describe(self) -> str:
        code = self._process.exit_status(0)
        status = "running" if code is None else f"exit status {code}"
        tail = self.stderr_tail(600).strip()
        return (f"{self.name} ({self._process.label}, {status})"
                + (f"; stderr: {tail}" if tail else ""))

    def end(self) -> None:
        """Make sure the process is gone (resumed first, so SIGKILL lands)."""
        if self.running:
            self._process.signal(signal.SIGCONT)
            self._process.signal(signal.SIGKILL)
            self._process.exit_status(10)
        processes.discard(self._process)


class DriverEngine(_DriverHost):
    """An engine serving in a driver process (built and handed the process on creation)."""

    def __init__(self, command: str, addresses: Sequence[str], *, engine_index: int,
                 model: Mapping[str, Any] | None, options: Mapping[str, Any]) -> None:
        process = processes.acquire(command, CONTRACT)
        what = f"engine factory(engine_index={engine_index})"
        try:
            result = process.call(0, "engine", {
                "addresses": list(addresses), "engine_index": engine_index,
                "model": dict(model or {}), "options": to_protocol(_plain(options))}, what=what)
            if not isinstance(result, dict) or not isinstance(result.get("handle"), int):
                raise processes.DriverCrashed(f"{what}: {process.label} broke the protocol: "
                                              f"the constructor answered {result!r:.200}")
            process.call(int(result["handle"]), "serve", {},
                         what=f"serve() on engine {engine_index}")
        except DriverReplyError as error:
            processes.discard(process)
            raise to_exception(error, ERRORS) from None
        except BaseException:
            processes.discard(process)
            raise
        super().__init__(process, f"engine{engine_index}")

    def wait_line(self, text: str, timeout_s: float) -> bool:
        """``SERVING``: true at once (``serve`` answered before this object existed)."""
        return text == "SERVING"


class DriverClientHost(_DriverHost):
    """A client under test whose driver process the suite may kill: it waits for its
    engines in the background, and ``wait_line("READY")`` is that wait's success."""

    def __init__(self, client: DriverClient) -> None:
        super().__init__(client._process, "client0")
        self.client = client
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        threading.Thread(target=self._wait_ready, daemon=True, name="driver-client-ready").start()

    def _wait_ready(self) -> None:
        try:
            self.client.wait_ready()
        except BaseException as exc:
            self._failed = exc
        self._ready.set()

    def wait_line(self, text: str, timeout_s: float) -> bool:
        return text == "READY" and self._ready.wait(timeout_s) and self._failed is None

    def describe(self) -> str:
        failed = f"; wait_ready() raised {self._failed!r:.300}" if self._failed else ""
        return super().describe() + failed
