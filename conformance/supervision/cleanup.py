"""Cleanups a family needs between suite tests and at the end of the session.

The plugin knows no family's harness, so a family registers what must run
after every suite test (p2p: releasing the ZeroMQ contexts closed transports
left open) or when the session ends (p2p: stopping the pool of node
processes) when its module is imported; the plugin runs them at those
points. A cleanup whose module was never imported has nothing to clean, so
registering at import is enough.

Cleanups run in registration order; one that raises stops the ones after it
and the error propagates, as it would from a direct call.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["after_each_test", "at_session_end", "session_ended", "test_ended"]

_AFTER_TEST: list[Callable[[], object]] = []
_AT_SESSION_END: list[Callable[[], object]] = []


def after_each_test(cleanup: Callable[[], object]) -> Callable[[], object]:
    """Run ``cleanup`` after every suite test (once, however often registered)."""
    if cleanup not in _AFTER_TEST:
        _AFTER_TEST.append(cleanup)
    return cleanup


def at_session_end(cleanup: Callable[[], object]) -> Callable[[], object]:
    """Run ``cleanup`` when the pytest session ends (once, however often registered)."""
    if cleanup not in _AT_SESSION_END:
        _AT_SESSION_END.append(cleanup)
    return cleanup


def test_ended() -> None:
    """Run the after-each-test cleanups (the plugin calls this)."""
    for cleanup in list(_AFTER_TEST):
        cleanup()


def session_ended() -> None:
    """Run the session-end cleanups (the plugin calls this)."""
    for cleanup in list(_AT_SESSION_END):
        cleanup()
