"""A warm fork server for local process nodes: a node starts with its imports done.

A process node started through execnet pays, every time, for a fresh
interpreter, execnet's bootstrap (its source is sent and compiled), and the
imports of the suite's loader, the watchdog, pyzmq, msgspec and the
reference: about 0.25 s of CPU per node, and the chaos job starts some forty
nodes per run. Here each test process (an xdist worker) starts one *fork
server* once; it imports all that and waits. A node is then one
``fork()`` of it, and talks to the test process over its own Unix socket
(length-prefixed pickles, the same requests and replies as
:mod:`~conformance.contracts.p2p._node_worker`'s execnet channel).

What a node is stays what it was:

- **A real process of its own**, with its own pid, descriptors and threads.
  The fork server forks twice (server -> short-lived middle -> node) and the
  test process is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so the
  node is re-parented to the test process: its parent is the test process,
  as with execnet, and the test process reaps it (its exit status and
  signal come back as before). SIGSTOP, SIGCONT and SIGKILL go to its pid
  directly.
- **Nothing inherited that it did not have.** The node keeps descriptors
  0-2 (``/dev/null``, the test process's stderr twice) and its socket, and
  closes everything else it inherited from the fork server before it
  answers; its transport opens the rest. It runs one thread, the main one,
  which serves requests and carries the watchdog's SIGALRM.
- **It never outlives the run.** Once re-parented it asks for SIGKILL when
  the test process dies (``PR_SET_PDEATHSIG``), as an execnet node did, and
  it ends when its socket closes. The fork server ends when its control
  socket closes or its parent changes.

The fork server is used only for ``popen`` gateways running this very
interpreter on Linux, where the subreaper can be set; any other gateway
(``ssh=...``, another Python) keeps execnet.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["ForkServer", "FramedChannel", "fork_server", "usable_for"]

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_FRAME = struct.Struct("!I")
#: Socket buffers of a node's channel: large enough that a request never waits
#: for a paused node to read it (a message of the suite is at most a few MB).
_BUFFER = 4 << 20
#: How often the fork server checks that its parent is still there.
_PARENT_CHECK_S = 0.5
#: Modules a node needs whatever its factory, and the default factory's own module
#: (``reference_impl:ZmqTransport``; ``reference_impl`` itself imports it lazily, so
#: without it every fresh node paid about 0.1 s of CPU for it, asyncio and ssl
#: included, in its first ``build``): imported once, in the fork server. Only
#: modules without import-time state that a fork would share (contexts, threads,
#: seeded generators) belong here; a user's factory module is imported in the node.
_WARM_MODULES = (
    "conformance.config.loading",
    "conformance.supervision.watchdog",
    "conformance.contracts.p2p._node_worker",
    "zmq",
    "msgspec",
    "reference_impl",
    "reference_impl.p2p.transport",
)


class FramedChannel:
    """One node's socket, shaped like the part of an execnet channel the suite uses.

    ``send(bytes)`` never blocks (what the socket does not take now is kept and
    written while the next :meth:`receive` waits); ``receive(timeout)`` returns
    one message or raises :attr:`TimeoutError` (the builtin) after ``timeout``
    seconds, ``EOFError`` once the other end is gone. A message cut by a
    timeout is kept: the next ``receive`` completes it.
    """

    TimeoutError = TimeoutError

    class RemoteError(Exception):
        """Never raised: a node's own errors come back as replies (execnet's name kept)."""

    def __init__(self, sock: socket.socket, *, wait_to_send: bool = False) -> None:
        self._sock = sock
        self._wait_to_send = wait_to_send
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BUFFER)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _BUFFER)
        sock.setblocking(False)
        self._in = bytearray()
        self._out = bytearray()
        self._closed = False
        # One poller for the channel's life (a round trip per call makes building and
        # registering one per wait a visible part of its cost); POLLOUT only while
        # something waits to be written.
        self._poller = select.poll()
        self._poller.register(sock, select.POLLIN)
        self._polling_out = False

    def fileno(self) -> int:
        return self._sock.fileno()

    def send(self, data: bytes) -> None:
        if self._closed:
            raise EOFError("the channel is closed")
        self._out += _FRAME.pack(len(data))
        self._out += data
        self._flush()
        while self._wait_to_send and self._out:  # the node: its reply is out before it goes on
            select.select([], [self._sock], [])
            self._flush()

    def _flush(self) -> None:
        while self._out:
            try:
                sent = self._sock.send(self._out)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                raise EOFError(f"the node's socket is gone: {exc}") from None
            del self._out[:sent]

    def _take(self) -> bytes | None:
        if len(self._in) < _FRAME.size:
            return None
        (size,) = _FRAME.unpack_from(self._in)
        end = _FRAME.size + size
        if len(self._in) < end:
            return None
        message = bytes(self._in[_FRAME.size:end])
        del self._in[:end]
        return message

    def receive(self, timeout: float | None = None) -> bytes:
        """The next message; ``timeout`` ``None`` waits for ever."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            message = self._take()
            if message is not None:
                return message
            if self._closed:
                raise EOFError("the channel is closed")
            wait_ms = -1
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no message within {timeout} s")
                wait_ms = max(1, int(remaining * 1000 + 0.999))
            if bool(self._out) != self._polling_out:
                self._polling_out = bool(self._out)
                self._poller.modify(
                    self._sock, select.POLLIN | (select.POLLOUT if self._polling_out else 0))
            events = 0
            for _fd, mask in self._poller.poll(wait_ms):
                events |= mask
            if events & select.POLLOUT:
                self._flush()
            if events & (select.POLLIN | select.POLLHUP | select.POLLERR):
                try:
                    data = self._sock.recv(1 << 20)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as exc:
                    raise EOFError(f"the node's socket is gone: {exc}") from None
                if not data:
                    raise EOFError("the other end closed the channel")
                self._in += data

    def __iter__(self) -> Iterator[bytes]:
        """Messages until the other end closes (the node's request loop)."""
        while True:
            try:
                yield self.receive(None)
            except EOFError:
                return

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.close()


