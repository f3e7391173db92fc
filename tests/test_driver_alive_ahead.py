"""``alive_all`` sent ahead to the other driver transports (docs/drivers.md, section 5).

Reading ``alive`` of one node's connections sends ``alive_all`` to the other
live driver nodes before waiting for its own reply, and their next read takes
that reply instead of a round trip of its own. These tests check that the
values are the implementation's (a connection marked dead reads ``False``),
that a reply made stale by another request, or older than the freshness
bound, is not used, and that the request stream stays in step either way.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance import contracts
from conformance.contracts.p2p import driver as p2p_driver
from conformance.contracts.p2p.harness import Cluster, Connection, handshake
from conformance.drivers import driver_spec, shutdown
from conformance.drivers.process import NOT_COLLECTED

PYTHON_DRIVER = (f"{shlex.quote(sys.executable)} -m conformance.drivers.python "
                 "reference_impl:ZmqTransport")


@pytest.fixture(autouse=True)
def _no_driver_left() -> Iterator[None]:
    yield
    shutdown()


@pytest.fixture
def pair() -> Iterator[tuple[Connection, Connection]]:
    with Cluster(driver_spec(contracts.get("p2p"), PYTHON_DRIVER)) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        yield handshake(a, b)


def _calls(conn: Connection) -> int:
    return int(conn.raw._process.calls)


def _forget(*conns: Connection) -> None:
    """Drop the ``alive`` values read so far, so the next read asks the driver."""
    for conn in conns:
        conn.raw._alive_read = None


def test_the_other_node_reads_the_reply_sent_ahead(pair: tuple[Connection, Connection]
                                                   ) -> None:
    out, inbound = pair
    inbound.mark_dead()
    _forget(out, inbound)
    before = _calls(inbound)
    assert out.alive is True  # reads a's connections, and sends ahead to b
    assert _calls(inbound) == before + 1  # the request sent ahead
    assert inbound.raw._transport._ahead is not None
    assert inbound.alive is False  # b's value, taken from that reply: no new request
    assert _calls(inbound) == before + 1
    assert inbound.raw._transport._ahead is None


def test_a_reply_made_stale_is_not_used_and_the_stream_stays_in_step(
    pair: tuple[Connection, Connection],
) -> None:
    out, inbound = pair
    _forget(out, inbound)
    assert out.alive is True
    ahead = inbound.raw._transport._ahead
    assert ahead is not None
    inbound.mark_dead()  # another request to b: the reply sent ahead is stale now
    assert inbound.raw._process.collect(ahead[0], what="test") is NOT_COLLECTED
    assert inbound.alive is False  # asked again: the value after mark_dead()
    _forget(out)
    assert out.alive is True  # both streams still answer in step


def test_a_reply_older_than_the_bound_is_not_used(pair: tuple[Connection, Connection]
                                                  ) -> None:
    out, inbound = pair
    _forget(out, inbound)
    assert out.alive is True
    assert inbound.raw._transport._ahead is not None
    before = _calls(inbound)
    time.sleep(p2p_driver.ALIVE_FRESH_S * 1.5)  # the bound itself is what is tested
    assert inbound.alive is True
    assert _calls(inbound) > before  # a fresh request, not the old reply


def test_a_driver_runs_in_the_suites_session_and_its_own_process_group(
    pair: tuple[Connection, Connection],
) -> None:
    """Where the kernel schedules by session (autogroup), a driver shares the suite's
    CPU share, as an in-process implementation does, and the host-stall meter (a
    child of the suite, in its session) samples the share the driver runs in. Its own
    process group is what the end kills."""
    out, _ = pair
    pid = out.raw.pid
    assert os.getsid(pid) == os.getsid(0)
    assert os.getpgid(pid) == pid != os.getpgid(0)
    mine, theirs = Path("/proc/self/autogroup"), Path(f"/proc/{pid}/autogroup")
    if mine.exists() and theirs.exists():
        assert theirs.read_text().split()[0] == mine.read_text().split()[0]
