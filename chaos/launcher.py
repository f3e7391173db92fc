"""Locate or start a toxiproxy server for the chaos suite.

Order (``prefer="auto"``):

1. ``TOXIPROXY_URL`` (e.g. ``http://127.0.0.1:8474``): use that running
   server; it is shared, never stopped by us.
2. ``TOXIPROXY_SERVER`` (the path of a ``toxiproxy-server`` binary, e.g.
   one unpacked from a toxiproxy release outside ``PATH``): started on a free
   port. Set but not executable is an error, never a silent fallback.
3. A ``toxiproxy-server`` binary on ``PATH``: started on a free port.
4. The embedded server: ``sys.executable -m chaos.toxiproxy_server`` on a
   free port (it reports the port through ``--port-file``).

``prefer="embedded"``, ``"binary"`` (``TOXIPROXY_SERVER``, else PATH) or
``"external"`` uses only that source (``"embedded"`` tests the embedded server even where a real one
is installed).

Servers we start never outlive us: ``ServerLease.stop()`` terminates them
(SIGTERM, then SIGKILL after a grace period), an ``atexit`` hook stops any
lease still running, and in case the parent is killed outright the child
gets SIGTERM from the kernel (Linux ``PR_SET_PDEATHSIG``, set when launched
from the main thread) and the embedded server additionally polls for its
parent (``--parent-pid``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import chaos
from conformance.supervision import lifeline
from conformance.supervision.runqueue import HostDelay

ENV_URL = "TOXIPROXY_URL"
ENV_SERVER = "TOXIPROXY_SERVER"
BINARY = "toxiproxy-server"

Prefer = Literal["auto", "embedded", "binary", "external"]
Kind = Literal["external", "binary", "embedded"]

_START_TIMEOUT_S = 15.0
#: The start-up's wall-time cap however long the host kept the server waiting for a CPU.
_START_PATIENCE_S = 120.0
_STOP_GRACE_S = 5.0


class ToxiproxyUnavailable(RuntimeError):
    """No toxiproxy server could be found or started (the message says why)."""


@dataclass(eq=False)
class ServerLease:
    """A reachable toxiproxy server; ``stop()`` ends it if we started it."""

    host: str
    port: int
    kind: Kind
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    _tmpdir: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def owned(self) -> bool:
        """True when we started the server (so nobody else uses it)."""
        return self.process is not None

    def stop(self) -> None:
        """Terminate the server we started (idempotent; no-op for external ones)."""
        proc, self.process = self.process, None
        if proc is not None:
            with _LIVE_LOCK:
                _LIVE.discard(self)
            _terminate(proc)
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None

    def log_tail(self, limit: int = 2000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(encoding="utf-8", errors="replace")[-limit:]

    def last_log_lines(self, count: int = 8) -> str:
        """The last ``count`` lines of the server's log (``"(empty)"`` when it wrote none)."""
        lines = self.log_tail(limit=16_000).splitlines()[-count:]
        return "\n".join(lines) if lines else "(empty)"

    def describe_stop(self, cause: str) -> str:
        """Why this server does not answer, for a run error: exit status and log tail.

        ``cause`` is what the failed call saw (e.g. "connection refused"). For a
        server we started: its exit status (a signal by name), or, while the
        process still exists, its state (``stopped``: SIGSTOP, by us or by
        someone signalling our process group); then the last log lines. For an
        external one only the address and ``cause`` are known.
        """
        what = f"the fault proxy at {self.url} ({self.describe_kind()})"
        proc = self.process
        if proc is None:
            return f"{what} stopped answering ({cause}); not started by this run, so no exit status"
        code = proc.poll()
        if code is not None:
            status = f"exit status {code}"
            if code < 0:
                with contextlib.suppress(ValueError):
                    status += f" (killed by {signal.Signals(-code).name})"
            return f"{what} stopped: {status}, last log lines:\n{self.last_log_lines()}"
        return (
            f"{what} stopped answering ({cause}): its process {proc.pid} is still there "
            f"({_process_state(proc.pid)}), last log lines:\n{self.last_log_lines()}"
        )

    def describe_kind(self) -> str:
        """``embedded server``, ``toxiproxy-server PATH`` or ``external server``."""
        if self.kind == "binary" and self.process is not None:
            args = self.process.args
            path = args[0] if isinstance(args, list) and args else "?"
            return f"{BINARY} {path}"
        return f"{self.kind} server"


_LIVE: set[ServerLease] = set()
_LIVE_LOCK = threading.Lock()


def _stop_all_at_exit() -> None:
    with _LIVE_LOCK:
        leases = list(_LIVE)
    for lease in leases:
        lease.stop()


atexit.register(_stop_all_at_exit)


