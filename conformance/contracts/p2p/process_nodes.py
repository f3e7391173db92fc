"""Process nodes: each transport in its own OS process, driven through execnet.

The chaos proxies cut links; they cannot stop a node while its kernel keeps
TCP alive (SIGSTOP: a hung engine, a GC pause, a debugger) or kill it at once
(SIGKILL). For that a node must be a process. :func:`process_spec` turns any
:class:`~conformance.contracts.p2p.spec.TransportSpec` whose factory is importable as
``MODULE:ATTR`` into one whose nodes each run in their own interpreter,
built there from the same factory, and driven from the test process by
:class:`ProcessTransport` and :class:`ProcessConnection`: proxies that
implement the duck-typed interface of ``DESIGN.md`` by forwarding each call
over an execnet channel. The harness's :class:`~conformance.contracts.p2p.harness.Cluster`
builds them without knowing.

Guarantees:

- **Errors come back as themselves.** An exception raised in the node is
  raised again in the test process as the same class when it can be
  imported and rebuilt (``ConnectionDeadError``, ``TypeError``,
  ``zmq.ZMQError`` with its errno, ...), else as :class:`RemoteError`; the
  remote traceback is attached as a note.
- **Nothing hangs.** Every call waits at most the watchdog limit plus a
  margin; a node process that died raises :class:`NodeProcessDied` naming the
  node and its exit signal, one that is stopped raises :class:`NodePaused`.
  Both subclass :class:`~conformance.errors.CallBlocked`: the call never
  completed, and :func:`~conformance.contracts.p2p.harness.expect_error` never takes them
  for the error it expects.
- **Nothing outlives the run.** A node process asks the kernel for SIGKILL
  when its parent dies (``PR_SET_PDEATHSIG``); :func:`shutdown` (called at
  the end of the pytest session and at exit) ends every process still open.

Faults (:mod:`conformance.contracts.p2p.process_faults` builds the PROC clauses on these):
:meth:`ProcessTransport.pause`, :meth:`~ProcessTransport.resume` and
:meth:`~ProcessTransport.kill` signal the node's process. After a kill,
:meth:`~conformance.contracts.p2p.harness.Cluster.restart` builds the replacement process
on the same port.

Gateways: ``popen`` (a local interpreter; the default uses this
interpreter) or any execnet spec, e.g. ``ssh=host//python=python3``; for a
non-local gateway the signals are sent through a second gateway to the same
host. Idle processes are reused: a node whose transport closed cleanly goes
back to a pool instead of exiting, which keeps the suite's many short-lived
clusters from paying an interpreter start per node.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import importlib
import itertools
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from conformance.config.loading import load_factory
from conformance.contracts import NODE_MODES
from conformance.contracts.p2p import _node_forks, _node_worker
from conformance.contracts.p2p.spec import TransportSpec
from conformance.errors import CallBlocked, ConfigError, RunError
from conformance.supervision import cleanup, runqueue, watchdog

__all__ = [
    "NodePaused",
    "NodeProcessDied",
    "ProcessConnection",
    "ProcessNodeFactory",
    "ProcessTransport",
    "RemoteError",
    "is_process_spec",
    "live_pids",
    "process_spec",
    "shutdown",
]

#: Values of ``--nodes`` / ``--zmq-nodes``.
#: Extra wait on top of the watchdog limit before a call is given up locally:
#: the node's own watchdog reports a blocked call first, with its name.
_MARGIN_S = 2.0
#: How long starting a node process may take by default (interpreter, imports, the
#: factory's module): the suite's own work, bounded apart from the call watchdog.
DEFAULT_STARTUP_S = 60.0
#: Environment variable overriding :data:`DEFAULT_STARTUP_S` (seconds).
ENV_STARTUP = "ZMQ_CONFORMANCE_NODE_STARTUP_S"
#: How long a helper gateway (signalling a remote node) may take to start.
_START_TIMEOUT_S = 30.0
#: Idle processes kept for reuse, per gateway spec.
_POOL_MAX = 8

class _Skipped:
    """The node did not run an announced call (an earlier one in its batch failed)."""

    def __repr__(self) -> str:
        return "SKIPPED"


#: What :meth:`_Worker.collect` returns for an announced call the node did not run.
SKIPPED = _Skipped()


class RemoteError(Exception):
    """An exception raised in a node process whose class cannot be rebuilt here."""


def startup_limit() -> float:
    """Seconds a node process may take to start and import the factory's module:
    ``$ZMQ_CONFORMANCE_NODE_STARTUP_S``, else :data:`DEFAULT_STARTUP_S`.

    Start-up is the suite's work, not a call into the implementation, so it is
    not held to the call watchdog (5 s): under heavy load (a load average
    above 20 on 2 cores) an interpreter and its imports alone can take longer.
    A node that does not start within this bound is a run error naming it
    (:class:`NodeNeverStarted`). The factory call itself still runs under the
    watchdog, in the node process: a factory that hangs is the implementation's.
    """
    text = os.environ.get(ENV_STARTUP, "").strip()
    if not text:
        return DEFAULT_STARTUP_S
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ConfigError(f"{ENV_STARTUP}={text!r}: expected a positive number of seconds")
    return value


class NodeNeverStarted(RunError):
    """A node process did not start (or import its factory) within the start-up bound:
    the suite's infrastructure, never a clause verdict."""

    def __init__(self, what: str, limit: float) -> None:
        super().__init__(
            f"{what} did not start within the process nodes' start-up bound of {limit:.0f} s "
            f"({ENV_STARTUP}; the machine is overloaded, or the interpreter cannot start)"
        )


