"""Standard behaviours: what a driver runs where the Python interface passes a callable.

A driver cannot receive a Python function. Where a suite hands the
implementation a callable (the control suite's request handlers), it hands
it a :class:`StandardHandler` instead. That is an ordinary callable for a
Python implementation. For a driver it carries the *name* of a behaviour
that ``docs/drivers.md`` (section 7) writes out, and a ``record`` hook
through which the bridge feeds the requests the driver logged back into the
suite's own log.

:func:`python_handler` is each behaviour written for the Python driver,
the executable form of that table.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["CONTROL_BEHAVIOURS", "StandardHandler", "python_handler"]

#: The control handlers' behaviour names (``docs/drivers.md``, section 7).
CONTROL_BEHAVIOURS: Final = ("echo", "slow", "raise", "bad_reply", "register")

Request = dict[str, Any]


@dataclass(frozen=True)
class StandardHandler:
    """A suite handler that a driver can run by name.

    Calling it runs ``run`` (in-process implementations). ``record`` notes a
    request in the suite's log without running the handler, for requests a
    driver ran on its side.
    """

    behaviour: str
    run: Callable[[Request], Any]
    record: Callable[[Request], None]

    def __call__(self, request: Request) -> Any:
        return self.run(request)


class HandlerRaised(RuntimeError):
    """What the ``raise`` behaviour raises in the Python driver."""


def python_handler(behaviour: str, log: Callable[[Request], None]) -> Callable[[Request], Any]:
    """The handler ``behaviour`` names, logging each request it runs through ``log``."""
    if behaviour == "echo":
        def echo(request: Request) -> Any:
            log(request)
            return {"nonce": request.get("nonce"), "data": request.get("data")}
        return echo
    if behaviour == "slow":
        def slow(request: Request) -> Any:
            log(request)
            time.sleep(float(request.get("ms", 0) or 0) / 1000)
            return {"nonce": request.get("nonce"), "slept_ms": request.get("ms")}
        return slow
    if behaviour == "raise":
        def fail(request: Request) -> Any:
            log(request)
            raise HandlerRaised("the standard 'raise' behaviour raised on purpose (CTL-3)")
        return fail
    if behaviour == "bad_reply":
        def bad(request: Request) -> Any:
            log(request)
            return ["not", "a", "dict"]
        return bad
    if behaviour == "register":
        def register(request: Request) -> Any:
            log(request)
            return {"registered": True}
        return register
    raise ValueError(f"unknown standard behaviour {behaviour!r}; known: "
                     f"{', '.join(CONTROL_BEHAVIOURS)}")
