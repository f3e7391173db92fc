"""The engine-pipeline state machine: add, abort, call, drain, slow reader, burst, kill,
pause, restart, against a model of every request's token stream per engine incarnation.

One client and one engine process make an *incarnation*. Hypothesis picks
the steps; the model says what must be seen:

- every request of the live incarnation streams ``token_of(rid, 0..)`` in
  order, each token once, with one finish at the end: LENGTH after
  ``max_tokens`` tokens, or ABORT after ``abort()`` (PIPE-2); a slow reader
  (no reads while the engine finishes a burst) loses nothing;
- ``call("echo", n)`` returns ``[n]`` (PIPE-12);
- after ``kill`` the client fails within the death bound, every later call
  raises, and nothing of that incarnation is delivered again (PIPE-5,
  PIPE-11); ``restart`` builds the next incarnation: with restart policy
  ``none`` a new pipeline on fresh addresses, with ``adopt`` a replacement
  engine process the same client must adopt (alive again), after which no
  output of a request of any dead incarnation may arrive;
- a pause shorter than the heartbeat window is no death (PIPE-5).

A failure message starts with the clause it broke; the steps printed by
Hypothesis replay it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from conformance.config import profiles
from conformance.contracts.engine_pipeline.harness import (
    PROCESS_READY_S,
    SLACK_S,
    EngineProcess,
    Rig,
    Streams,
    guarded,
    request_id,
)
from conformance.contracts.engine_pipeline.spec import PipelineSpec
from conformance.errors import HostStalled
from conformance.testing import state_machines
from reference_impl.engine_pipeline.wire import FinishReason

#: A pause this short is inside every heartbeat window the suite accepts.
PAUSE_MS = 100
#: Steps an incarnation serves before ``kill`` is the only step left: every example of
#: more steps than this kills and restarts (Hypothesis' first examples are its
#: simplest, and a kill among eight rules would otherwise often not come).
LIFE_STEPS = 6


@dataclass
class _Request:
    max_tokens: int
    aborted: bool = False


@dataclass
class _Incarnation:
    client: Any
    process: EngineProcess
    requests: dict[str, _Request] = field(default_factory=dict)
    streams: Streams = field(default_factory=Streams)
    dead: bool = False
    steps: int = 0


class PipelineMachine(RuleBasedStateMachine):
    """See the module docstring."""

    def __init__(self, spec: PipelineSpec, tmp_path: Path, policy: str = "none") -> None:
        super().__init__()
        self.rig = Rig(spec, tmp_path)
        self.policy = policy
        self.client_options = spec.capabilities.restart_option(policy, "PIPE-11")
        self.live: _Incarnation | None = None
        self.incarnations = 0
        #: Requests of dead incarnations (restart adopt: the client is the same).
        self.dead_rids: set[str] = set()

    @initialize()
    def start(self) -> None:
        self._new_incarnation()

    def _new_incarnation(self) -> None:
        if self.policy == "adopt" and self.live is not None:
            client = self.live.client
            process = self.rig.engine([client.handshake_address], clause="PIPE-11",
                                      model={"stall_ms": 1})
            deadline = time.monotonic() + PROCESS_READY_S
            while not guarded("alive", lambda: client.alive, 5.0):
                assert process.running and time.monotonic() < deadline, (
                    "PIPE-11: restart adopt declared, but the replacement engine was not "
                    f"adopted; {process.describe()}")
                time.sleep(0.02)
        else:
            client, process = self.rig.pipeline(clause="PIPE-9", model={"stall_ms": 1},
                                                **self.client_options)
        self.live = _Incarnation(client, process)
        self.incarnations += 1

    @property
    def _inc(self) -> _Incarnation:
        assert self.live is not None
        return self.live

    def _alive(self) -> bool:
        return self.live is not None and not self.live.dead

    def _serving(self) -> bool:
        """Alive and not yet due to be killed (see :data:`LIFE_STEPS`)."""
        return self._alive() and self._inc.steps < LIFE_STEPS

    @invariant()
    def count_steps(self) -> None:
        if self.live is not None:
            self.live.steps += 1

    @precondition(_serving)
    @rule(max_tokens=st.integers(1, 40), count=st.integers(1, 30))
    def add(self, max_tokens: int, count: int) -> None:
        inc = self._inc
        rids = [request_id("m") for _ in range(count)]

        def send() -> None:
            for rid in rids:
                inc.client.add(rid, [1], max_tokens)

        guarded("add()", send, 5.0)
        for rid in rids:
            inc.requests[rid] = _Request(max_tokens)

    @precondition(_serving)
    @rule(long=st.integers(1, 3))
    def add_long_and_abort(self, long: int) -> None:
        inc = self._inc
        rids = [request_id("ab") for _ in range(long)]
        for rid in rids:
            inc.client.add(rid, [1], 100_000)
            inc.requests[rid] = _Request(100_000, aborted=True)
        guarded("abort()", lambda: inc.client.abort(rids), 5.0)

    @precondition(_serving)
    @rule(n=st.integers(0, 1 << 40))
    def call(self, n: int) -> None:
        value = guarded("call()", lambda: self._inc.client.call("echo", n, timeout_ms=5000), 8.0)
        assert value == [n], f"PIPE-12: call('echo', {n}) returned {value!r}"

    @precondition(_serving)
    @rule()
    def drain(self) -> None:
        inc = self._inc
        open_rids = [r for r in inc.requests if not inc.streams.finished(r)]
        self.rig.collect(inc.client, open_rids, clause="PIPE-2", streams=inc.streams)
        self._check_streams(inc)

    @precondition(_serving)
    @rule()
    def slow_reader(self) -> None:
        """A burst the engine finishes while nobody reads; then everything is read."""
        inc = self._inc
        for _ in range(50):
            rid = request_id("sr")
            inc.client.add(rid, [2], 8)
            inc.requests[rid] = _Request(8)
        deadline = time.monotonic() + 10
        while guarded("call()", lambda: inc.client.call("running", timeout_ms=5000), 8.0) \
                and time.monotonic() < deadline:
            pass
        self.drain()

    @precondition(lambda self: self._serving() and self.rig.caps.detects_hang)
    @rule()
    def pause(self) -> None:
        inc = self._inc
        fault = inc.process.pause()
        time.sleep(PAUSE_MS / 1000)  # the fault's length, not a synchronisation
        inc.process.resume()
        lasted = fault.duration_ms or 0.0
        if not inc.client.alive and lasted > 2 * PAUSE_MS:
            # The host, not the implementation, stretched the pause (an overloaded
            # machine): a death after a stop this long is no verdict either way.
            raise HostStalled(f"PIPE-5: the engine's {PAUSE_MS} ms pause lasted {lasted:.0f} ms "
                           "on this host (overloaded), and the client then saw a death")
        assert inc.client.alive, (f"PIPE-5: a {PAUSE_MS} ms pause of the engine (measured "
                                  f"{lasted:.0f} ms) was taken for a death (false death)")

    @precondition(_alive)
    @rule()
    def kill(self) -> None:
        inc = self._inc
        inc.process.kill()
        started = time.monotonic()
        bound = self.rig.death_bound_s + SLACK_S
        while time.monotonic() - started <= bound:
            try:
                batch = guarded("outputs()", lambda: inc.client.outputs(50), 5.0)
            except Exception:
                break
            inc.streams.take(batch)
        else:
            raise AssertionError(f"PIPE-5: the killed engine was not seen dead within "
                                 f"{self.rig.death_bound_s:.2f} s")
        inc.dead = True
        self._check_streams(inc, complete=False)
        self.dead_rids.update(inc.requests)
        try:
            late = guarded("outputs()", lambda: inc.client.outputs(0), 5.0)
        except Exception:
            late = []
        assert not late, f"PIPE-11: {len(late)} output(s) delivered after the engine's death"
        raised = False
        try:
            guarded("add()", lambda: inc.client.add(request_id("x"), [1], 1), 5.0)
        except Exception:
            raised = True
        assert raised, "PIPE-5: add() after the engine's death did not raise"

    @precondition(lambda self: self.live is not None and self.live.dead)
    @rule()
    def restart(self) -> None:
        self._new_incarnation()

    def _check_streams(self, inc: _Incarnation, *, complete: bool = True) -> None:
        foreign = sorted(set(inc.streams.outputs) & self.dead_rids)
        assert not foreign, (f"PIPE-11: outputs of request(s) {foreign[:3]} of a dead "
                             f"incarnation delivered after the restart ({self.policy})")
        for rid, req in inc.requests.items():
            if not inc.streams.outputs.get(rid):
                assert not complete, f"PIPE-2: request {rid} produced nothing"
                continue
            if not complete and not inc.streams.finished(rid):
                tokens = inc.streams.tokens(rid)
                from reference_impl.engine_pipeline.model import token_of

                assert tokens == [token_of(rid, p) for p in range(len(tokens))], (
                    f"PIPE-2: request {rid}: tokens out of order or foreign before the death")
                continue
            finish = FinishReason.ABORT if req.aborted else FinishReason.LENGTH
            inc.streams.check(rid, "PIPE-2", max_tokens=None if req.aborted else req.max_tokens,
                              finish=finish)

    def teardown(self) -> None:
        self.rig.close()


def run(build: Callable[[], PipelineMachine], settings: Settings) -> None:
    """Run machines ``build()`` makes; an unreplayable timing failure is raised as the
    ``AssertionError`` it first was, so the report still names its clause
    (:func:`conformance.testing.state_machines.run`)."""
    state_machines.run(build, settings)


def machine_settings(policies: int = 1) -> Settings:
    """Few examples and steps: every incarnation is an engine process. With ``policies``
    restart policies the examples are shared out, at least two each."""
    profile = profiles.active()
    examples = max(3, profile.max_examples // 5)
    return profiles.suite_settings(max_examples=max(2, examples // policies),
                                   stateful_step_count=max(10, profile.stateful_step_count // 2))
