"""The code a process node runs: one transport, driven over an execnet channel.

:mod:`conformance.contracts.p2p.process_nodes` ships this module to a fresh interpreter with
``gateway.remote_exec(module)``; it then runs with ``__name__ ==
"__channelexec__"`` and a global ``channel``. It must therefore import only
the standard library and installed packages, never the test process's state.

Protocol (each request and reply pickled into one ``bytes`` message: execnet's
own serialiser rejects some values a message may hold, e.g. integers beyond
32 bits, and pickle carries anything a test hands to ``send()`` to the
transport, which then judges it itself):

- request ``(seq, op, args)``; reply ``(seq, "ok", value)`` or
  ``(seq, "err", info)`` where ``info`` is a dict naming the exception's
  module, class, message, ``errno`` (if any) and the remote traceback.
- ``op`` is ``"build"`` (import the factory and build one transport), a
  transport call (``connect``, ``poll``, ``close``), a connection call on a
  handle (``alive``, ``send``, ``recv``, ``mark_dead``, ``close_conn``),
  ``"peer_id"``, ``"pid"`` or ``"exit"``.
- ``"poll_drain"`` (args ``[[[handle, seq], ...]]``) is ``poll()`` followed, only
  when it returned no new connection, by ``recv()`` on each handle in order:
  one request, one reply per call (the ``recv`` replies under the sequence
  numbers the request gave them, ``(seq, "skipped", None)`` for those not run).
  The process machine announces this way the drains it makes after such a
  poll, so a machine step costs one round trip instead of one per connection.
- ``"batch"`` (args ``[[[op, handle, seq], ...]]``, ``op`` ``recv`` or ``alive``):
  those calls in order, one reply each under its ``seq``; the machine announces
  the ``alive`` reads of its invariant this way, one request per node.

Connections are named by integer handles, one per raw object, so the test
process can keep one proxy per connection (POLL-1 compares identities).

Each call runs under the suite's watchdog in this process (SIGALRM, main
thread), so a transport call that blocks comes back as ``CallBlocked``
naming the call instead of wedging the node.

The process asks the kernel to SIGKILL it when its parent dies
(``PR_SET_PDEATHSIG`` on Linux), so a node never outlives the run, even if
the test process is killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import pickle
import signal
import sys
import traceback
from typing import Any

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent exits (Linux); exit now if it already has."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: the session's cleanup still runs
        return
    if parent_pid and os.getppid() != parent_pid:
        os._exit(1)  # the parent died before the request took effect


class _Node:
    """The transport of this process and its connections, by handle."""

    def __init__(self) -> None:
        self.transport: Any = None
        self.limit = 5.0
        self.conns: dict[int, Any] = {}
        self.handles: dict[int, int] = {}
        self._serial = itertools.count(1)

    def handle(self, raw: Any) -> list[Any]:
        """``[handle, peer_id]`` for a raw connection (the same handle every time)."""
        found = self.handles.get(id(raw))
        if found is None or self.conns.get(found) is not raw:
            found = next(self._serial)
            self.conns[found] = raw  # keeps raw alive, so its id is not reused
            self.handles[id(raw)] = found
        try:
            peer_id: Any = raw.peer_id
        except Exception:  # reported when the test reads it
            peer_id = None
        return [found, peer_id if isinstance(peer_id, str) else None]

    def conn(self, handle: int) -> Any:
        return self.conns[handle]

    def build(self, args: dict[str, Any]) -> int:
        for entry in reversed(args.get("sys_path", [])):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        if args.get("cwd"):
            os.chdir(args["cwd"])
        self.limit = float(args.get("limit", self.limit))
        self.transport = None
        self.conns.clear()
        self.handles.clear()
        from conformance.config.loading import load_factory
        from conformance.supervision import watchdog

        watchdog.set_default_limit(self.limit)
        factory = load_factory(args["factory"], option=args.get("option", "factory"))
        with watchdog.guard(f"factory({args['local_id']!r}, {args['host']!r}, {args['port']})"):
            self.transport = factory(
                args["local_id"], args["host"], args["port"], **args.get("kwargs", {})
            )
        return os.getpid()

    def call(self, op: str, args: list[Any]) -> Any:
        if op == "build":
            return self.build(args[0])
        if op == "pid":
            return os.getpid()
        with _watchdog().guard(_describe(op, args)):
            return self._dispatch(op, args)

    def _dispatch(self, op: str, args: list[Any]) -> Any:
        if op == "connect":
            return self.handle(self.transport.connect(args[0]))
        if op == "poll":
            result = self.transport.poll()
            if isinstance(result, (str, bytes)):
                return ["not-a-sequence", type(result).__name__]
            try:
                items = list(result)
            except TypeError:
                return ["not-a-sequence", type(result).__name__]
            return ["ok", [self.handle(raw) for raw in items]]
        if op == "close":
            self.transport.close()
            return None
        conn = self.conn(args[0])
        if op == "alive":
            return conn.alive
        if op == "peer_id":
            return conn.peer_id
        if op == "send":
            conn.send(args[1])
            return None
        if op == "recv":
            result = conn.recv()
            try:
                return ["ok", list(result)] if not isinstance(result, (str, bytes)) else [
                    "not-a-sequence", type(result).__name__]
            except TypeError:
                return ["not-a-sequence", type(result).__name__]
        if op == "mark_dead":
            conn.mark_dead()
            return None
        if op == "close_conn":
            conn.close()
            return None
        raise ValueError(f"process node: unknown operation {op!r}")


_WATCHDOG: Any = None


def _watchdog() -> Any:
    """The suite's watchdog module, imported on first use (a ``from ... import`` per call
    costs a visible share of a round trip) and only once the node serves requests."""
    global _WATCHDOG
    if _WATCHDOG is None:
        from conformance.supervision import watchdog

        _WATCHDOG = watchdog
    return _WATCHDOG


def _describe(op: str, args: list[Any]) -> str:
    if op in ("connect",):
        return f"{op}({args[0]!r}) in the node process"
    if op in ("poll", "close"):
        return f"{op}() in the node process"
    return f"connection.{op}() in the node process"


def _error_info(exc: BaseException) -> dict[str, Any]:
    info: dict[str, Any] = {
        "module": type(exc).__module__,
        "name": type(exc).__qualname__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc))[-4000:],
    }
    errno = getattr(exc, "errno", None)
    if isinstance(errno, int):
        info["errno"] = errno
    for attr in ("call", "seconds"):  # CallBlocked
        value = getattr(exc, attr, None)
        if isinstance(value, (str, float, int)):
            info[attr] = value
    return info


def serve(channel: Any) -> None:
    """Answer requests until ``exit`` or the channel closes; close the transport on the way out."""
    node = _Node()
    try:
        for request in channel:
            seq, op, args = pickle.loads(request)
            if op == "exit":
                channel.send(pickle.dumps((seq, "ok", None)))
                return
            if op == "poll_drain":
                if not _poll_drain(channel, node, seq, args[0]):
                    return
                continue
            if op == "batch":
                if not _batch(channel, node, args[0]):
                    return
                continue
            answered, _value = _answer(channel, node, seq, op, args)
            if answered is None:
                return
    finally:
        if node.transport is not None and not getattr(node.transport, "closed", False):
            with contextlib.suppress(Exception):
                node.transport.close()


def _answer(channel: Any, node: _Node, seq: int, op: str, args: list[Any], *,
            shape: Any = None) -> tuple[bool | None, Any]:
    """Run one call and send its reply: ``(True, value)`` when it returned, ``(False, None)``
    when it raised (the error went back as the reply), ``(None, None)`` when the channel is
    gone. ``shape`` turns the value into the reply's payload (default: the value)."""
    try:
        value = node.call(op, args)
    except BaseException as exc:  # every error goes back to the caller
        if isinstance(exc, (SystemExit, KeyboardInterrupt)) and op != "build":
            raise
        try:
            channel.send(pickle.dumps((seq, "err", _error_info(exc))))
        except Exception:
            return None, None  # the channel is gone: nobody to answer
        return False, None
    payload = value if shape is None else shape(value)
    try:
        reply = pickle.dumps((seq, "ok", payload))
    except Exception as exc:  # a value pickle cannot carry
        channel.send(pickle.dumps((seq, "err", _error_info(TypeError(
            f"{op}() returned a value that cannot cross to the test process: {exc}"
        )))))
        return False, None
    channel.send(reply)
    return True, value


