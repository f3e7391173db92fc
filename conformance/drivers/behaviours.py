"""Standard behaviours: what a driver runs where the Python interface passes a callable.

A driver cannot receive a Python function. Where a suite hands the
implementation a callable (the control suite's request handlers), it hands
it a :class:`StandardHandler` instead. That is an ordinary callable for a
Python implementation. For a driver it carries the *name* of a behaviour
that ``docs/drivers.md`` writes out, and a ``record`` hook through which
the bridge feeds the requests the driver logged back into the suite's own
log. The behaviours themselves belong to their family (the control
handlers: ``conformance/contracts/control/driver.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Request", "StandardHandler"]

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
