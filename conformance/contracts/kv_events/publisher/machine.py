"""The publisher's stateful machine: publish, subscribe, leave, stall, replay, restart.

A Hypothesis ``RuleBasedStateMachine`` drives one publisher under test and
its raw-socket peers and keeps a model of the sequence *per publisher
incarnation*: every batch carries a unique ``ts``, so each message that
arrives is traced to the incarnation and the position it was published at.
After every step it checks, for every subscriber:

- EVT-1: seq ``i`` of an incarnation carries that incarnation's ``i``-th batch
  (so seqs restart at 0 after a restart, and never skip);
- EVT-2: a reading subscriber, once it received a batch of an incarnation,
  gets every later batch of it once, in order; a stalled one (receive
  high-water mark 1, not read) may miss batches but never gets one twice or
  out of order;
- EVT-4: a replay answers exactly the retained batches from its start, then
  the end marker.

A failure is shrunk by Hypothesis to the shortest sequence of steps; its
message starts with the clause ID.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from conformance.contracts.kv_events.publisher.peers import Rig, Sub, make_batch, ts_of
from conformance.contracts.kv_events.spec import PublisherSpec
from reference_impl.kv_events.schema import KVEventBatch

__all__ = ["PublisherMachine"]

_MAX_SUBS = 3


class _Watcher:
    """One subscriber and what the machine has checked of its stream."""

    def __init__(self, sub: Sub, *, reading: bool) -> None:
        self.sub = sub
        self.reading = reading
        self.checked = 0
        #: incarnation -> last seq seen of it
        self.last: dict[int, int] = {}


class PublisherMachine(RuleBasedStateMachine):
    """Subclass with ``spec`` set (the publisher under test) to run it."""

    spec: ClassVar[PublisherSpec]

    def __init__(self) -> None:
        super().__init__()
        self.rig = Rig(self.spec, clause="EVT-2")
        self.traced: dict[float, tuple[int, int]] = {}  # ts -> (incarnation, seq)
        self.watchers: list[_Watcher] = []

    # -- rules ---------------------------------------------------------------------------

    @rule(count=st.integers(1, 60))
    def publish(self, count: int) -> None:
        for watcher in self._reading():
            if self.rig.incarnation not in watcher.last:
                self._join(watcher)
        self._publish_many(count)
        for watcher in self._reading():
            self.rig.wait_all(watcher.sub, pump=self._drain_readers)

    @precondition(lambda self: len(self.watchers) < _MAX_SUBS)
    @rule(stalled=st.booleans())
    def subscribe(self, stalled: bool) -> None:
        watcher = _Watcher(self.rig.sub(rcvhwm=1 if stalled else 0), reading=not stalled)
        self.watchers.append(watcher)
        if watcher.reading:
            self._join(watcher)

    @precondition(lambda self: bool(self.watchers))
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        watcher = data.draw(st.sampled_from(self.watchers), label="leaving")
        self._check(watcher)
        self.watchers.remove(watcher)
        self.rig.drop(watcher.sub)

    @precondition(lambda self: any(not w.reading for w in self.watchers))
    @rule()
    def unstall(self) -> None:
        """A stalled subscriber reads what its pipe kept, then reads on."""
        watcher = next(w for w in self.watchers if not w.reading)
        watcher.sub.drain(20)
        self._check(watcher)
        watcher.reading = True
        watcher.last.pop(self.rig.incarnation, None)  # it may have missed some: rejoin
        self._join(watcher)

    @precondition(lambda self: bool(self.rig.model))
    @rule(back=st.integers(0, 80))
    def replay(self, back: int) -> None:
        """A replay from ``back`` batches before the newest, once all were sent."""
        self.rig.settle(self._publish)  # a replay covers what was sent, not what is queued
        self._drain_readers()
        for watcher in self._reading():
            self.rig.observe(watcher.sub)
        client = self.rig.replay_client()
        start = max(0, len(self.rig.model) - back)
        client.request(start)
        self.rig.check_replay(client, start, "EVT-4", self.spec.buffer_steps)
        self.rig.drop(client)

    @rule()
    def restart(self) -> None:
        """Shut the publisher down and start a new one on the same endpoints."""
        self._drain_readers()
        for watcher in self.watchers:
            self._check(watcher)
        self.rig.restart()

    # -- checks --------------------------------------------------------------------------

    @invariant()
    def streams_follow_the_model(self) -> None:
        self._drain_readers()
        for watcher in self.watchers:
            self._check(watcher)

    def teardown(self) -> None:
        self.rig.close()

    # -- helpers -------------------------------------------------------------------------

    def _reading(self) -> list[_Watcher]:
        return [w for w in self.watchers if w.reading]

    def _drain_readers(self) -> None:
        for watcher in self._reading():
            watcher.sub.drain()

    def _publish_many(self, count: int) -> None:
        """``count`` publish() calls in one burst (:meth:`Rig.publish_many`: in a driver's
        process where it runs in one), each accepted batch traced to its seq."""
        made: list[KVEventBatch] = []

        def batches() -> Iterator[KVEventBatch]:
            for _ in range(count):
                made.append(make_batch())
                yield made[-1]

        seq = len(self.rig.model)  # every accepted batch of make_batch() is modelled, in order
        for batch, accepted in zip(made, self.rig.publish_many(batches()), strict=True):
            if accepted:
                self.traced[batch.ts] = (self.rig.incarnation, seq)
                seq += 1

    def _publish(self) -> None:
        batch = make_batch()
        if self.rig.publish(batch):
            self.traced[batch.ts] = (self.rig.incarnation, len(self.rig.model) - 1)

    def _join(self, watcher: _Watcher) -> None:
        """Publish until ``watcher`` receives a batch of the current incarnation."""
        incarnation = self.rig.incarnation
        for _ in range(500):
            self._publish()
            watcher.sub.drain(20)
            self._check(watcher)
            if incarnation in watcher.last:
                return
        raise AssertionError(f"EVT-2: a subscriber never received a batch of incarnation "
                             f"{incarnation} ({len(self.rig.model)} published)")

    def _check(self, watcher: _Watcher) -> None:
        for topic, seq_frame, payload in watcher.sub.got[watcher.checked:]:
            watcher.checked += 1
            assert len(seq_frame) == 8, f"EVT-1: seq frame of {len(seq_frame)} bytes"
            seq = int.from_bytes(seq_frame, "big")
            ts = ts_of(payload)
            assert ts in self.traced, f"EVT-1: seq {seq} carries a batch nobody published"
            incarnation, index = self.traced[ts]
            assert seq == index, (
                f"EVT-1: seq {seq} carries batch #{index} of publisher incarnation "
                f"{incarnation} (seqs count from 0 per incarnation, one per batch)"
            )
            newer = [i for i in watcher.last if i > incarnation]
            assert not newer, (
                f"EVT-2: a batch of incarnation {incarnation} after one of incarnation "
                f"{newer[0]}"
            )
            last = watcher.last.get(incarnation)
            if last is not None:
                assert seq != last, f"EVT-2: seq {seq} delivered twice"
                assert seq > last, f"EVT-2: seq {seq} after seq {last}: reordered"
                if watcher.reading:
                    assert seq == last + 1, (
                        f"EVT-2: a reading subscriber got seq {last} then {seq}: "
                        f"{seq - last - 1} batches lost"
                    )
            watcher.last[incarnation] = seq
            del topic


def _span(seqs: list[int]) -> str:
    if not seqs:
        return "nothing"
    runs = [list(g) for _, g in itertools.groupby(enumerate(seqs), lambda p: p[1] - p[0])]
    return ", ".join(f"{r[0][1]}..{r[-1][1]}" if len(r) > 1 else str(r[0][1]) for r in runs)
