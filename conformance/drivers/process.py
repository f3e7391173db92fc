"""Driver processes: starting them, talking to them, judging their failures, ending them.

One :class:`DriverProcess` is one child running the user's driver command
(``docs/drivers.md``). It hosts at most one live implementation object at
a time. :func:`acquire` hands out an idle process, or starts one, and
:func:`release` takes it back once its object closed cleanly: a reused
process saves the start-up time per node and, like an in-process
implementation, keeps whatever its implementation kept after its first use,
so the warm-up cycles of RES and CONN-5 mean what they mean in-process.

Guarantees:

- **A call that does not answer is blocked.** In the main thread the
  watchdog's guard interrupts the wait for a reply (a ``SIGALRM`` ends the
  ``poll()``), and a fallback deadline covers calls from other threads (the
  control server's serve loop). A late reply is read and dropped later, and
  a request cut off halfway is finished before the next one is sent, so
  the stream stays in step.
- **A dead driver is crashed.** A driver that exits, dies of a signal the
  suite did not send, or writes junk on stdout raises :class:`DriverCrashed`
  (a ``CallBlocked``, so no clause takes it for the error it expected). Its
  message names the exit status or signal and quotes the last lines of the
  driver's stderr. The plugin turns it into the verdict ``crashed``. A
  process the suite killed itself (a PROC fault) raises :class:`DriverGone`
  instead, and a stopped one :class:`DriverPaused`, as process nodes do.
- **Nothing outlives the run.** Each driver is the leader of its own
  process group (in the suite's session: see :func:`_spawn`) and gets
  ``PR_SET_PDEATHSIG`` (SIGKILL). It is forked
  from the main thread, or from one helper thread that lives as long as
  the suite, because the death signal follows the forking thread.
  :func:`end_test` ends the processes whose objects a test left open, and
  :func:`shutdown` ends everything, each by closing its stdin, then
  SIGKILL to its group.
- **Errors that teach.** A driver that cannot be started, exits before its
  hello, writes junk, or speaks another protocol version raises
  :class:`DriverStartError`, a one-line :class:`ConfigError`.
- **Resources are counted where they live.** :func:`resource_growth`
  reports every live driver's descriptors and threads beyond those it had
  right after its hello. It also reports the pipe descriptors and the helper
  thread the suite holds for drivers, which
  :func:`conformance.resources.snapshot` leaves out of its own count.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import itertools
import os
import select
import shlex
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import IO, Any, Final

from conformance.drivers.protocol import (
    FrameReader,
    Hello,
    ProtocolError,
    decode_body,
    encode_frame,
    hello_request,
)
from conformance.errors import CallBlocked, ConfigError
from conformance.supervision import cleanup, lifeline, runqueue, watchdog
from conformance.testing import resources

__all__ = [
    "DriverCrashed",
    "DriverGone",
    "DriverPaused",
    "DriverProcess",
    "DriverReplyError",
    "DriverStartError",
    "acquire",
    "end_test",
    "live_pids",
    "probe",
    "release",
    "resource_growth",
    "shutdown",
]

#: How long a driver may take to answer the hello (start-up, imports, JIT).
HELLO_TIMEOUT_S: Final = 30.0
#: How long a driver may take to exit once its stdin is closed.
EXIT_GRACE_S: Final = 2.0
#: Extra wait on top of a call's limit before the fallback deadline fires: the
#: watchdog's guard (main thread) or the harness's own check fires first, naming the call.
_MARGIN_S: Final = 2.0
#: Idle processes kept per (command, contract).
_POOL_MAX: Final = 8
#: Lines of a dead driver's stderr quoted in its verdict.
_TAIL_LINES: Final = 20
_TAIL_BYTES: Final = 4000


class DriverStartError(ConfigError):
    """The driver could not be started or failed its hello (one line, exit status 2)."""


class DriverCrashed(CallBlocked):
    """The driver died (or broke the protocol) while the suite used it: verdict ``crashed``."""

    def __init__(self, message: str) -> None:
        AssertionError.__init__(self, message)
        self.call = message
        self.seconds = 0.0


class DriverGone(CallBlocked):
    """A call went to a driver process the suite itself killed (a PROC fault) or ended."""

    def __init__(self, message: str) -> None:
        AssertionError.__init__(self, message)
        self.call = message
        self.seconds = 0.0


class DriverPaused(CallBlocked):
    """A call went to a driver process that is stopped (SIGSTOP) and got no answer."""


class DriverReplyError(Exception):
    """An error reply: ``kind`` (``docs/drivers.md``, section 4), message, the whole error."""

    def __init__(self, kind: str, message: str, error: Mapping[str, Any]) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.error = dict(error)


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


class DriverProcess:
    """One running driver: its pipes, its hello, the request sequence, its fate."""

    def __init__(self, command: str, contract: str) -> None:
        self.command = command
        self.contract = contract
        argv = _split(command)
        log_fd, self.log_path = tempfile.mkstemp(prefix="zmq-conformance-driver-",
                                                 suffix=".log")
        env = dict(os.environ, ZMQ_CONFORMANCE_DRIVER_PROTOCOL="1",
                   ZMQ_CONFORMANCE_CONTRACT=contract)
        try:
            self._popen = _spawn(argv, log_fd, env)
        except OSError as exc:
            os.unlink(self.log_path)
            raise DriverStartError(f"driver {command!r}: cannot start {argv[0]!r}: "
                                   f"{exc.strerror or exc}") from None
        finally:
            os.close(log_fd)  # the child has its own copy
        self.pid = self._popen.pid
        assert self._popen.stdin is not None and self._popen.stdout is not None
        self._stdin: IO[bytes] = self._popen.stdin
        self._stdout: IO[bytes] = self._popen.stdout
        os.set_blocking(self._stdin.fileno(), False)
        os.set_blocking(self._stdout.fileno(), False)
        self._readable = select.poll()
        self._readable.register(self._stdout.fileno(),
                                select.POLLIN | select.POLLERR | select.POLLHUP)
        self._reader = FrameReader()
        self._replies: list[dict[str, Any]] = []
        self._outgoing = bytearray()
        self._ids = itertools.count(1)
        #: Requests sent so far: a value read in one reply stays current while this does
        #: not change (nothing else was asked of the process since; p2p's ``poll_drain``).
        self.calls = 0
        self._elapsed: float | None = None
        self._lock = threading.RLock()
        #: The signal the suite sent last (a PROC fault), if any.
        self.signalled: str | None = None
        self.crash: str | None = None
        self.ended = False
        self.busy = False
        self.label = f"driver {command!r} (pid {self.pid})"
        try:
            self.hello = self._handshake()
        except BaseException:
            self.end()
            raise
        self._baseline_fds = _fds_of(self.pid)
        self._baseline_threads = _threads_of(self.pid)
        #: The threads the process had just before its current object was built
        #: (:func:`conformance.drivers.remote.build` notes them), tid -> name.
        self.threads_before_object: dict[int, str] = self.threads()

    # -- the hello ----------------------------------------------------------------

    def _handshake(self) -> Hello:
        try:
            self._send(encode_frame(hello_request(self.contract)), time.monotonic() + 5.0)
            body = self._next_body(time.monotonic() + HELLO_TIMEOUT_S)
        except _StreamEnded as ended:
            raise DriverStartError(self._start_failure(ended)) from None
        except _NoAnswer:
            raise DriverStartError(
                f"driver {self.command!r} did not answer the hello within "
                f"{HELLO_TIMEOUT_S:.0f} s{self._stderr_hint()}") from None
        except ProtocolError as exc:
            raise DriverStartError(f"driver {self.command!r} wrote something on stdout that "
                                   f"is not a protocol frame: {exc}") from None
        try:
            return Hello.parse(body, contract=self.contract)
        except ProtocolError as exc:
            raise DriverStartError(f"driver {self.command!r} {exc} "
                                   "(see docs/drivers.md)") from None

    def _start_failure(self, ended: _StreamEnded) -> str:
        code = self._wait_exit(EXIT_GRACE_S)
        how = _describe_exit(code) if code is not None else "closed its stdout"
        junk = f" after writing {ended.pending[:60]!r} on stdout" if ended.pending else ""
        return f"driver {self.command!r} {how} before answering the hello{junk}" + (
            self._stderr_hint())

    def _stderr_hint(self) -> str:
        lines = [line for line in self.stderr_tail().splitlines() if line.strip()]
        return f"; its stderr ends: {lines[-1].strip()[:200]}" if lines else ""

    # -- calls --------------------------------------------------------------------

    def call(self, handle: int, name: str, args: Mapping[str, Any], *, what: str,
             limit: float | None = None) -> Any:
        """Send one request and return its result; :class:`DriverReplyError` on an error reply.

        ``limit`` is the longest the call may legitimately take (default: the
        watchdog's limit). ``TypeError``/``ValueError`` when ``args`` cannot be
        encoded: nothing is sent then.
        """
        with self._lock:
            self._check_usable(what)
            request_id = next(self._ids)
            self.calls = request_id
            frame = encode_frame({"id": request_id, "call": name, "handle": handle,
                                  "args": dict(args)})
            allowed = watchdog.default_limit() if limit is None else limit
            if watchdog.active():
                # The guard names the call first; this deadline only ends an unguarded wait.
                allowed = 3 * max(allowed, watchdog.default_limit())
            deadline = time.monotonic() + allowed + _MARGIN_S
            try:
                self._send(frame, deadline)
                reply = self._reply_to(request_id, deadline)
            except _StreamEnded:
                raise self._death(what) from None
            except _NoAnswer:
                raise self._no_answer(what, allowed) from None
            except ProtocolError as exc:
                raise self._broken(what, str(exc)) from None
        elapsed = reply.get("elapsed_ns")
        self._elapsed = (elapsed / 1e9 if isinstance(elapsed, int) and elapsed >= 0
                         else None)
        if "error" in reply:
            error = reply["error"]
            if not isinstance(error, dict):
                raise self._broken(what, f"an error reply whose 'error' is a "
                                         f"{type(error).__name__}, not a map")
            kind = error.get("kind")
            return self._raise_error(str(kind) if kind is not None else "error", error)
        if "result" not in reply:
            raise self._broken(what, f"a reply with neither 'result' nor 'error': {reply!r}")
        return reply["result"]

    def last_elapsed(self) -> float | None:
        """Seconds the implementation spent in the last call, as the driver measured it
        (the reply's optional ``elapsed_ns``), or ``None``."""
        return self._elapsed

    @staticmethod
    def _raise_error(kind: str, error: Mapping[str, Any]) -> Any:
        raise DriverReplyError(kind, str(error.get("message", "")), error)

    def _check_usable(self, what: str) -> None:
        if self.crash is not None:
            raise DriverCrashed(f"{what}: {self.crash}")
        if self.signalled == "SIGKILL":
            raise DriverGone(f"{what}: {self.label} was killed (SIGKILL) by the test")
        if self.ended:
            raise DriverGone(f"{what}: {self.label} was ended by the suite")

    def _send(self, frame: bytes, deadline: float) -> None:
        """Write ``frame`` after what an interrupted call left unwritten."""
        self._outgoing += frame
        fd = self._stdin.fileno()
        while self._outgoing:
            try:
                written = os.write(fd, self._outgoing)
            except BlockingIOError:
                written = 0
            except (BrokenPipeError, ConnectionResetError):
                raise _StreamEnded(self._reader.pending) from None
            del self._outgoing[:written]
            if not self._outgoing:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _NoAnswer()
            _wait_fd(fd, select.POLLOUT, remaining)

    def _reply_to(self, request_id: int, deadline: float) -> dict[str, Any]:
        while True:
            body = self._next_body(deadline)
            got = body.get("id")
            if not isinstance(got, int) or isinstance(got, bool):
                raise ProtocolError(f"a reply without an integer 'id': {body!r}"[:300])
            if got == request_id:
                return body
            if got > request_id:
                raise ProtocolError(f"a reply to request {got}, which was never sent "
                                    f"(waiting for {request_id})")
            # else: the late reply of a call given up earlier

    def _next_body(self, deadline: float) -> dict[str, Any]:
        while not self._replies:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _NoAnswer()
            fd = self._stdout.fileno()
            if not self._readable.poll(max(1, int(remaining * 1000))):
                continue
            try:
                data = os.read(fd, self._reader.read_size())
            except BlockingIOError:
                continue
            if not data:
                raise _StreamEnded(self._reader.pending)
            self._replies.extend(decode_body(b) for b in self._reader.feed(data))
        return self._replies.pop(0)

    # -- failures -----------------------------------------------------------------

    def _death(self, what: str) -> CallBlocked:
        code = self._wait_exit(1.0)
        if self.signalled == "SIGKILL":
            return DriverGone(f"{what}: {self.label} was killed (SIGKILL) by the test")
        how = _describe_exit(code) if code is not None else "closed its stdout"
        self.crash = f"{self.label} {how}{self._tail_note()}"
        self._kill()
        watchdog.note_block()
        return DriverCrashed(f"{what}: {self.crash}")

    def _broken(self, what: str, problem: str) -> DriverCrashed:
        self.crash = (f"{self.label} broke the protocol on stdout: {problem}"
                      f"{self._tail_note()}")
        self._kill()
        watchdog.note_block()
        return DriverCrashed(f"{what}: {self.crash}")

    def _no_answer(self, what: str, seconds: float) -> CallBlocked:
        state = self.state()
        if state == "dead":
            return self._death(what)
        if state == "stopped":
            return DriverPaused(f"{what} on a paused {self.label} (stopped by "
                                f"{self.signalled or 'a signal'})", seconds)
        return CallBlocked(f"{what} on {self.label}", seconds)

    def _tail_note(self) -> str:
        tail = self.stderr_tail()
        if not tail.strip():
            return "; its stderr is empty"
        quoted = "\n".join(f"    {line}" for line in tail.splitlines())
        return f"; the last lines of its stderr:\n{quoted}"

    def log_text(self, max_bytes: int = 1 << 20) -> str:
        """The driver's stderr (its log) so far, at most its last ``max_bytes`` bytes: what
        a clause that judges an implementation's logs reads (PIPE-13)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - max_bytes))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def stderr_tail(self) -> str:
        """The last lines the driver wrote on stderr."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - _TAIL_BYTES))
                data = f.read()
        except OSError:
            return ""
        lines = data.decode("utf-8", "replace").splitlines()
        return "\n".join(lines[-_TAIL_LINES:])

    # -- process state and faults -------------------------------------------------

    def state(self) -> str:
        """``running``, ``stopped`` or ``dead``."""
        if self._popen.poll() is not None:
            return "dead"
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return "running"
        return {"T": "stopped", "t": "stopped", "Z": "dead", "X": "dead"}.get(
            fields[0], "running")

    @property
    def alive(self) -> bool:
        return self._popen.poll() is None and self.crash is None and not self.ended

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the driver (a process fault); remembered so its effects are not
        taken for a crash."""
        self.signalled = sig.name
        if sig is signal.SIGCONT:
            self.signalled = None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)

    def exit_status(self, timeout: float) -> int | None:
        """The exit status once the process ended within ``timeout`` seconds (negative: the
        signal that killed it), ``None`` while it runs. For a driver whose process is the
        implementation's own (the engine pipeline's engines), judged by the clauses."""
        return self._wait_exit(timeout)

    def _wait_exit(self, timeout: float) -> int | None:
        try:
            return self._popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def _kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self._popen.kill()

    def end(self) -> None:
        """End the process: close its stdin, wait briefly, then SIGKILL its process group."""
        if self.ended:
            return
        self.ended = True
        if self.state() == "stopped":
            self._kill()
        with contextlib.suppress(OSError):
            self._stdin.close()
        if self._wait_exit(EXIT_GRACE_S) is None:
            self._kill()
            self._wait_exit(EXIT_GRACE_S)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)  # whatever it forked
        with contextlib.suppress(OSError):
            self._stdout.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log_path)

    # -- resources ----------------------------------------------------------------

    def threads(self) -> dict[int, str]:
        """The driver's threads now, by thread id, with the name the kernel knows
        (``/proc/<pid>/task/<tid>/comm``); empty once the process is gone. A driver
        in any language is seen alike: its runtime's threads and its libraries' count."""
        if self._popen.poll() is not None:
            return {}
        return _thread_names(self.pid)

    def pipe_fds(self) -> tuple[int, ...]:
        """The suite's ends of this driver's pipes (open until :meth:`end`)."""
        if self.ended:
            return ()
        return tuple(f.fileno() for f in (self._stdin, self._stdout) if not f.closed)

    def growth(self, *, targets: bool = True) -> tuple[dict[str, str], int]:
        """Descriptors opened since the hello (``"pid:fd" -> target``) and extra threads.

        Without ``targets``, for counting only: the descriptor numbers are listed
        and none is read (a ``readlink`` each cost the cluster machine's per-step
        counts through a driver about 0.4 ms a call); a descriptor is new when its
        number was not open at the hello, and its target is ``""``. The two differ
        only where the implementation closed a descriptor of the driver's own start
        and reused its number, which no count-based check needs to see.
        """
        if self._popen.poll() is not None:
            return {}, 0
        if targets:
            now = _fds_of(self.pid)
            fds = {f"{self.pid}:{fd}": target for fd, target in now.items()
                   if self._baseline_fds.get(fd) != target}
        else:
            fds = {f"{self.pid}:{fd}": "" for fd in _fd_numbers_of(self.pid)
                   if fd not in self._baseline_fds}
        return fds, max(0, _threads_of(self.pid) - self._baseline_threads)

    def __repr__(self) -> str:
        return f"<DriverProcess {self.label} {self.state()}>"


class _StreamEnded(Exception):
    """stdout reached its end (or stdin broke): the driver is gone."""

    def __init__(self, pending: bytes) -> None:
        super().__init__()
        self.pending = pending


class _NoAnswer(Exception):
    """The deadline passed."""


def _wait_fd(fd: int, event: int, timeout: float) -> bool:
    poller = select.poll()
    poller.register(fd, event | select.POLLERR | select.POLLHUP)
    return bool(poller.poll(max(1, int(timeout * 1000))))


def _split(command: str) -> list[str]:
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise DriverStartError(f"driver {command!r}: cannot split the command: {exc}") from None
    if not argv:
        raise DriverStartError("driver: the command is empty")
    return argv


def _fds_of(pid: int) -> dict[int, str]:
    base = f"/proc/{pid}/fd"
    fds: dict[int, str] = {}
    for fd in _fd_numbers_of(pid):
        with contextlib.suppress(OSError):
            fds[fd] = os.readlink(f"{base}/{fd}")
    return fds


def _fd_numbers_of(pid: int) -> list[int]:
    try:
        return [int(name) for name in os.listdir(f"/proc/{pid}/fd") if name.isdigit()]
    except OSError:
        return []


def _thread_names(pid: int) -> dict[int, str]:
    base = f"/proc/{pid}/task"
    found: dict[int, str] = {}
    try:
        tids = os.listdir(base)
    except OSError:
        return found
    for tid in tids:
        with contextlib.suppress(OSError, ValueError), open(f"{base}/{tid}/comm") as f:
            found[int(tid)] = f.read().strip()
    return found


def _threads_of(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


# -- spawning -------------------------------------------------------------------------

_spawner: concurrent.futures.ThreadPoolExecutor | None = None
_spawner_tid: int | None = None
_spawner_lock = threading.Lock()


def _spawn(argv: list[str], log: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start the driver from a thread that lives as long as the suite (see the module doc)."""

    def start() -> subprocess.Popen[bytes]:
        # A process group of its own (so the end kills what it forked), but the suite's
        # session: where the kernel groups tasks by session for scheduling (autogroup),
        # a session of its own would give each driver its own share of the CPUs. An
        # in-process implementation competes inside the suite's share, and the host-stall
        # meter (conformance.supervision.host_stall) samples only that share: in the
        # suite's session the driver is scheduled as the implementation would be in-process,
        # and a stall the meter sees is one the driver sees.
        return subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env,
            process_group=0, close_fds=True,
            preexec_fn=lifeline.preexec(signal.SIGKILL, thread_outlives_child=True),
        )

    if threading.current_thread() is threading.main_thread():
        return start()
    return _spawner_pool().submit(start).result()


