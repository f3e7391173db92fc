"""Exceptions the suite raises about itself, the user's setup, or a hung call."""

from __future__ import annotations


class ConfigError(Exception):
    """A user configuration problem (bad ``MODULE:ATTR``, capability, option).

    The message is one line that names the option at fault; the CLI prints it
    and exits with status 2, the plugin turns it into a usage error.
    """


class CallBlocked(AssertionError):
    """A call into the implementation did not return within the watchdog limit.

    Reported as the verdict ``blocked`` for the clauses of the test that made
    the call, never as a hung run. It subclasses ``AssertionError`` so that
    Hypothesis treats it as a test failure and shrinks towards it.
    """

    def __init__(self, call: str, seconds: float) -> None:
        super().__init__(f"{call} blocked for {seconds:.1f} s (watchdog)")
        self.call = call
        self.seconds = seconds
