"""Where a driver process runs (docs/drivers.md, section 1): the suite's session, a
process group of its own.

Where the kernel schedules by session (autogroup), a driver then shares the
suite's CPU share, as an in-process implementation does, and the host-stall
meter (a child of the suite, in its session) samples the scheduling group the
driver runs in. Its own process group is what the suite's end kills.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance import contracts
from conformance.drivers import driver_spec, shutdown
from conformance.testing.net import free_port

PYTHON_DRIVER = (f"{shlex.quote(sys.executable)} -m conformance.drivers.python "
                 "reference_impl:ZmqTransport")


@pytest.fixture(autouse=True)
def _no_driver_left() -> Iterator[None]:
    yield
    shutdown()


def test_a_driver_runs_in_the_suites_session_and_its_own_process_group() -> None:
    spec = driver_spec(contracts.get("p2p"), PYTHON_DRIVER)
    port = free_port()
    node = spec.build(f"127.0.0.1:{port}", "127.0.0.1", port)
    try:
        pid = node.pid
        assert os.getsid(pid) == os.getsid(0)
        assert os.getpgid(pid) == pid != os.getpgid(0)
        # Where autogroup is compiled in but off (or the file is hidden), the
        # file reads empty: there is no scheduling group to compare then.
        mine, theirs = _autogroup("self"), _autogroup(str(pid))
        if mine and theirs:
            assert theirs == mine
    finally:
        node.close()


def _autogroup(pid: str) -> str:
    """The scheduling group a process is in ("/autogroup-N"), or "" where the
    kernel shows none."""
    try:
        fields = Path(f"/proc/{pid}/autogroup").read_text().split()
    except OSError:
        return ""
    return fields[0] if fields else ""
