"""Exceptions the suite raises about itself, the user's setup, or a hung call."""

from __future__ import annotations

from _pytest.outcomes import Skipped  # pytest.skip.Exception, by its importable name


class ConfigError(Exception):
    """A user configuration problem (bad ``MODULE:ATTR``, capability, option).

    The message is one line that names the option at fault; the CLI prints it
    and exits with status 2, the plugin turns it into a usage error.
    """


class CallBlocked(AssertionError):
    """A call into the implementation did not return within the watchdog limit.

    Reported as the verdict ``blocked`` for the clauses of the test that made
    the call, never as a hung run. ``call`` and ``seconds`` always name a call
    that overran its *full* limit; ``then`` describes a later call that only
    overran the shortened limit of a test that had already blocked. It
    subclasses ``AssertionError`` so that Hypothesis treats it as a test
    failure and shrinks towards it.
    """

    def __init__(self, call: str, seconds: float, *, then: str | None = None) -> None:
        message = f"{call} blocked for {seconds:.1f} s (watchdog)"
        if then is not None:
            message += f"; {then}"
        super().__init__(message)
        self.call = call
        self.seconds = seconds
        #: A later call of the same test that overran only the cut limit left after this
        #: block (:data:`conformance.supervision.watchdog.AFTER_BLOCK_LIMIT_S`): context,
        #: never evidence of its own.
        self.then = then


#: How every run error's skip reason starts (the reports and the exit status find them by it).
RUN_ERROR_PREFIX = "Run error, not a verdict on the implementation"


class RunError(Skipped):
    """The suite's own infrastructure failed (a fault proxy died, a peer could not send,
    a node never started within its start-up bound): no verdict on the implementation.

    It is a pytest skip (so the test's clauses are skipped with this reason,
    never ``failed`` or ``blocked``) and therefore a ``BaseException``: no
    ``except Exception`` in a harness or a machine can turn it into a clause
    violation, and Hypothesis re-raises it at once instead of shrinking. The
    CLI exits with status 3 when a run had one (see
    :func:`conformance.reporting.verdicts.exit_status`).
    """

    def __init__(self, message: str) -> None:
        super().__init__(msg=f"{RUN_ERROR_PREFIX}: {message.rstrip('.')}.", pytrace=False)
        self.detail = message


def is_run_error(reason: str | None) -> bool:
    """Whether a skip reason is a :class:`RunError`'s."""
    return bool(reason) and str(reason).startswith(RUN_ERROR_PREFIX)