class NodeProcessDied(CallBlocked):
    """The node's process exited (or was killed) while a call was outstanding or before it."""

    def __init__(self, message: str) -> None:
        AssertionError.__init__(self, message)
        self.call = message
        self.seconds = 0.0


class NodePaused(CallBlocked):
    """A call went to a node whose process is stopped (SIGSTOP) and got no answer."""

    def __init__(self, message: str, seconds: float) -> None:
        AssertionError.__init__(self, message)
        self.call = message
        self.seconds = seconds


# -- worker processes ----------------------------------------------------------


def _execnet() -> Any:
    """The execnet module, imported on first use (only process nodes need it)."""
    try:
        import execnet
    except ImportError:
        raise ConfigError(
            "--nodes process: execnet is not installed (pip install 'zmq-conformance[process]' "
            "or pytest-xdist, which brings it)"
        ) from None
    return execnet


class _Worker:
    """One node process: its gateway, its channel and the request sequence."""

    def __init__(self, gateway_spec: str) -> None:
        self.gateway_spec = gateway_spec
        self.gateway: Any = None
        self.channel: Any = None
        self._child: _node_forks.ForkedChild | None = None
        limit = startup_limit()
        what = f"the node process ({gateway_spec})"
        if _node_forks.usable_for(_execnet().XSpec(gateway_spec)):
            self.local = True
            # The fork server's own start (its imports, once per test process) is the
            # suite's, bounded apart; the node's start from it is held to ``limit``.
            server = _node_forks.fork_server()
            forked = server.fork(limit if server.ready else max(limit, DEFAULT_STARTUP_S),
                                 watchdog.progress)
            if forked is None:
                raise NodeNeverStarted(what, limit)
            self.channel, self._child = forked
            try:
                self.pid: int = pickle.loads(_receive_alive(self.channel, limit, what))
            except BaseException:
                self.channel.close()
                with contextlib.suppress(Exception):
                    self._child.kill()
                    self._child.wait(timeout=2.0)
                raise
        else:
            self.gateway = _execnet().makegateway(gateway_spec)
            self.local = self.gateway.spec.popen and not self.gateway.spec.via
            try:
                self.channel = self.gateway.remote_exec(_node_worker)
                self.channel.send(os.getpid() if self.local else 0)
                self.pid = _receive_alive(self.channel, limit, what)
            except BaseException:
                self.gateway.exit()
                raise
        self._seq = itertools.count(1)
        #: Sequence numbers of announced calls (:meth:`poll_drain`) not collected yet,
        #: and the replies among them that arrived while another reply was awaited.
        self._announced: set[int] = set()
        self._held: dict[int, tuple[Any, ...]] = {}
        self.label = f"pid {self.pid}"
        self.signalled: str | None = None
        self.broken = False

    # -- calls --------------------------------------------------------------

    def request(self, op: str, args: list[Any], *, timeout: float,
                startup: bool = False) -> Any:
        """Send one request and wait for its reply; stale replies are skipped.

        ``startup``: the request is the node's start-up (its ``build``): waiting
        counts as the suite's progress, and no reply within ``timeout`` is
        :class:`NodeNeverStarted`, not a blocked call.
        """
        seq = next(self._seq)
        self._send(seq, op, args)
        return self._await(seq, op, timeout, startup=startup)

    def poll_drain(self, handles: list[int], *, timeout: float) -> tuple[Any, dict[int, int]]:
        """``poll()`` and, when it returned no new connection, ``recv()`` on each of
        ``handles`` in the node right after (see :mod:`._node_worker`): the poll's value,
        and the sequence number under which each ``recv()``'s reply comes (empty when the
        node did not run them). Collect those with :meth:`collect`."""
        seq = next(self._seq)
        drains = {handle: next(self._seq) for handle in handles}
        self._send(seq, "poll_drain", [[[h, s] for h, s in drains.items()]])
        self._announced.update(drains.values())
        try:
            value, drained = self._await(seq, "poll", timeout)
        except BaseException:
            self._announced.difference_update(drains.values())
            raise
        if not drained:
            self._announced.difference_update(drains.values())
            return value, {}
        return value, drains

    def announce(self, calls: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Have the node run connection calls ``(op, handle)`` now, in order, without
        waiting (see :mod:`._node_worker`, ``batch``): the sequence number under which
        each one's reply comes, for :meth:`collect`."""
        seqs = {call: next(self._seq) for call in calls}
        self._send(next(self._seq), "batch", [[[op, h, s] for (op, h), s in seqs.items()]])
        self._announced.update(seqs.values())
        return seqs

    def abandon(self, seqs: list[int]) -> None:
        """Nobody will collect these announced calls' replies: skip them when they come."""
        self._announced.difference_update(seqs)
        for seq in seqs:
            self._held.pop(seq, None)

    def collect(self, seq: int, op: str, *, timeout: float) -> Any:
        """The reply to an announced call (:meth:`poll_drain`), or :data:`SKIPPED` when the
        node did not run it; waits for it as :meth:`request` does."""
        if seq in self._held:
            self._announced.discard(seq)
            return self._unpack(self._held.pop(seq))
        try:
            return self._await(seq, op, timeout)
        finally:
            self._announced.discard(seq)

    def forget_announced(self) -> None:
        """Drop what is kept for announced calls (the node's transport closed: every
        reply before that one has been read, and nobody asks for them any more)."""
        self._announced.clear()
        self._held.clear()

    def _send(self, seq: int, op: str, args: list[Any]) -> None:
        if self.signalled == "SIGKILL":
            raise NodeProcessDied(f"{self.label} was killed (SIGKILL) by the test; "
                                  f"{op}() cannot reach it")
        try:
            payload = pickle.dumps((seq, op, args))
        except Exception as exc:
            raise TypeError(f"{op}(): argument cannot be sent to the node process: "
                            f"{exc}") from None
        try:
            self.channel.send(payload)
        except (OSError, EOFError):
            raise self._died(op) from None
        except Exception as exc:  # a closed channel
            if "closed" in str(exc).lower():
                raise self._died(op) from None
            raise

    def _await(self, seq: int, op: str, timeout: float, *, startup: bool = False) -> Any:
        if self.signalled == "SIGKILL":
            raise NodeProcessDied(f"{self.label} was killed (SIGKILL) by the test; "
                                  f"{op}() cannot reach it")
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._no_answer(op, timeout, startup=startup)
            if startup:
                watchdog.progress()
                remaining = min(remaining, 1.0)
            try:
                reply = pickle.loads(self.channel.receive(remaining))
            except self.channel.TimeoutError:
                if startup:
                    continue
                raise self._no_answer(op, timeout) from None
            except (EOFError, OSError, self.channel.RemoteError):
                raise self._died(op) from None
            if reply[0] != seq:
                if reply[0] in self._announced:
                    self._held[reply[0]] = reply  # kept for its own call, never dropped
                continue  # else the answer to a call given up earlier
            return self._unpack(reply)

    def _unpack(self, reply: tuple[Any, ...]) -> Any:
        if reply[1] == "ok":
            return reply[2]
        if reply[1] == "skipped":
            return SKIPPED
        raise _rebuild(reply[2], self.label)

    def _no_answer(self, op: str, timeout: float, *, startup: bool = False) -> BaseException:
        self.broken = True
        if startup and self.state() in ("running", "unknown"):
            return NodeNeverStarted(f"{op}() of the node process ({self.label})",
                                    startup_limit())
        state = self.state()
        if state == "stopped":
            return NodePaused(f"{op}() on a paused node ({self.label}, stopped by "
                              f"{self.signalled or 'a signal'}) got no answer in "
                              f"{timeout:.1f} s", timeout)
        if state == "dead":
            return self._died(op)
        return CallBlocked(f"{op}() on the node process ({self.label})", timeout)

    def _died(self, op: str) -> NodeProcessDied:
        self.broken = True
        how = self.exit_description()
        return NodeProcessDied(f"{op}(): the node process ({self.label}) {how}")

    # -- process state ---------------------------------------------------------

    def state(self) -> str:
        """``running``, ``stopped``, ``dead`` or ``unknown`` (not a local process)."""
        if not self.local:
            return "unknown"
        popen = self._popen()
        if popen is not None and popen.poll() is not None:
            return "dead"
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return "dead" if popen is None else "running"
        return {"T": "stopped", "t": "stopped", "Z": "dead", "X": "dead"}.get(
            fields[0], "running")

    def exit_description(self) -> str:
        popen = self._popen()
        code = None
        if popen is not None:
            with contextlib.suppress(Exception):
                code = popen.wait(timeout=1.0)
        if code is None:
            return "stopped answering (its channel closed)"
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"died of signal {signal.Signals(-code).name}"
            return f"died of signal {-code}"
        return f"exited with status {code}"

    def _popen(self) -> Any:
        if self._child is not None:
            return self._child
        io = getattr(self.gateway, "_io", None)
        return getattr(io, "popen", None)

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the node process (locally, or through a helper gateway)."""
        self.signalled = sig.name
        if self.local:
            os.kill(self.pid, sig)
            return
        helper = _execnet().makegateway(self.gateway_spec)
        try:
            helper.remote_exec(
                f"import os; os.kill({self.pid}, {int(sig)}); channel.send(None)"
            ).receive(_START_TIMEOUT_S)
        finally:
            helper.exit()

    def end(self) -> None:
        """End the process whatever its state: exit politely, else kill."""
        if self.local and self.state() == "stopped":
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
        if not self.broken and self.signalled is None:
            with contextlib.suppress(Exception):
                self.request("exit", [], timeout=1.0)
        popen = self._popen()
        if popen is not None and popen.poll() is None and self.signalled is not None:
            with contextlib.suppress(OSError):
                popen.kill()
        with contextlib.suppress(Exception):
            if self.gateway is None:
                self.channel.close()
            else:
                self.gateway.exit()
        if popen is not None:
            try:
                popen.wait(timeout=2.0)
            except Exception:
                with contextlib.suppress(OSError):
                    popen.kill()
                with contextlib.suppress(Exception):
                    popen.wait(timeout=2.0)


def _receive_alive(channel: Any, limit: float, what: str) -> Any:
    """``channel.receive()`` within ``limit`` seconds, as the suite's progress (1 s slices,
    so the stall deadline does not count a slow start); :class:`NodeNeverStarted` after."""
    deadline = time.monotonic() + limit
    while True:
        watchdog.progress()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise NodeNeverStarted(what, limit)
        try:
            return channel.receive(min(remaining, 1.0))
        except channel.TimeoutError:
            continue


def _rebuild(info: dict[str, Any], where: str) -> BaseException:
    """The exception ``info`` describes, as its own class when that can be rebuilt."""
    module, name, message = info.get("module", ""), info.get("name", ""), info.get("message", "")
    exc: BaseException | None = None
    cls: Any = None
    with contextlib.suppress(Exception):
        cls = importlib.import_module(module)
        for part in name.split("."):
            cls = getattr(cls, part)
    if isinstance(cls, type) and issubclass(cls, Exception):
        with contextlib.suppress(Exception):
            if issubclass(cls, CallBlocked):
                exc = CallBlocked(f"{info.get('call', message)} ({where})",
                                  float(info.get("seconds", 0.0)))
            elif "errno" in info and (issubclass(cls, OSError) or name == "ZMQError"):
                exc = cls(info["errno"], message)
            else:
                exc = cls(message)
    if exc is None:
        exc = RemoteError(f"{module}.{name}: {message}")
    exc.add_note(f"raised in the node process ({where}):\n{info.get('traceback', '')}")
    return exc


class _Pool:
    """Idle node processes, by gateway spec; every process ever started, for shutdown."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[str, list[_Worker]] = {}
        self._all: list[_Worker] = []

    def acquire(self, gateway_spec: str) -> _Worker:
        with self._lock:
            idle = self._idle.get(gateway_spec, [])
            while idle:
                worker = idle.pop()
                if worker.state() in ("running", "unknown"):
                    return worker
                worker.end()
        worker = _Worker(gateway_spec)
        with self._lock:
            self._all.append(worker)
        return worker

    def release(self, worker: _Worker) -> None:
        """Keep a cleanly closed worker for reuse, or end it."""
        with self._lock:
            idle = self._idle.setdefault(worker.gateway_spec, [])
            if not worker.broken and worker.signalled is None and len(idle) < _POOL_MAX:
                idle.append(worker)
                return
        self.discard(worker)

    def discard(self, worker: _Worker) -> None:
        worker.end()
        with self._lock:
            if worker in self._all:
                self._all.remove(worker)

    def shutdown(self) -> None:
        with self._lock:
            workers, self._all, self._idle = list(self._all), [], {}
        for worker in workers:
            worker.end()

    def pids(self) -> list[int]:
        with self._lock:
            return [w.pid for w in self._all if w.local]