class ForkedChild:
    """A forked node, re-parented to this process: the part of ``Popen`` the suite uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: gone, status unknown
                self.returncode = -signal.SIGKILL if _gone(self.pid) else None
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired([str(self.pid)], timeout or 0.0)
            time.sleep(0.002)
        return code

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


class ForkServer:
    """This process's fork server and the subreaper setting that makes its nodes ours."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._lock = threading.Lock()
        self._control = ours
        self.broken = False
        #: True once it has answered: its imports are done, a fork takes milliseconds.
        self.ready = False
        paths = [p for p in sys.path if p]
        from conformance.supervision import lifeline

        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c",
                 "import sys; sys.path[:0] = sys.argv[2:]; "
                 "from conformance.contracts.p2p._node_forks import serve_forks; "
                 "serve_forks(int(sys.argv[1]))",
                 str(theirs.fileno()), *paths],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, close_fds=True,
                preexec_fn=lifeline.preexec(signal.SIGKILL),
            )
        finally:
            theirs.close()

    def fork(self, timeout: float, progress: Callable[[], object]) -> tuple[
            FramedChannel, ForkedChild] | None:
        """A new node process and its channel (its first message is its pickled pid), or
        ``None`` when the fork server does not answer within ``timeout`` seconds.

        ``progress`` is called about every second while waiting (the first request
        waits for the fork server's imports).
        """
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        deadline = time.monotonic() + timeout
        reply = b""
        try:
            with self._lock:
                self._control.settimeout(None)
                socket.send_fds(self._control, [b"F"], [theirs.fileno()])
                while not reply:
                    progress()
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        self.broken = True  # a late answer would be taken for the next one
                        ours.close()
                        return None
                    self._control.settimeout(min(remaining, 1.0))
                    try:
                        reply = self._control.recv(256)
                    except TimeoutError:
                        continue
                    if not reply:
                        raise OSError("the fork server exited")
        except OSError as exc:
            self.broken = True
            ours.close()
            raise OSError(f"the node fork server did not answer: {exc}") from None
        finally:
            theirs.close()
        if not reply.startswith(b"ok "):
            self.broken = True
            ours.close()
            raise OSError(f"the node fork server could not fork: {reply.decode(errors='replace')}")
        self.ready = True
        return FramedChannel(ours), ForkedChild(int(reply[3:]))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._control.close()
        with contextlib.suppress(Exception):
            self.process.wait(timeout=2.0)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


_SERVER: ForkServer | None = None
_SERVER_LOCK = threading.Lock()
_SUBREAPER: bool | None = None