def _spawner_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            def note_tid() -> None:
                global _spawner_tid
                _spawner_tid = threading.get_native_id()

            _spawner = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="zmq-conformance-driver-spawner",
                initializer=note_tid)
        return _spawner


# -- the pool ---------------------------------------------------------------------------

_lock = threading.Lock()
_idle: dict[tuple[str, str], list[DriverProcess]] = {}
_all: list[DriverProcess] = []


def probe(command: str, contract: str) -> Hello:
    """Start a driver for ``contract``, check its hello and keep it for reuse."""
    process = DriverProcess(command, contract)
    with _lock:
        _all.append(process)
    release(process)
    return process.hello


def acquire(command: str, contract: str) -> DriverProcess:
    """An idle driver process for ``(command, contract)`` (the last one released), or a new one."""
    with _lock:
        idle = _idle.get((command, contract), [])
        while idle:
            process = idle.pop()
            if process.alive and process.state() == "running":
                process.busy = True
                return process
            _all.remove(process)
            process.end()
    process = DriverProcess(command, contract)
    process.busy = True
    with _lock:
        _all.append(process)
    return process


def release(process: DriverProcess) -> None:
    """``process``'s object closed cleanly: keep it for the next object, or end it."""
    with _lock:
        process.busy = False
        idle = _idle.setdefault((process.command, process.contract), [])
        if process.alive and process.hello.reuse and process.signalled is None \
                and process not in idle:
            idle.append(process)
            if len(idle) <= _POOL_MAX:
                return
            process = idle.pop(0)
        if process in _all:
            _all.remove(process)
    process.end()