_POOL = _Pool()
atexit.register(_node_forks.shutdown)  # runs after the pool's (atexit is last in, first out)
atexit.register(_POOL.shutdown)


def shutdown() -> None:
    """End every node process this process started (idle or not), then the fork server."""
    _POOL.shutdown()
    _node_forks.shutdown()


# The plugin runs this when the pytest session ends.
cleanup.at_session_end(shutdown)


def live_pids() -> list[int]:
    """Pids of the local node processes started and not yet ended."""
    return _POOL.pids()


# The implementation's threads run in the node processes: waits count their queue too.
runqueue.add_pid_source(live_pids)


# -- the proxies -----------------------------------------------------------------


class ProcessConnection:
    """A connection of a process node: each call is forwarded to the node's process.

    ``peer_id`` is read once (it never changes); everything else is a call.
    """

    def __init__(self, transport: ProcessTransport, handle: int, peer_id: str | None) -> None:
        self._transport = transport
        self._handle = handle
        self._peer_id = peer_id

    @property
    def peer_id(self) -> Any:
        if self._peer_id is None:
            return self._transport._call("peer_id", [self._handle])
        return self._peer_id

    @property
    def alive(self) -> Any:
        return self._transport._alive(self._handle)

    def send(self, msg: Any) -> None:
        self._transport._call("send", [self._handle, msg])

    def recv(self) -> Any:
        return self._transport._recv(self._handle)

    def mark_dead(self) -> None:
        self._transport._call("mark_dead", [self._handle])

    def close(self) -> None:
        self._transport._call("close_conn", [self._handle])

    def __repr__(self) -> str:
        return f"<ProcessConnection #{self._handle} to {self._peer_id} on {self._transport!r}>"


