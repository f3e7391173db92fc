"""A watchdog for calls into the implementation under test.

Every call the suite makes into a transport (the factory, ``connect``,
``poll``, ``send``, ``recv``, ``mark_dead``, ``close``) runs inside
:func:`guard`. If the call has not returned after its limit, the guard raises
:class:`~conformance.errors.CallBlocked` *inside* the call, so a transport
that blocks (a DEALER ``send()`` past the high-water mark, a ``poll()`` that
never drains, a hung ``close()``) turns into a ``blocked`` verdict instead of
a hung test run.

Mechanism: ``signal.setitimer(ITIMER_REAL)`` and a ``SIGALRM`` handler that
raises. Python runs signal handlers in the main thread between bytecodes and
whenever a blocking system call returns ``EINTR``; pyzmq's blocking calls
check for signals on ``EINTR`` before retrying, and ``time.sleep`` does too,
so the exception surfaces even out of a blocking ``zmq_send``.

Once a call has blocked, the test's verdict is ``blocked``; Hypothesis then
shrinks, re-running examples that each block again. So after a block, and
until :func:`new_test`, every guard's limit is cut to
:data:`AFTER_BLOCK_LIMIT_S`: the verdict stands on the full-limit block,
and shrinking costs a fraction of a second per example instead of the limit.
A call that overruns only the cut limit is no evidence of its own (a correct
node's factory or a round trip to a node process takes longer than 0.2 s on
a loaded host): the :class:`CallBlocked` it raises names the test's first
full-limit block as the call that blocked, and the later call only as
``then`` (see ``docs/load-verdicts.md``).

A limit counts only time the host let processes run: when a guard's deadline
passes, the host stall measured since the call started
(:mod:`conformance.supervision.host_stall`, running once :func:`new_test` has
run), or the calling thread's own wait in the run queue if that is longer, is
added to its deadline, and the call is interrupted only when it has overrun
its limit *plus* that stall. A call that really blocks still blocks,
just later; a call that a host stalled for seconds is not ``blocked``. Guards nest:
the earliest deadline of all open guards is armed, and the call named in the
exception is the one whose own limit ran out. A timer someone else had armed
(``pytest-timeout``'s signal method, for instance) is restored, minus the time
spent, when the outermost guard exits.

Limits: signals only reach the main thread, so off the main thread (or on a
platform without ``setitimer``) :func:`guard` does nothing. A call stuck in C
code that retries ``EINTR`` without checking for signals cannot be
interrupted this way; pyzmq and the standard library do check.
"""

from __future__ import annotations

import importlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any, Literal, ParamSpec, TypeVar

from conformance.errors import CallBlocked
from conformance.supervision import host_stall

__all__ = [
    "AFTER_BLOCK_LIMIT_S", "active", "call", "default_limit", "guard", "new_test", "note_block",
    "progress",
    "set_block_hook", "set_default_limit", "set_progress_hook", "suspended",
]

P = ParamSpec("P")
T = TypeVar("T")

#: A call into a transport that takes longer than this is "blocked". Generous:
#: nothing in the contract legitimately takes more than a fraction of it.
_DEFAULT_LIMIT_S = 5.0
#: The limit of every call once one has blocked in the same test.
AFTER_BLOCK_LIMIT_S = 0.2
#: Shortest timer ever armed (setitimer treats 0 as "disarm").
_MIN_TIMER_S = 1e-4
#: Host stall below this is not credited to a guard (the meter's resolution).
_MIN_CREDIT_S = 0.02
#: How often a guard re-reads the calling thread's run-queue wait (one ``/proc`` read).
_QUEUE_SAMPLE_S = 0.1
#: (when, run-queue wait in ns) of the main thread's last sample; (-inf, -1) before any.
_queue_sample: tuple[float, int] = (float("-inf"), -1)

_default_limit_s = _DEFAULT_LIMIT_S
_HAS_TIMER = hasattr(signal, "setitimer")
_SIGALRM = int(getattr(signal, "SIGALRM", 14))
#: The C ``signal()`` that :func:`signal.signal` wraps: the wrapper converts handlers to
#: and from enums in Python, 40 % of a guarded call's cost.
_set_handler: Callable[[int, Any], Any] = importlib.import_module("_signal").signal
_SIG_DFL = int(signal.SIG_DFL)


@dataclass
class _Guard:
    call: str
    limit: float
    deadline: float
    #: The limit the caller asked for (``limit`` is less once the test has blocked).
    full_limit: float
    started: float = 0.0
    #: Host stall already added to ``deadline`` (seconds).
    credited: float = 0.0
    fired: bool = False
    #: The calling thread's run-queue wait (ns) at most :data:`_QUEUE_SAMPLE_S` before
    #: the call started (-1: unknown).
    queued_base: int = -1