def discard(process: DriverProcess) -> None:
    """End ``process`` (killed, paused, crashed, or its object could not be closed)."""
    with _lock:
        process.busy = False
        if process in _all:
            _all.remove(process)
        for idle in _idle.values():
            if process in idle:
                idle.remove(process)
    process.end()


def end_test() -> None:
    """A test ended: end every process still hosting an object (nothing outlives a test)."""
    with _lock:
        busy = [p for p in _all if p.busy]
    for process in busy:
        discard(process)


def shutdown() -> None:
    """End every driver process (end of the session, and at exit)."""
    with _lock:
        everything = list(_all)
        _all.clear()
        _idle.clear()
    for process in everything:
        process.end()


def live_pids() -> list[int]:
    """Pids of the driver processes still running."""
    with _lock:
        return [p.pid for p in _all if p.state() != "dead"]


def resource_growth(*, targets: bool = True) -> tuple[set[int], int, dict[str, str], int]:
    """For :mod:`conformance.resources`: the suite's own descriptors and threads kept for
    drivers (to leave out), and what the live drivers opened since their hello
    (without ``targets``, counted from listings: :meth:`DriverProcess.growth`)."""
    hidden_fds: set[int] = set()
    fds: dict[str, str] = {}
    threads = 0
    with _lock:
        processes = list(_all)
    for process in processes:
        hidden_fds.update(process.pipe_fds())
        grown, extra = process.growth(targets=targets)
        fds.update(grown)
        threads += extra
    hidden_threads = 1 if _spawner_tid is not None else 0
    return hidden_fds, hidden_threads, fds, threads


def _at_exit() -> None:
    shutdown()


atexit.register(_at_exit)
cleanup.at_session_end(shutdown)
cleanup.after_each_test(end_test)  # processes whose objects the test left open
resources.add_source(resource_growth)  # a driver's descriptors and threads are its object's
runqueue.add_pid_source(live_pids)  # a driver waiting for a CPU is a host stall's victim


def processes() -> list[DriverProcess]:
    """The driver processes alive now, idle or busy (for the bridge's own tests)."""
    with _lock:
        return list(_all)