class _NotASequence:
    """What a remote call returned instead of a sequence (the harness reports its type)."""

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name

    def __repr__(self) -> str:
        return f"<{self.type_name} returned by the node process>"


class ProcessTransport:
    """A node whose transport lives in another process; the interface of ``DESIGN.md``.

    Built by :class:`ProcessNodeFactory`. Besides the interface it offers the
    process faults: :meth:`pause`, :meth:`resume`, :meth:`kill`, and
    :attr:`pid`, :meth:`state`.
    """

    def __init__(self, worker: _Worker, local_id: str, host: str, port: int) -> None:
        self._worker = worker
        self.local_id = local_id
        self.host = host
        self.port = port
        self._conns: dict[int, ProcessConnection] = {}
        self._closed = False
        #: Handles to drain right after the next poll() if it returns nothing new.
        self._drain_plan: list[int] | None = None
        #: ``(op, handle)`` -> sequence number of a call the node was told to run ahead
        #: (announced), whose reply the call collects when it is made.
        self._announced: dict[tuple[str, int], int] = {}
        worker.label = f"node {local_id}, pid {worker.pid}"

    # -- the interface -----------------------------------------------------------

    def connect(self, peer_id: str) -> ProcessConnection:
        handle, peer = self._call("connect", [peer_id])
        return self._proxy(handle, peer)

    def poll(self) -> Any:
        plan, self._drain_plan = self._drain_plan, None
        if plan and not self._announced and not self._closed:
            kind, value = self._poll_drain(plan)
            result = _NotASequence(value) if kind != "ok" else value
        else:
            result = self._sequence("poll", [])
        if isinstance(result, _NotASequence):
            return result
        return [self._proxy(handle, peer) for handle, peer in result]

    def drain_after_poll(self, conns: list[Any]) -> None:
        """The caller's next calls are ``poll()`` and, if it returns no new connection,
        ``recv()`` on each of ``conns`` in this order, with no other call to this node in
        between: the node then runs those ``recv()`` calls right after its ``poll()``, in
        one round trip, each under its own watchdog guard, and each ``recv()`` here
        hands over its own call's answer (or its error) when it is asked.

        The node runs the same calls in the same order as without the announcement; a
        ``recv()`` that is not asked for after all keeps its answer for that connection's
        next ``recv()``, so no message is dropped. Announce nothing (or a connection of
        another node) and the calls go one by one as before.
        """
        self._drain_plan = self._own_handles(conns)

    def close(self) -> None:
        """Close the remote transport; the process returns to the pool (or is reaped).

        A node killed or still paused by a fault has nobody to answer: its
        process is ended (SIGKILL) and reaped instead.
        """
        if self._closed:
            return
        if self._worker.signalled in ("SIGKILL", "SIGSTOP"):
            self._closed = True
            _POOL.discard(self._worker)
            return
        try:
            self._call("close", [])
        except BaseException:
            self._worker.broken = True
            raise
        finally:
            if not self._worker.broken:
                self._closed = True
        self._announced.clear()
        self._worker.forget_announced()
        _POOL.release(self._worker)

    # -- faults --------------------------------------------------------------------

    @property
    def pid(self) -> int:
        return self._worker.pid

    def state(self) -> str:
        """``running``, ``stopped``, ``dead`` (or ``unknown`` for a remote host)."""
        return self._worker.state()

    def pause(self) -> float:
        """SIGSTOP the node's process; returns ``time.monotonic()`` once it is stopped."""
        self._worker.signal(signal.SIGSTOP)
        self._await_state("stopped")
        return time.monotonic()

    def resume(self) -> float:
        """SIGCONT the node's process; returns ``time.monotonic()`` once it runs again."""
        self._worker.signal(signal.SIGCONT)
        self._worker.signalled = None
        self._await_state("running")
        return time.monotonic()

    def kill(self) -> float:
        """SIGKILL the node's process; returns ``time.monotonic()`` once it is gone."""
        self._worker.signal(signal.SIGKILL)
        self._await_state("dead")
        return time.monotonic()

    def _await_state(self, wanted: str, timeout: float = 5.0) -> None:
        if not self._worker.local:
            return
        deadline = time.monotonic() + timeout
        while self._worker.state() != wanted:
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"{self._worker.label}: still {self._worker.state()} {timeout} s after "
                    f"asking for {wanted}")
            time.sleep(0.0005)

    # -- internals -----------------------------------------------------------------

    def _call(self, op: str, args: list[Any]) -> Any:
        if self._closed:
            # Mirrors a closed transport: the remote one says so itself while it exists.
            raise RuntimeError(f"process node {self.local_id}: the transport is closed")
        if self._announced:
            self._drop_alive_reads()
        return self._worker.request(op, args, timeout=watchdog.default_limit() + _MARGIN_S)

    def _sequence(self, op: str, args: list[Any]) -> Any:
        kind, value = self._call(op, args)
        if kind != "ok":
            return _NotASequence(value)
        return value

    def _poll_drain(self, handles: list[int]) -> Any:
        value, drains = self._worker.poll_drain(
            handles, timeout=watchdog.default_limit() + _MARGIN_S)
        self._announced = {("recv", handle): seq for handle, seq in drains.items()}
        return value

    def _answered(self, op: str, handle: int) -> Any:
        """The announced answer of ``op`` on ``handle``, else :data:`SKIPPED`."""
        seq = self._announced.pop((op, handle), None)
        if seq is None or self._closed:
            return SKIPPED
        return self._worker.collect(seq, op, timeout=watchdog.default_limit() + _MARGIN_S)

    def _recv(self, handle: int) -> Any:
        answer = self._answered("recv", handle)
        if answer is SKIPPED:
            return self._sequence("recv", [handle])
        kind, value = answer
        return _NotASequence(value) if kind != "ok" else value

    def _alive(self, handle: int) -> Any:
        answer = self._answered("alive", handle)
        if answer is SKIPPED:
            return self._call("alive", [handle])
        return answer

    def read_alive_ahead(self, conns: list[Any]) -> None:
        """The caller's next calls to this node are ``alive`` of each of ``conns`` in this
        order (other calls in between drop what is announced and go one by one): the node
        reads them all now, in that order, each under its own watchdog guard, in one
        request; each ``alive`` here then hands over its own read. Nothing is announced
        while an earlier announcement is still open, or if the node cannot be reached
        (the calls then go one by one and report that themselves)."""
        handles = self._own_handles(conns)
        if self._announced or self._closed or not handles:
            return
        try:
            self._announced = self._worker.announce([("alive", h) for h in handles])
        except Exception:  # the node is gone or cannot be written to: the calls will say
            self._announced = {}

    def _own_handles(self, conns: list[Any]) -> list[int] | None:
        """The handles of ``conns`` if each is a distinct connection of this transport,
        else ``None`` (nothing can be announced for them)."""
        handles = []
        for conn in conns:
            if not isinstance(conn, ProcessConnection) or conn._transport is not self:
                return None
            handles.append(conn._handle)
        return handles if len(set(handles)) == len(handles) else None

    def _drop_alive_reads(self) -> None:
        """A call that was not announced: reads made ahead of it would be stale."""
        stale = [key for key in self._announced if key[0] == "alive"]
        if stale:
            self._worker.abandon([self._announced.pop(key) for key in stale])

    def _proxy(self, handle: int, peer: str | None) -> ProcessConnection:
        found = self._conns.get(handle)
        if found is None:
            found = self._conns[handle] = ProcessConnection(self, handle, peer)
        return found

    def __repr__(self) -> str:
        return f"<ProcessTransport {self.local_id} ({self._worker.label})>"