def _become_subreaper() -> bool:
    global _SUBREAPER
    if _SUBREAPER is None:
        _SUBREAPER = False
        if sys.platform.startswith("linux"):
            with contextlib.suppress(OSError, AttributeError):
                libc = ctypes.CDLL(None, use_errno=True)
                _SUBREAPER = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    return _SUBREAPER


def usable_for(gateway: Any) -> bool:
    """Whether a node for this execnet gateway spec can be forked here instead."""
    if os.environ.get("ZMQ_CONFORMANCE_NODE_FORKS", "1") == "0":
        return False
    popen = getattr(gateway, "popen", False)
    python = getattr(gateway, "python", None)
    if not popen or getattr(gateway, "via", None) or getattr(gateway, "chdir", None):
        return False
    if python not in (None, sys.executable) or not hasattr(os, "fork"):
        return False
    return _become_subreaper()


def fork_server() -> ForkServer:
    """This process's fork server, started on first use."""
    global _SERVER
    with _SERVER_LOCK:
        if _SERVER is None or _SERVER.broken or _SERVER.process.poll() is not None:
            if _SERVER is not None:
                _SERVER.close()
            _SERVER = ForkServer()
        return _SERVER


def shutdown() -> None:
    """End the fork server (the nodes are ended by their pool first)."""
    global _SERVER
    with _SERVER_LOCK:
        server, _SERVER = _SERVER, None
    if server is not None:
        server.close()


# -- the fork server's side ------------------------------------------------------


def serve_forks(control_fd: int) -> None:
    """The fork server's loop: one node per ``F`` request (carrying the node's socket)."""
    control = socket.socket(fileno=control_fd)
    parent = os.getppid()
    for name in _WARM_MODULES:
        with contextlib.suppress(Exception):
            __import__(name)
    libc = ctypes.CDLL(None, use_errno=True)
    gc.collect()
    gc.freeze()  # the children's copies of these pages stay shared
    while True:
        ready, _, _ = select.select([control], [], [], _PARENT_CHECK_S)
        if os.getppid() != parent:
            return
        if not ready:
            continue
        try:
            data, fds, _flags, _addr = socket.recv_fds(control, 16, 1)
        except OSError:
            return
        if not data:
            return
        if not fds:
            continue
        try:
            pid = _fork_node(control, fds[0], parent, libc)
        except OSError as exc:
            reply = f"error {exc}".encode()
        else:
            reply = f"ok {pid}".encode()
        finally:
            os.close(fds[0])
        control.sendall(reply)


def _fork_node(control: socket.socket, node_fd: int, owner: int, libc: Any) -> int:
    """Fork a middle process that forks the node and exits; the node's pid."""
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:  # the middle process
        try:
            os.close(read_end)
            node = os.fork()
            if node == 0:
                os.close(write_end)
                _become_node(control, node_fd, owner, libc)
            os.write(write_end, str(node).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        text = b""
        while chunk := os.read(read_end, 32):
            text += chunk
    finally:
        os.close(read_end)
        os.waitpid(middle, 0)
    if not text:
        raise OSError("the middle process did not report the node's pid")
    return int(text)


def _become_node(control: socket.socket, node_fd: int, owner: int, libc: Any) -> None:
    """In the node: wait to be re-parented to ``owner``, shed what was inherited, serve."""
    try:
        deadline = time.monotonic() + 10.0
        while os.getppid() != owner:
            if os.getppid() == 1 or time.monotonic() > deadline:
                os._exit(1)  # not re-parented to the test process: nobody to serve
            time.sleep(0.0002)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != owner:
            os._exit(1)
        control.detach()
        os.dup2(node_fd, 3)
        os.closerange(4, _max_fd())
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.dup2(2, 1)
        from conformance.contracts.p2p import _node_worker

        channel = FramedChannel(socket.socket(fileno=3), wait_to_send=True)
        channel.send(pickle.dumps(os.getpid()))
        _node_worker.serve(channel)
    except EOFError:
        pass  # the test process gave up on this node: nobody to tell
    except BaseException:  # nothing here may return into the fork server's loop
        with contextlib.suppress(BaseException):
            import traceback

            traceback.print_exc()
    finally:
        os._exit(0)


def _max_fd() -> int:
    try:
        return int(os.sysconf("SC_OPEN_MAX"))
    except (ValueError, OSError):
        return 65536