def _process_state(pid: int) -> str:
    """The process's state in words: running, stopped (SIGSTOP or a tracer), a zombie,
    or unknown (no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            code = stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "state unknown"
    if code in ("T", "t"):
        return "stopped: SIGSTOP or a tracer"
    if code == "Z":
        return "a zombie: exited, not yet reaped"
    return "running"


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _answers(url: str, timeout: float) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/version", timeout=timeout) as resp:
            return int(resp.status) == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


def _external(url: str) -> ServerLease:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme != "http" or not parsed.hostname or not parsed.port:
        raise ToxiproxyUnavailable(f"{ENV_URL}={url!r} is not of the form http://HOST:PORT")
    lease = ServerLease(host=parsed.hostname, port=parsed.port, kind="external")
    if not _answers(lease.url, timeout=5.0):
        raise ToxiproxyUnavailable(
            f"{ENV_URL}={url!r}: no toxiproxy answered GET /version there; "
            f"start toxiproxy-server or unset {ENV_URL} to use the embedded server"
        )
    return lease


def _spawn(
    argv: list[str], log_dir: tempfile.TemporaryDirectory[str], env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start ``argv`` with stdout and stderr to a log file in ``log_dir``.

    Both: toxiproxy-server 2.x logs to stdout, and the log's tail is what a
    run error about a stopped server shows (``ServerLease.describe_stop``).
    """
    log_path = Path(log_dir.name) / "server.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            preexec_fn=lifeline.preexec(),
        )
    return proc, log_path


def _wait_ready(
    lease: ServerLease,
    port_file: Path | None,
    what: str,
    spawned: tuple[float, HostDelay] | None = None,
) -> None:
    """Wait until the server answers, within ``_START_TIMEOUT_S`` of its own time.

    The host's run-queue delay of the server process is not counted
    (:class:`conformance.supervision.runqueue.HostDelay`): at load 34-46 an
    embedded server's interpreter took over 15 s of wall time to start, all
    but a little of it waiting for a CPU. A server that hangs or sleeps
    still runs out at once; ``_START_PATIENCE_S`` caps the wall time.
    ``spawned`` (monotonic time and delay meter taken right after the spawn)
    counts from the spawn for a server started earlier (:class:`Launch`); a
    server that answers is ready however late it is asked.
    """
    proc = lease.process
    assert proc is not None
    started, delay = spawned if spawned is not None else (time.monotonic(), HostDelay(proc.pid))

    def in_time() -> bool:
        elapsed = time.monotonic() - started
        return elapsed - delay.seconds() < _START_TIMEOUT_S and elapsed < _START_PATIENCE_S

    while True:
        if proc.poll() is not None:
            raise ToxiproxyUnavailable(
                f"{what} exited with code {proc.returncode} before it was ready; "
                f"its log:\n{lease.log_tail()}"
            )
        if port_file is not None and not lease.port:
            with contextlib.suppress(OSError, ValueError):
                lease.port = int(port_file.read_text(encoding="ascii").strip())
        if lease.port and _answers(lease.url, timeout=1.0):
            return
        if not in_time():
            break
        time.sleep(0.05)
    lease.stop()
    raise ToxiproxyUnavailable(
        f"{what} did not answer GET /version within {_START_TIMEOUT_S:.0f} s of its own "
        f"time ({time.monotonic() - started:.0f} s of wall time); "
        f"its log:\n{lease.log_tail()}"
    )


def start_binary(path: str, host: str = "127.0.0.1") -> ServerLease:
    """Start the toxiproxy-server binary at ``path`` on a free port of ``host``."""
    last: ToxiproxyUnavailable | None = None
    for _attempt in range(3):  # a free port can be taken between probe and bind
        port = _free_port(host)
        tmp = tempfile.TemporaryDirectory(prefix="toxiproxy-")
        proc, log_path = _spawn([path, "-host", host, "-port", str(port)], tmp)
        lease = ServerLease(host, port, "binary", proc, log_path, tmp)
        with _LIVE_LOCK:
            _LIVE.add(lease)
        try:
            _wait_ready(lease, None, f"{BINARY} ({path})")
            return lease
        except ToxiproxyUnavailable as exc:
            lease.stop()
            last = exc
    assert last is not None
    raise last


