"""The run's pytest process: ``python -m conformance.supervision.pytest_process ARGS``.

It is ``python -m pytest ARGS`` except at the end: once pytest has returned,
the process flushes its output, joins its remaining non-daemon threads and
runs its ``atexit`` handlers (where the suite stops its host-stall meter,
fault proxies and drivers), then leaves with ``os._exit``. The interpreter's
finalization (freeing every module and object of a session that imported
pytest, Hypothesis, pyzmq and the suite) is skipped: on 2 cores it took
0.27-0.33 s at the end of every run, after the report was written, with
nothing left to do but free memory the kernel frees anyway.

The CLI starts this module, never a user's own ``pytest``: a session started
any other way ends as pytest ends it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn

import pytest


def main() -> NoReturn:
    code = int(pytest.main(sys.argv[1:]))
    _flush()
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    _flush()
    os._exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or broken: nothing to lose
            stream.flush()


if __name__ == "__main__":
    main()