class ProcessNodeFactory:
    """``factory(local_id, host, port, **kwargs)`` building a :class:`ProcessTransport`.

    ``path`` is the ``MODULE:ATTR`` of the real factory, imported in each node
    process; ``gateway`` the execnet spec of where the processes run.
    """

    def __init__(self, path: str, *, gateway: str | None = None,
                 capabilities: Any = None) -> None:
        self.path = path
        self.gateway = gateway or f"popen//python={sys.executable}"
        if capabilities is not None:
            self.zmq_conformance_capabilities = capabilities

    def __call__(self, local_id: str, host: str, port: int, **kwargs: Any) -> ProcessTransport:
        """Start (or reuse) a node process and build the transport in it.

        Starting the process and importing the factory's module is bounded by
        :func:`startup_limit`, not by the call watchdog around this call (it is
        suspended meanwhile); the factory call itself runs under the watchdog
        in the node process, so a factory that hangs still comes back as a
        blocked call naming it.
        """
        with watchdog.suspended():
            return self._start(local_id, host, port, kwargs)

    def _start(self, local_id: str, host: str, port: int,
               kwargs: dict[str, Any]) -> ProcessTransport:
        worker = _POOL.acquire(self.gateway)
        args = {
            "factory": self.path,
            "local_id": local_id,
            "host": host,
            "port": port,
            "kwargs": kwargs,
            "limit": watchdog.default_limit(),
            "sys_path": [p for p in sys.path if p] if worker.local else [],
            "cwd": os.getcwd() if worker.local else "",
        }
        try:
            worker.request("build", [args], startup=True,
                           timeout=startup_limit() + watchdog.default_limit() + _MARGIN_S)
        except BaseException:
            _POOL.discard(worker)
            raise
        return ProcessTransport(worker, local_id, host, port)

    def __repr__(self) -> str:
        return f"<ProcessNodeFactory {self.path} via {self.gateway}>"