def _spawn_embedded(host: str) -> tuple[ServerLease, Path, str]:
    """Start the embedded server's process; it is ready once :func:`_wait_ready` says so."""
    tmp = tempfile.TemporaryDirectory(prefix="toxiproxy-embedded-")
    port_file = Path(tmp.name) / "port"
    package_root = str(Path(chaos.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    argv = [
        sys.executable,
        "-m",
        "chaos.toxiproxy_server",
        "--host",
        host,
        "--port",
        "0",
        "--port-file",
        str(port_file),
        "--parent-pid",
        str(os.getpid()),
    ]
    proc, log_path = _spawn(argv, tmp, env)
    lease = ServerLease(host, 0, "embedded", proc, log_path, tmp)
    with _LIVE_LOCK:
        _LIVE.add(lease)
    what = f"embedded toxiproxy server ({sys.executable} -m chaos.toxiproxy_server)"
    return lease, port_file, what


class Launch:
    """A server start under way: the process is spawned now, :meth:`ready` waits for it.

    For a caller that knows early that it will need a server and has other work
    meanwhile (an xdist worker collecting its tests): the embedded server's
    interpreter starts beside that work instead of inside the first chaos test.
    The start limit counts from the spawn, in the server's own time, as in
    :func:`launch` (which does both at once). A failure to
    start is raised by :meth:`ready`, never by the constructor. Only the
    embedded server is spawned early; a binary or external server is found and
    started by :meth:`ready`. The process is a live lease from the spawn on, so
    the ``atexit`` hook and the kernel's parent-death signal cover it even if
    :meth:`ready` is never called; :meth:`cancel` ends it sooner.
    """

    def __init__(self, prefer: Prefer = "auto", *, host: str = "127.0.0.1") -> None:
        self.prefer: Prefer = prefer
        self.host = host
        self._spawned: tuple[ServerLease, Path, str, float, HostDelay] | None = None
        self._error: ToxiproxyUnavailable | None = None
        self._done = False
        try:
            if _source(prefer) == "embedded":
                lease, port_file, what = _spawn_embedded(host)
                assert lease.process is not None
                self._spawned = (lease, port_file, what, time.monotonic(),
                                 HostDelay(lease.process.pid))
        except ToxiproxyUnavailable as exc:
            self._error = exc
        except OSError as exc:
            self._error = ToxiproxyUnavailable(f"cannot start the embedded server: {exc}")

    def ready(self) -> ServerLease:
        """The running server (waits for it); raises ``ToxiproxyUnavailable``. Once only."""
        if self._done:
            raise RuntimeError("Launch.ready() was already called")
        self._done = True
        if self._error is not None:
            raise self._error
        if self._spawned is None:
            return _find_or_start(self.prefer, self.host)
        lease, port_file, what, started, delay = self._spawned
        self._spawned = None
        try:
            _wait_ready(lease, port_file, what, (started, delay))
        except BaseException:
            lease.stop()
            raise
        return lease

    def cancel(self) -> None:
        """Stop a spawned server nobody claimed (no-op after :meth:`ready`)."""
        self._done = True
        spawned, self._spawned = self._spawned, None
        if spawned is not None:
            spawned[0].stop()


def _source(prefer: Prefer) -> Literal["external", "binary", "embedded"]:
    """Which kind of server ``prefer`` leads to here (see the module docstring).

    Raises ``ToxiproxyUnavailable`` as :func:`launch` does for a bad setting.
    """
    url = os.environ.get(ENV_URL, "").strip()
    if prefer == "external" or (prefer == "auto" and url):
        return "external"
    if prefer == "binary" or (prefer == "auto" and (_configured_binary() or shutil.which(BINARY))):
        return "binary"
    return "embedded"


def _find_or_start(prefer: Prefer, host: str) -> ServerLease:
    url = os.environ.get(ENV_URL, "").strip()
    if prefer == "external" or (prefer == "auto" and url):
        if not url:
            raise ToxiproxyUnavailable(f"{ENV_URL} is not set")
        return _external(url)
    if prefer in ("auto", "binary"):
        binary = _configured_binary() or shutil.which(BINARY)
        if binary:
            return start_binary(binary, host)
        if prefer == "binary":
            raise ToxiproxyUnavailable(f"{ENV_SERVER} is not set and no {BINARY} binary on PATH")
    lease, port_file, what = _spawn_embedded(host)
    try:
        _wait_ready(lease, port_file, what)
    except BaseException:
        lease.stop()
        raise
    return lease


def launch(prefer: Prefer = "auto", *, host: str = "127.0.0.1") -> ServerLease:
    """Find or start a toxiproxy server; see the module docstring for the order.

    Raises ``ToxiproxyUnavailable`` naming the env var or binary that failed.
    """
    return _find_or_start(prefer, host)


def _configured_binary() -> str | None:
    """The binary ``TOXIPROXY_SERVER`` names, or None when it is unset.

    Raises ``ToxiproxyUnavailable`` naming the variable when it is set to
    something that cannot be run: a run that asked for the real server must
    not quietly use the embedded one.
    """
    value = os.environ.get(ENV_SERVER, "").strip()
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ToxiproxyUnavailable(
            f"{ENV_SERVER}={value!r} is not an executable file; point it at a "
            f"{BINARY} binary or unset it to use the embedded server"
        )
    return str(path.resolve())


def requested() -> bool:
    """True when the environment asks for a particular server (URL or binary)."""
    return bool(os.environ.get(ENV_URL, "").strip() or os.environ.get(ENV_SERVER, "").strip())
