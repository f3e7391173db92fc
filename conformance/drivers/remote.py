"""What every proxy object shares: a handle in a driver process, and error kinds as exceptions.

A proxy forwards each call of its family's duck-typed interface to the
object behind ``handle`` in its :class:`~conformance.drivers.process.DriverProcess`.
An error reply is raised as the exception that family's contract names for
its kind (``docs/drivers.md``, section 4), so the clauses judge a driver
exactly as they judge a Python implementation's own exceptions. The
driver's message is kept, and a note names the kind.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

import zmq

from conformance.drivers import process as processes
from conformance.drivers.process import DriverCrashed, DriverProcess, DriverReplyError

__all__ = ["ErrorTable", "Remote", "build", "signature", "to_exception"]

#: kind -> the exception to raise, from the driver's message and its error map.
ErrorTable = Mapping[str, Callable[[str, Mapping[str, Any]], Exception]]


def _address_in_use(message: str, error: Mapping[str, Any]) -> Exception:
    return zmq.ZMQError(zmq.EADDRINUSE, message or "Address already in use")


#: What every contract's kinds become unless its table says otherwise.
COMMON: ErrorTable = {
    "address_in_use": _address_in_use,
    "invalid": lambda message, error: ValueError(message),
    "too_large": lambda message, error: ValueError(message),
    "timeout": lambda message, error: TimeoutError(message),
    "unsupported": lambda message, error: NotImplementedError(message),
}


def to_exception(error: DriverReplyError, table: ErrorTable) -> Exception:
    """The exception ``error`` stands for under ``table`` (then :data:`COMMON`)."""
    make = table.get(error.kind) or COMMON.get(error.kind)
    exc = make(error.message, error.error) if make is not None else RuntimeError(error.message)
    exc.add_note(f"(the driver's error kind: {error.kind!r})")
    return exc


def signature(positional: Iterable[str], keywords: Iterable[str],
              defaults: Mapping[str, Any] | None = None) -> inspect.Signature:
    """The signature a proxy factory shows the suite: what the real factory would take.

    The suite reads factories' signatures to decide which settings to pass
    (``accepts()``): the driver's declared ``options`` become keyword-only
    parameters, and nothing else does.
    """
    given = defaults or {}
    params = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
              for name in positional]
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY,
                                 default=given.get(name, None))
               for name in dict.fromkeys(keywords)]
    return inspect.Signature(params)


class Remote:
    """An object behind ``handle`` in ``process``; ``name`` is how reports call it."""

    #: How this object's error kinds become exceptions (a subclass's table).
    errors: ClassVar[ErrorTable] = {}

    def __init__(self, process: DriverProcess, handle: int, name: str) -> None:
        self._process = process
        self._handle = handle
        self._name = name
        #: The object was closed cleanly and its process went back to the pool.
        self._released = False
        #: The process's threads before this object (or the one it belongs to) was built.
        self._threads_before = dict(process.threads_before_object)
        #: How long the implementation spent in the last call, as the driver measured
        #: it around the call (``None``: the driver does not say). Clauses that bound
        #: how long a call takes its caller (EVT-3) judge this, not the protocol's
        #: crossing time.
        self.last_call_seconds: float | None = None

    def _call(self, call: str, args: Mapping[str, Any] | None = None, *,
              limit: float | None = None) -> Any:
        self.last_call_seconds = None
        try:
            return self._process.call(self._handle, call, args or {},
                                      what=f"{call}() on {self._name}", limit=limit)
        except DriverReplyError as error:
            raise to_exception(error, self.errors) from None
        finally:
            self.last_call_seconds = self._process.last_elapsed()

    def _closing(self, call: str, args: Mapping[str, Any] | None = None, *,
                 limit: float | None = None) -> Any:
        """The call that ends this object's life: the process is free again afterwards.

        A process the test paused or killed has nobody to answer: it is
        ended instead. A close that fails leaves the process to
        :func:`~conformance.drivers.process.end_test`.
        """
        if self._released:
            return self._call(call, args, limit=limit)
        if self._process.signalled in ("SIGKILL", "SIGSTOP"):
            self._released = True
            processes.discard(self._process)
            return None
        result = self._call(call, args, limit=limit)
        self._released = True
        processes.release(self._process)
        return result

    # -- what the implementation left in its process -------------------------------------

    def threads_left(self) -> list[str]:
        """The threads of the driver process that were not there before this object was
        built, as ``"name (tid N)"``: after a close, what the implementation left running
        (PIPE-6 judges these where, in-process, it judges the test process's threads)."""
        now = self._process.threads()
        return [f"{name} (tid {tid})" for tid, name in sorted(now.items())
                if tid not in self._threads_before]

    def driver_log(self) -> str:
        """Everything the driver process wrote on stderr (its log), up to its last MiB: the
        implementation's own logs, which a clause about secrets reads (PIPE-13)."""
        return self._process.log_text()

    # -- process faults (the PROC clauses signal the driver's process) -----------------

    @property
    def pid(self) -> int:
        return self._process.pid

    def state(self) -> str:
        """``running``, ``stopped`` or ``dead``."""
        return self._process.state()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._name}>"


def build(command: str, contract: str, constructor: str, args: Mapping[str, Any],
          errors: ErrorTable, what: str) -> tuple[DriverProcess, Any]:
    """Run ``constructor`` in a driver process; return the process and its result.

    An error reply (the constructor refused, e.g. ``address_in_use``) leaves
    the process clean, so it goes back to the pool. Anything else ends it.
    """
    process = processes.acquire(command, contract)
    process.threads_before_object = process.threads()
    try:
        result = process.call(0, constructor, args, what=what)
    except DriverReplyError as error:
        processes.release(process)
        raise to_exception(error, errors) from None
    except BaseException:
        processes.discard(process)
        raise
    if not isinstance(result, dict) or not isinstance(result.get("handle"), int):
        processes.discard(process)
        raise DriverCrashed(f"{what}: {process.label} broke the protocol: the constructor "
                            f"answered {result!r}, not a map with an integer 'handle'")
    return process, result