def _poll_drain(channel: Any, node: _Node, seq: int, drains: list[list[int]]) -> bool:
    """``poll()`` and, only when it returned no new connection, ``recv()`` on each handle of
    ``drains`` (``[handle, seq]`` pairs) in order: the calls the test process announced it
    makes next in that case, each under its own watchdog guard and answered as its own
    reply (the poll's payload is ``[value, drained]``). After a ``recv()`` that raised or
    handed over something the harness refuses (not a sequence, a non-dict message) the
    rest are answered ``skipped`` and not run: the test process stops there too, and asks
    again itself if it does go on. False when the channel is gone."""
    def shape(value: Any) -> list[Any]:
        return [value, value == ["ok", []]]

    answered, value = _answer(channel, node, seq, "poll", [], shape=shape)
    if answered is None:
        return False
    if not answered or value != ["ok", []]:
        return True
    return _batch(channel, node, [["recv", handle, recv_seq] for handle, recv_seq in drains])


def _batch(channel: Any, node: _Node, calls: list[list[Any]]) -> bool:
    """Run connection calls ``[op, handle, seq]`` in order, each answered as its own reply
    under ``seq``; after one that raised or returned what the harness refuses (``recv``:
    not a sequence of dicts; ``alive``: not a bool) the rest are answered ``skipped``.
    False when the channel is gone."""
    go_on = True
    for op, handle, seq in calls:
        if not go_on:
            channel.send(pickle.dumps((seq, "skipped", None)))
            continue
        answered, got = _answer(channel, node, seq, op, [handle])
        if answered is None:
            return False
        go_on = bool(answered) and _acceptable(op, got)
    return True


def _acceptable(op: str, value: Any) -> bool:
    """Whether the harness takes ``value`` from ``op`` without failing the step."""
    if op == "recv":
        return bool(value[0] == "ok" and all(isinstance(m, dict) for m in value[1]))
    if op == "alive":
        return isinstance(value, bool)
    return True


if __name__ == "__channelexec__":
    _channel: Any = globals()["channel"]
    _parent = _channel.receive()
    die_with_parent(int(_parent))
    _channel.send(os.getpid())
    serve(_channel)