_stack: list[_Guard] = []
#: How many guards at the bottom of the stack a :func:`suspended` section has frozen.
_frozen = 0
_saved_handler: Any = None
_saved_timer: tuple[float, float] = (0.0, 0.0)
_saved_at = 0.0
_progress: Callable[[], None] | None = None
_blocked_in_test = False
#: The call and limit of the test's first full-limit block (``None``: none yet, or the
#: test's verdict was decided by :func:`note_block` without one).
_first_block: tuple[str, float] | None = None
_on_block: Callable[[], None] | None = None


def default_limit() -> float:
    """The limit, in seconds, that :func:`guard` uses when none is given."""
    return _default_limit_s


def set_default_limit(seconds: float) -> None:
    """Change the default limit (e.g. from a command-line option)."""
    global _default_limit_s
    if not seconds > 0:
        raise ValueError(f"watchdog limit must be positive, got {seconds!r}")
    _default_limit_s = float(seconds)


def set_progress_hook(hook: Callable[[], None] | None) -> None:
    """Call ``hook`` whenever a guarded call starts (``None``: stop).

    Each call into the transport is evidence that the test is not hung; the
    stall deadline of :mod:`conformance.supervision.postmortem` is pushed back by it.
    """
    global _progress
    _progress = hook


def progress() -> None:
    """The suite itself is making progress (waiting for a reply that may never come, driving
    a poll loop): push the stall deadline back, exactly as a guarded call does.

    The stall deadline exists for calls into the implementation that never
    return; the suite's own bounded waits are not hangs, and a test that
    waits on a silent peer must end with its own verdict ("no reply"), not
    ``blocked``.
    """
    if _progress is not None:
        _progress()


def set_block_hook(hook: Callable[[], None] | None) -> None:
    """Call ``hook`` when a call blocks for the first time in a test (``None``: stop)."""
    global _on_block
    _on_block = hook


def new_test() -> None:
    """A test starts: limits are whole again (see the module docstring), and the host-stall
    meter runs (started here, before the test takes any resource snapshot)."""
    global _blocked_in_test, _first_block
    host_stall.start()
    _blocked_in_test = False
    _first_block = None


def note_block() -> None:
    """A call ended in a way that decides the test's verdict without a guard firing (a
    driver process that crashed): cut later limits and run the block hook, as a fired
    guard does, so shrinking an example that fails the same way every time stays cheap."""
    global _blocked_in_test
    if not _blocked_in_test and _on_block is not None:
        _on_block()
    _blocked_in_test = True


def active() -> bool:
    """True when guards in this thread can interrupt a call (main thread, Unix)."""
    return _HAS_TIMER and threading.current_thread() is threading.main_thread()


def guard(call: str, limit: float | None = None) -> _Guarded:
    """Run the body with a watchdog; raise ``CallBlocked(call, limit)`` if it overruns.

    ``call`` names the call in the verdict, e.g. ``"send() on 127.0.0.1:4000"``.
    ``limit`` defaults to :func:`default_limit`. Outside the main thread the
    body runs unguarded.
    """
    return _Guarded(call, _default_limit_s if limit is None else float(limit))


class _Guarded:
    """The context manager :func:`guard` returns (a class, not a generator: every call
    into the implementation goes through one, thousands per test)."""

    __slots__ = ("_call", "_entry", "_full")

    def __init__(self, call: str, full: float) -> None:
        if not full > 0:
            raise ValueError(f"watchdog limit must be positive, got {full!r}")
        self._call = call
        self._full = full
        self._entry: _Guard | None = None

    def __enter__(self) -> None:
        full = self._full
        seconds = min(full, AFTER_BLOCK_LIMIT_S) if _blocked_in_test else full
        if _progress is not None:
            _progress()
        if not active():
            return
        now = time.monotonic()
        if now - _queue_sample[0] >= _QUEUE_SAMPLE_S:
            _sample_queue(now)
        entry = _Guard(self._call, seconds, now + seconds, full, started=now,
                       queued_base=_queue_sample[1])
        if not _stack:
            _install()
        _stack.append(entry)
        self._entry = entry
        _arm()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        entry, self._entry = self._entry, None
        if entry is not None:
            _stack.remove(entry)
            if _stack:
                _arm()
            else:
                _uninstall()
        return False