# -- specs -------------------------------------------------------------------------


def is_process_spec(spec: TransportSpec) -> bool:
    """True when ``spec`` builds process nodes (here, or as a driver's processes: a factory
    with a true ``builds_process_nodes``, see :mod:`conformance.drivers`)."""
    return isinstance(spec.factory, ProcessNodeFactory) or bool(
        getattr(spec.factory, "builds_process_nodes", False))


def factory_path(spec: TransportSpec) -> str:
    """The importable ``MODULE:ATTR`` of ``spec``'s factory, or a :class:`ConfigError`."""
    candidates = [spec.name]
    module = getattr(spec.factory, "__module__", None)
    qualname = getattr(spec.factory, "__qualname__", None)
    if module and qualname:
        candidates.append(f"{module}:{qualname}")
    for path in candidates:
        if ":" not in path or "<" in path:
            continue
        with contextlib.suppress(ConfigError):
            if load_factory(path) is spec.factory:
                return path
    raise ConfigError(
        f"--nodes process: the factory of {spec.name!r} is not importable as MODULE:ATTR "
        "(a local function or lambda?); a node process builds its transport by importing it"
    )


def process_spec(spec: TransportSpec, *, gateway: str | None = None) -> TransportSpec:
    """``spec`` with every node in its own process (``spec`` itself if it already is)."""
    if is_process_spec(spec):
        return spec
    factory = ProcessNodeFactory(factory_path(spec), gateway=gateway)
    return dataclasses.replace(spec, name=f"{spec.name} (process nodes)", factory=factory)


def nodes_spec(spec: TransportSpec, mode: str | None, *, option: str = "--nodes") -> TransportSpec:
    """Apply a ``--nodes`` choice to ``spec``; unknown modes are a :class:`ConfigError`."""
    chosen = (mode or "inprocess").strip()
    if chosen not in NODE_MODES:
        raise ConfigError(f"{option}={mode!r}: expected one of {', '.join(NODE_MODES)}")
    if chosen == "inprocess":
        return spec
    _execnet()
    return process_spec(spec)


def wrap_factory(path: str, **kwargs: Any) -> Callable[..., ProcessTransport]:
    """A process-node factory for ``MODULE:ATTR`` (for users' own fixtures)."""
    return ProcessNodeFactory(path, **kwargs)
