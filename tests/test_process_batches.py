"""Announced calls of process nodes (gate-rtrips): a machine step in one round trip.

The process machine tells a node which ``recv()`` calls follow a poll that
returns no new connection (:meth:`ProcessTransport.drain_after_poll`) and
which ``alive`` reads its invariant makes (:meth:`ProcessTransport.read_alive_ahead`);
the node runs them at once, each under its own guard. What is checked here:
the answers are those of the same calls made one by one, none is dropped or
handed to another call, an ``alive`` read ahead never outlives another call
to the node, and a failing call stops the batch where the harness would stop.
Real nodes over real TCP, except the batch loop's stop rule (pure logic).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import pytest

from conformance.contracts.p2p import _node_worker
from conformance.contracts.p2p.harness import Cluster, Connection, Node, handshake, wait_until
from conformance.contracts.p2p.process_nodes import ProcessTransport, process_spec
from conformance.contracts.p2p.spec import TransportSpec, spec_from_path


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    spec: TransportSpec = process_spec(spec_from_path("reference_impl:ZmqTransport"))
    with Cluster(spec) as built:
        yield built


def _requests(node: Node) -> list[str]:
    """Record the operation of every request sent to ``node``'s process from now on."""
    transport = node.transport
    assert isinstance(transport, ProcessTransport)
    channel = transport._worker.channel
    sent: list[str] = []
    original = channel.send

    def send(data: bytes) -> None:
        sent.append(pickle.loads(data)[1])
        original(data)

    channel.send = send
    return sent


def _raw(conn: Connection) -> Any:
    return conn.raw


def test_drains_announced_for_a_quiet_poll_come_in_its_round_trip(cluster: Cluster) -> None:
    a, b, c = cluster.add_node("a"), cluster.add_node("b"), cluster.add_node("c")
    ab, ba = handshake(a, b)
    cb, bc = handshake(c, b)
    ab.send({"n": 1})
    cb.send({"n": 2})
    sent = _requests(b)
    got: dict[str, list[Any]] = {"a": [], "c": []}

    def drained() -> bool:
        assert isinstance(b.transport, ProcessTransport)
        b.transport.drain_after_poll([_raw(ba), _raw(bc)])
        assert b.poll() == []
        got["a"] += ba.recv()
        got["c"] += bc.recv()
        return bool(got["a"] and got["c"])

    wait_until(drained, nodes=[a, c], what="both messages at b", timeout=30.0)
    assert got == {"a": [{"n": 1}], "c": [{"n": 2}]}
    # One request per poll, its two recv() calls included.
    assert set(sent) == {"poll_drain"}


def test_a_poll_that_returns_a_connection_runs_no_announced_drain(cluster: Cluster) -> None:
    a, b = cluster.add_node("a"), cluster.add_node("b")
    ab, ba = handshake(a, b)
    c = cluster.add_node("c")
    c.connect(b).send({"from": "c"})
    ab.send({"from": "a"})
    sent = _requests(b)
    found: list[Connection] = []
    messages: list[Any] = []

    def polled_c() -> bool:
        assert isinstance(b.transport, ProcessTransport)
        b.transport.drain_after_poll([_raw(ba)])
        new = b.poll()
        if not new:
            messages.extend(ba.recv())  # the announced drain, as the machine makes it
            return False
        found.extend(new)
        return True

    wait_until(polled_c, nodes=[a, c], what="c's connection at b", timeout=30.0)
    # The drain of ba was announced for a quiet poll only: it goes as its own call now.
    before = len(sent)
    messages.extend(ba.recv())
    assert sent[before:] == ["recv"]
    def arrived() -> bool:
        messages.extend(ba.recv())
        return bool(messages)

    # b's poll() moves what reached its socket to the connections (plain polls now).
    wait_until(arrived, nodes=[a, b], what="a's message at b", timeout=30.0)
    assert messages == [{"from": "a"}]
    assert found[0].recv() == [{"from": "c"}]


def test_an_announced_drain_not_asked_for_keeps_its_messages(cluster: Cluster) -> None:
    a, b = cluster.add_node("a"), cluster.add_node("b")
    ab, ba = handshake(a, b)
    assert isinstance(b.transport, ProcessTransport)
    ab.send({"kept": 1})
    messages: list[Any] = []

    def announced_and_skipped() -> bool:
        assert isinstance(b.transport, ProcessTransport)
        b.transport.drain_after_poll([_raw(ba)])
        assert b.poll() == []
        # Not drained: another call first (the node ran the recv() already, and its
        # answer comes in while this one's is awaited).
        assert ba.alive
        held.append(bool(b.transport._worker._held))
        messages.extend(ba.recv())  # the held answer
        return bool(messages)

    held: list[bool] = []
    wait_until(announced_and_skipped, nodes=[a], what="the message at b", timeout=30.0)
    assert messages == [{"kept": 1}]
    assert all(held) and held


def test_alive_read_ahead_is_the_read_and_never_outlives_another_call(
        cluster: Cluster) -> None:
    a, b = cluster.add_node("a"), cluster.add_node("b")
    ab, _ = handshake(a, b)
    assert isinstance(a.transport, ProcessTransport)
    sent = _requests(a)
    a.transport.read_alive_ahead([_raw(ab)])
    assert ab.alive is True
    assert sent == ["batch"]
    # Read ahead, then another call to the node: the read is dropped, not handed over.
    a.transport.read_alive_ahead([_raw(ab)])
    ab.mark_dead()
    assert ab.alive is False
    assert sent[1:] == ["batch", "mark_dead", "alive"]


class _FakeChannel:
    def __init__(self) -> None:
        self.replies: list[tuple[Any, ...]] = []

    def send(self, data: bytes) -> None:
        self.replies.append(pickle.loads(data))


class _FakeNode:
    """Answers ``recv``/``alive`` from a script: a value, or an exception to raise."""

    def __init__(self, script: dict[tuple[str, int], Any]) -> None:
        self.script = script
        self.calls: list[tuple[str, int]] = []

    def call(self, op: str, args: list[Any]) -> Any:
        self.calls.append((op, args[0]))
        value = self.script[(op, args[0])]
        if isinstance(value, BaseException):
            raise value
        return value


@pytest.mark.parametrize(("script", "ran", "kinds"), [
    ({("recv", 1): ["ok", [{"m": 1}]], ("recv", 2): ["ok", []]}, 2, ["ok", "ok"]),
    ({("recv", 1): RuntimeError("boom"), ("recv", 2): ["ok", []]}, 1, ["err", "skipped"]),
    ({("recv", 1): ["not-a-sequence", "int"], ("recv", 2): ["ok", []]}, 1, ["ok", "skipped"]),
    ({("recv", 1): ["ok", ["not a dict"]], ("recv", 2): ["ok", []]}, 1, ["ok", "skipped"]),
    ({("alive", 1): 1, ("alive", 2): True}, 1, ["ok", "skipped"]),
])
def test_a_batch_stops_where_the_harness_would(
        script: dict[tuple[str, int], Any], ran: int, kinds: list[str]) -> None:
    channel, node = _FakeChannel(), _FakeNode(script)
    calls = [[op, handle, 100 + i] for i, (op, handle) in enumerate(script)]
    assert _node_worker._batch(channel, node, calls)  # type: ignore[arg-type]
    assert len(node.calls) == ran
    assert [reply[0] for reply in channel.replies] == [100, 101]
    assert [reply[1] for reply in channel.replies] == kinds