def call(what: str, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` under :func:`guard` with the default limit."""
    with _Guarded(what, _default_limit_s):
        return fn(*args, **kwargs)


def _install() -> None:
    global _saved_handler, _saved_timer, _saved_at
    _saved_handler = _set_handler(_SIGALRM, _on_alarm)
    _saved_timer = signal.setitimer(signal.ITIMER_REAL, 0)
    _saved_at = time.monotonic()


def _uninstall() -> None:
    signal.setitimer(signal.ITIMER_REAL, 0)
    _set_handler(_SIGALRM, _saved_handler if _saved_handler is not None else _SIG_DFL)
    delay, interval = _saved_timer
    if delay > 0:
        remaining = delay - (time.monotonic() - _saved_at)
        signal.setitimer(signal.ITIMER_REAL, max(remaining, _MIN_TIMER_S), interval)


def _arm() -> None:
    pending = [g.deadline for g in _stack[_frozen:] if not g.fired]
    if not pending:
        signal.setitimer(signal.ITIMER_REAL, 0)
        return
    signal.setitimer(signal.ITIMER_REAL, max(min(pending) - time.monotonic(), _MIN_TIMER_S))


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    now = time.monotonic()
    expired = [g for g in _stack[_frozen:] if not g.fired and g.deadline <= now]
    if not expired:
        # Early or stale alarm: re-arm for whatever is still pending.
        _arm()
        return
    victim = min(expired, key=lambda g: g.deadline)
    if _credit_host_stall(victim):
        _arm()
        return
    victim.fired = True
    global _blocked_in_test, _first_block
    if victim.limit < victim.full_limit:
        # Only the cut limit ran out: the verdict stays the first block's.
        then = (f"then {victim.call} overran the {victim.limit:.1f} s left to every later "
                f"call of this test (its own limit is {victim.full_limit:.1f} s), which is no "
                "verdict of its own")
        if _first_block is None:
            raise CallBlocked(victim.call, victim.limit,
                              then="only the limit left after an earlier failure of this "
                              "test decided its verdict")
        raise CallBlocked(*_first_block, then=then)
    if not _blocked_in_test and _on_block is not None:
        _on_block()
    _blocked_in_test = True
    if _first_block is None:
        _first_block = (victim.call, victim.limit)
    raise CallBlocked(victim.call, victim.limit)


def _credit_host_stall(entry: _Guard) -> bool:
    """Move ``entry``'s deadline on by the host stall measured since it started and not
    credited yet; True when that leaves it time (the limit counts only time the host let
    processes run, so a loaded host never turns a slow call into ``blocked``).

    The stall is the larger of two measures: the meter's (:mod:`.host_stall`), and the
    calling thread's own wait in the run queue since (at most :data:`_QUEUE_SAMPLE_S`
    before) the call began. The meter sleeps between samples, so a busy host wakes it
    promptly while a computing thread waits its turn: at load 22 a correct
    ``send()`` was reported blocked for 2 s with the meter's stall under that. A
    thread blocked in a call is not runnable, so its queue wait does not grow while
    it blocks: a call that really blocks still runs out.
    """
    stolen = host_stall.stolen_ms(entry.started) / 1000 if host_stall.running() else 0.0
    if entry.queued_base >= 0:
        queued = _thread_queue_ns()
        if queued >= 0:
            stolen = max(stolen, (queued - entry.queued_base) / 1e9)
    extra = stolen - entry.credited
    if extra < _MIN_CREDIT_S:
        return False
    entry.credited = stolen
    entry.deadline += extra
    return entry.deadline > time.monotonic()


def _thread_queue_ns() -> int:
    """The calling thread's total run-queue wait in ns (-1 where ``/proc`` has none)."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as stat:
            return int(stat.read().split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _sample_queue(now: float) -> None:
    global _queue_sample
    _queue_sample = (now, _thread_queue_ns())


@contextmanager
def suspended() -> Iterator[None]:
    """Inside, the guards already open do not run: time the suite spends on its own
    infrastructure (starting a node process: an interpreter, its imports) is not
    time of the implementation's call, whose guard is around it.

    The open guards' deadlines move on by the time spent inside, so each still
    allows its whole limit to the implementation's own work. Guards opened
    inside run as usual. The caller bounds the section itself (e.g. the
    process nodes' start-up bound) and reports an overrun as a run error;
    :func:`progress` is called on entry and exit, so the stall deadline of
    :mod:`conformance.supervision.postmortem` does not count the wait either
    as long as the caller calls :func:`progress` while it waits.
    """
    global _frozen
    progress()
    if not active():
        yield
        return
    saved, started = _frozen, time.monotonic()
    _frozen = len(_stack)
    _arm()
    try:
        yield
    finally:
        spent = time.monotonic() - started
        # The host's stalls inside are part of ``spent``: never credit them a second time.
        stolen = host_stall.stolen_ms(started) / 1000 if host_stall.running() else 0.0
        for entry in _stack[saved:_frozen]:
            entry.deadline += spent
            entry.credited += stolen
        _frozen = saved
        if _stack:
            _arm()
        progress()
