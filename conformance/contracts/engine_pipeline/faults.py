"""The process faults the suite puts on an engine (or client) process, one mechanism for
the engine host the suite starts itself and for a driver process.

A process class supplies its ``name``, ``pid``, ``faults`` list, ``running`` and
``exit_status(timeout_s)``, and two primitives: :meth:`~ProcessFaults._signal`
and :meth:`~ProcessFaults._stopped` (the kernel reports it stopped). Each fault
is recorded as a :class:`chaos.process_faults.ProcessFault` whose ``in_place_at``
is when the fault really holds (the process reaped, or stopped), since the
clauses' bounds count from then.
"""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chaos.process_faults import ProcessFault

__all__ = ["ProcessFaults"]

#: How long a SIGSTOP may take to be reported by the kernel before the fault is
#: recorded anyway.
_STOP_WAIT_S = 5.0


class ProcessFaults:
    """SIGKILL, SIGSTOP/SIGCONT and SIGTERM, each recorded in ``self.faults``."""

    name: str
    faults: list[ProcessFault]

    @property
    def pid(self) -> int:
        raise NotImplementedError

    @property
    def running(self) -> bool:
        raise NotImplementedError

    def exit_status(self, timeout_s: float) -> int | None:
        raise NotImplementedError

    def _signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the process (nothing if it is gone)."""
        raise NotImplementedError

    def _stopped(self) -> bool:
        """Whether the kernel reports the process stopped (or gone)."""
        raise NotImplementedError

    def _fault(self, kind: Any, started: float) -> ProcessFault:
        # Imported here: the Python driver loads this module and needs no chaos code.
        from chaos.process_faults import ProcessFault

        fault = ProcessFault(kind, self.name, self.pid, started, time.monotonic())
        self.faults.append(fault)
        return fault

    def kill(self) -> ProcessFault:
        """SIGKILL; ``in_place_at`` is when the process is gone (reaped)."""
        started = time.monotonic()
        self._signal(signal.SIGKILL)
        self.exit_status(10)
        return self._fault("kill", started)

    def pause(self) -> ProcessFault:
        """SIGSTOP; ``in_place_at`` is when the kernel reports the process stopped."""
        started = time.monotonic()
        self._signal(signal.SIGSTOP)
        deadline = time.monotonic() + _STOP_WAIT_S
        while not self._stopped() and time.monotonic() < deadline:
            time.sleep(0.002)
        return self._fault("pause", started)

    def resume(self) -> None:
        if self.running:
            self._signal(signal.SIGCONT)
        for fault in self.faults:
            if fault.kind == "pause" and fault.active:
                fault.ended_at = time.monotonic()

    def terminate(self) -> float:
        """SIGTERM; returns when it was sent."""
        sent = time.monotonic()
        if self.running:
            self._signal(signal.SIGTERM)
        return sent
