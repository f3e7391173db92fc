"""The ``p2p`` contract through a driver: a factory, transports and connections as proxies.

:class:`TransportFactory` is what the p2p suite receives instead of a
Python factory. Each call starts (or reuses) one driver process and builds
one transport in it, so every node is a process of its own. Like
:class:`~conformance.contracts.p2p.process_nodes.ProcessTransport`, a
:class:`DriverTransport` therefore offers the process faults (``pid``,
``state()``, ``pause()``, ``resume()``, ``kill()``), and the PROC clauses act
on the driver itself. Calls and their results follow ``docs/drivers.md``,
section 5; the Python driver's side is :mod:`conformance.contracts.p2p.service`.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Mapping
from typing import Any, ClassVar, Final

from conformance.contracts.p2p.service import CURVE_OPTIONS, OPTIONS
from conformance.drivers import process as processes
from conformance.drivers.process import DriverCrashed, DriverReplyError
from conformance.drivers.protocol import Hello
from conformance.drivers.remote import ErrorTable, Remote, build, signature, to_exception
from conformance.supervision import watchdog
from reference_impl.p2p.interface import (
    ConnectionDeadError,
    DuplicateConnectionError,
    MessageTooLargeError,
    SendQueueFullError,
)

__all__ = ["DriverConnection", "DriverTransport", "TransportFactory"]

CONTRACT: Final = "p2p"
#: How long an ``alive`` read by ``poll_drain`` answers for the connection (seconds),
#: while nothing else is asked of its process.
ALIVE_FRESH_S: Final = 0.05

ERRORS: ErrorTable = {
    "duplicate": lambda message, error: DuplicateConnectionError(message),
    "dead": lambda message, error: ConnectionDeadError(message),
    "closed": lambda message, error: ConnectionDeadError(message),
    "too_large": lambda message, error: MessageTooLargeError(message),
    "queue_full": lambda message, error: SendQueueFullError(message),
}


class TransportFactory:
    """``factory(local_id, host, port, **heartbeats)``: one transport in one driver process."""

    #: Every node is a process of its own (the PROC clauses may pause and kill it) ...
    builds_process_nodes: Final = True
    #: ... and :mod:`conformance.resources` counts the drivers' descriptors (RES, CONN-5).
    resources_counted: Final = True

    def __init__(self, command: str, hello: Hello) -> None:
        self.driver_command = command
        self.hello = hello
        self.zmq_conformance_capabilities = dict(hello.capabilities)
        self.options = tuple(o for o in hello.options if o in OPTIONS)
        if not set(CURVE_OPTIONS) <= set(self.options):
            # Authentication is checked only where the keys can reach the implementation.
            self.zmq_conformance_capabilities["authentication"] = False
        self.__signature__ = signature(("local_id", "host", "port"), self.options)

    def __call__(self, local_id: str, host: str, port: int, **kwargs: Any) -> DriverTransport:
        args: dict[str, Any] = {"local_id": local_id, "host": host, "port": port}
        args.update({k: v for k, v in kwargs.items() if k in self.options})
        process, result = build(self.driver_command, CONTRACT, "transport", args, ERRORS,
                                what=f"transport factory({local_id!r})")
        return DriverTransport(process, int(result["handle"]), local_id, host, port)

    def __repr__(self) -> str:
        return f"<p2p driver {self.driver_command!r}>"


class DriverConnection(Remote):
    """A connection of a driver's transport; ``peer_id`` is read once, the rest are calls.

    After a ``poll_drain`` (see :meth:`DriverTransport.poll`) it holds what the
    driver read for it right after that poll: the messages ``recv()`` returned
    there, and ``alive``. Those messages are the suite's from then on, and the
    next ``recv()`` returns them first. While nothing else has been asked of the
    process since, ``recv()`` returns them alone and ``alive`` the value read
    then, without a round trip: what the same calls made at that moment would
    have returned, which is when an in-process caller polling in a loop makes them.
    ``alive`` read so stays good for :data:`ALIVE_FRESH_S` at most: a loop that
    waits for it to change without polling still sees an implementation whose
    own threads change it, as it would in-process.
    """

    errors: ClassVar[ErrorTable] = ERRORS

    def __init__(self, transport: DriverTransport, handle: int, peer_id: Any) -> None:
        super().__init__(transport._process, handle,
                         f"connection {handle} to {peer_id} of {transport._name}")
        self._transport = transport
        self._peer_id = peer_id
        self.closed = False
        #: Messages read for this connection by a ``poll_drain``, not yet returned.
        self._pending: list[Any] = []
        #: ``process.calls`` when they were read (``None``: the next recv() asks).
        self._drained_at: int | None = None
        #: ``(process.calls, time.monotonic(), alive)`` as the last ``poll_drain`` read it.
        self._alive_read: tuple[int, float, Any] | None = None

    @property
    def peer_id(self) -> Any:
        return self._peer_id

    @property
    def alive(self) -> Any:
        if not self._alive_current():
            self._transport._read_alive()
        read = self._alive_read
        if read is not None and self._alive_current():
            return read[2]
        return self._call("alive")

    def _alive_current(self) -> bool:
        read = self._alive_read
        return (read is not None and read[0] == self._process.calls
                and time.monotonic() - read[1] < ALIVE_FRESH_S)

    def send(self, msg: Any) -> None:
        self._call("send", {"msg": msg})

    #: The driver answered ``send_many`` with ``unsupported``: send one by one.
    _one_by_one = False

    def zmq_conformance_send_many(self, msgs: list[Any], *, limit: float,
                                  keep_going: bool = False
                                  ) -> list[tuple[Exception | None, float]] | None:
        """``send()`` of each message in turn, back to back in the driver process
        (``send_many``, docs/drivers.md, section 5), stopping after the first that
        raised unless ``keep_going``: per send attempted, what it raised (``None``: it
        returned) and the implementation's time in it as the driver measured it.
        ``limit`` is what one send may take; the request may take that plus the
        crossing of the messages.

        ``None``, with nothing sent, when the driver does not offer the call: the
        caller then sends one at a time.
        """
        if not msgs or self._one_by_one:
            return None
        try:
            got = self._call("send_many", {"msgs": msgs, "keep_going": keep_going},
                             limit=limit + watchdog.default_limit() + 0.01 * len(msgs))
        except NotImplementedError:
            self._one_by_one = True
            return None
        shape = (f"send_many() on {self._name}: the driver answered {str(got)[:80]!r}, not "
                 f"a map of 'outcomes' and 'elapsed_ns', one per send attempted, at most "
                 f"{len(msgs)}" + ("" if keep_going else ", only the last an error"))
        if not isinstance(got, Mapping):
            raise DriverCrashed(shape)
        outcomes, elapsed = got.get("outcomes"), got.get("elapsed_ns")
        if (not isinstance(outcomes, list) or not isinstance(elapsed, list)
                or len(outcomes) != len(elapsed) or not 0 < len(outcomes) <= len(msgs)
                or not all(o is None or isinstance(o, Mapping) for o in outcomes)
                or (keep_going and len(outcomes) != len(msgs))
                or (not keep_going and (any(o is not None for o in outcomes[:-1])
                                        or (outcomes[-1] is None
                                            and len(outcomes) != len(msgs))))
                or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                           for n in elapsed)):
            raise DriverCrashed(shape)
        result: list[tuple[Exception | None, float]] = []
        for outcome, nanoseconds in zip(outcomes, elapsed, strict=True):
            error = None
            if outcome is not None:
                kind = str(outcome.get("kind", "error"))
                error = to_exception(
                    DriverReplyError(kind, str(outcome.get("message", "")), outcome),
                    self.errors)
            result.append((error, nanoseconds / 1e9))
        return result

    def recv(self) -> Any:
        pending, self._pending = self._pending, []
        if self._drained_at is not None and self._drained_at == self._process.calls:
            self._drained_at = None
            return pending
        self._drained_at = None
        try:
            got = self._call("recv")
        except BaseException:
            self._pending = pending + self._pending  # still the suite's, for the next recv()
            raise
        if not pending:
            return got
        return pending + got if isinstance(got, list) else got

    def mark_dead(self) -> None:
        self._call("mark_dead")

    def close(self) -> None:
        self.closed = True
        self._call("close")

    def _drained(self, messages: list[Any], alive: Any, at: int) -> None:
        self._pending.extend(messages)
        self._drained_at = at
        self._alive_read = (at, time.monotonic(), alive)

    def _alive_was(self, alive: Any, at: int) -> None:
        self._alive_read = (at, time.monotonic(), alive)


class DriverTransport(Remote):
    """A transport in a driver process: the p2p interface plus the process faults."""

    errors: ClassVar[ErrorTable] = ERRORS

    def __init__(self, process: processes.DriverProcess, handle: int, local_id: str,
                 host: str, port: int) -> None:
        super().__init__(process, handle, f"node {local_id} ({process.label})")
        self.local_id = local_id
        self.host = host
        self.port = port
        self._conns: dict[int, DriverConnection] = {}
        self._closed = False

    def connect(self, peer_id: str) -> DriverConnection:
        return self._proxy(self._call("connect", {"peer_id": peer_id}))

    #: The driver answered ``poll_drain`` with ``unsupported``: plain ``poll`` from then on.
    _plain_poll = False

    def poll(self) -> Any:
        """``poll()``: as ``poll_drain`` where the driver has it (one round trip for the
        poll and every connection's ``recv()`` and ``alive``, docs/drivers.md, section 5),
        else as ``poll``."""
        if not self._plain_poll:
            open_handles = [h for h, c in self._conns.items() if not c.closed]
            try:
                result = self._call("poll_drain", {"connections": open_handles})
            except NotImplementedError:
                self._plain_poll = True
            else:
                return self._take_drain(result)
        result = self._call("poll")
        if not isinstance(result, list):
            return result  # the harness reports what poll() returned instead of a sequence
        return [self._proxy(entry) for entry in result]

    #: The driver answered ``alive_all`` with ``unsupported``: one ``alive`` per connection.
    _alive_one_by_one = False

    def _read_alive(self) -> None:
        """``alive`` of every open connection of this transport in one round trip
        (``alive_all``, docs/drivers.md, section 5), for the reads that follow. A
        connection whose ``alive`` raised is asked again by itself, to see the error."""
        if self._alive_one_by_one:
            return
        conns = [(h, c) for h, c in self._conns.items() if not c.closed]
        try:
            got = self._call("alive_all", {"connections": [h for h, _ in conns]})
        except NotImplementedError:
            self._alive_one_by_one = True
            return
        if not isinstance(got, list) or len(got) != len(conns):
            raise processes.DriverCrashed(
                f"alive_all() on {self._name}: {self._process.label} answered {got!r:.120}, "
                f"not an array of {len(conns)} booleans (or nil) in the order asked")
        at = self._process.calls
        for (_, conn), alive in zip(conns, got, strict=True):
            if alive is not None:
                conn._alive_was(alive, at)

    def _take_drain(self, result: Any) -> Any:
        if not isinstance(result, Mapping) or not isinstance(result.get("new"), list):
            return result  # reported as poll()'s odd result
        new = [self._proxy(entry) for entry in result["new"]]
        at = self._process.calls
        for entry in result.get("drained") or ():
            handle = entry.get("handle") if isinstance(entry, Mapping) else None
            conn = self._conns.get(handle) if isinstance(handle, int) else None
            if conn is not None and isinstance(entry.get("messages"), list) \
                    and "alive" in entry:
                conn._drained(entry["messages"], entry["alive"], at)
        return new

    def close(self) -> None:
        """Close the transport; its process goes back to the pool (idempotent here, as
        :class:`~conformance.contracts.p2p.process_nodes.ProcessTransport` is)."""
        if self._closed:
            return
        self._closing("close")
        self._closed = True

    # -- faults --------------------------------------------------------------------

    def pause(self) -> float:
        """SIGSTOP the driver; returns ``time.monotonic()`` once it is stopped."""
        self._process.signal(signal.SIGSTOP)
        self._await_state("stopped")
        return time.monotonic()

    def resume(self) -> float:
        """SIGCONT the driver; returns ``time.monotonic()`` once it runs again."""
        self._process.signal(signal.SIGCONT)
        self._await_state("running")
        return time.monotonic()

    def kill(self) -> float:
        """SIGKILL the driver; returns ``time.monotonic()`` once it is gone."""
        self._process.signal(signal.SIGKILL)
        self._await_state("dead")
        return time.monotonic()

    def _await_state(self, wanted: str, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while self._process.state() != wanted:
            if time.monotonic() >= deadline:
                raise AssertionError(f"{self._process.label}: still {self._process.state()} "
                                     f"{timeout} s after asking for {wanted}")
            time.sleep(0.0005)

    # -- internals -----------------------------------------------------------------

    def _proxy(self, entry: Any) -> DriverConnection:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("handle"), int):
            raise processes.DriverCrashed(
                f"{self._name}: {self._process.label} broke the protocol: a connection must "
                f"be a map with an integer 'handle' and a 'peer_id', not {entry!r}")
        handle = int(entry["handle"])
        found = self._conns.get(handle)
        if found is None:
            found = self._conns[handle] = DriverConnection(self, handle, entry.get("peer_id"))
        return found
