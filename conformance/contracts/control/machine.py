"""The control-channel state machine: requests, PINGs, restarts, outages, slow handlers, faults.

One server (restartable on its port) and one registering client. Hypothesis
picks the steps; a small model says, for every step, what must happen:

- server reachable and the channel *settled*: an ``ECHO`` returns its own
  reply (CTL-5), a slow handler below the request timeout answers, a
  failing handler raises at once (an error reply, not a timeout: CTL-3), a
  heartbeat window leaves the client ``alive`` (CTL-5);
- server stopped, or partitioned (chaos): every request raises within the
  request timeout plus slack (CTL-4), and the client marks the server dead
  within timeout + interval + slack of the outage (CTL-5);
- server back (start, restart, heal): the channel is *unsettled*; the next
  step that needs it first retries a request until one succeeds within the
  recovery bound (CTL-4) and, after a restart, waits for the client to
  register with the new server instance by itself (CTL-6).

The serve loop is checked after every step (CTL-3). A failure message
starts with the clause it broke; the steps printed by Hypothesis replay it.

Only the side under test is judged (:func:`run`'s ``side``): with the
reference client playing the client, what the client sees is evidence about
the server alone (CTL-3, "the server keeps serving"); with the reference
server, the failing-handler step judges the client (CTL-5: the error reply
is matched to its request and raised at once), never CTL-3.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar, cast

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
from conformance.contracts.control.harness import (
    ECHO,
    FAIL,
    HEARTBEAT_IVL_MS,
    HEARTBEAT_TIMEOUT_MS,
    RECONNECT_MAX_MS,
    REGISTER,
    REQUEST_TIMEOUT_MS,
    SLACK_MS,
    SLOW,
    Client,
    Rig,
    nonce,
)
from conformance.contracts.control.spec import ControlSpec
from conformance.errors import HostStalled
from conformance.supervision import host_stall
from conformance.testing import state_machines
from conformance.testing.values import msgpack_values

_FAIL_BY_S = (REQUEST_TIMEOUT_MS + SLACK_MS) / 1000
_RECOVER_S = (REQUEST_TIMEOUT_MS + RECONNECT_MAX_MS + SLACK_MS) / 1000
_REGISTER_S = (HEARTBEAT_TIMEOUT_MS + HEARTBEAT_IVL_MS + RECONNECT_MAX_MS + SLACK_MS) / 1000
_DEAD_BY_S = (HEARTBEAT_TIMEOUT_MS + HEARTBEAT_IVL_MS + SLACK_MS) / 1000
_CLIENT_CLAUSES = ("CTL-4", "CTL-5", "CTL-6")
_SERVER_CLAUSES = ("CTL-1", "CTL-2", "CTL-3", "CTL-7")

Side = Literal["both", "server", "client"]
F = TypeVar("F", bound=Callable[..., Any])


def _noted(step: F) -> F:
    """Record the first exception a step raises in the run (see :func:`run`)."""

    @functools.wraps(step)
    def wrapper(self: ControlMachine, *args: Any, **kwargs: Any) -> Any:
        try:
            return step(self, *args, **kwargs)
        except BaseException as exc:
            if not self.first_failure:
                self.first_failure.append(exc)
            raise

    return cast(F, wrapper)


class ControlMachine(RuleBasedStateMachine):
    """See the module docstring. ``make_rig`` builds the rig (a chaos one for faults)."""

    def __init__(self, spec: ControlSpec, make_rig: Callable[[ControlSpec], Rig] | None = None,
                 ) -> None:
        super().__init__()
        self.rig = (make_rig or Rig)(spec)
        self.up = False
        self.partitioned = False
        self.outage_since: float | None = None
        self.settled = False
        self.must_register = False
        self.client: Client | None = None
        #: The run's first failure, shared by every machine of one :func:`run`.
        self.first_failure: list[BaseException] = []
        #: The clause a raising handler's step judges: CTL-3 on a server under test.
        self.handler_clause = "CTL-3" if spec.server is not None else "CTL-5"

    # -- model helpers ----------------------------------------------------------

    @property
    def reachable(self) -> bool:
        return self.up and not self.partitioned

    def _settle(self) -> None:
        """Unsettled and reachable: recover (CTL-4), then see the registration (CTL-6)."""
        if self.settled or not self.reachable:
            return
        client = self._client()
        last: list[BaseException | None] = [None]

        def works() -> bool:
            reply, exc, _ = client.attempt(ECHO, {"nonce": 0})
            last[0] = exc
            return reply is not None

        try:
            self.rig.wait_until(works, timeout=_RECOVER_S, what="a request to succeed")
        except AssertionError:
            raise AssertionError(
                f"CTL-4: the server is reachable again but no request succeeded within "
                f"{_RECOVER_S:.2f} s; last error {last[0]!r}") from None
        if self.must_register:
            gen = self.rig.generation
            try:
                self.rig.wait_until(
                    lambda: self.rig.handlers.seen(type=REGISTER, generation=gen),
                    tick=[client], timeout=_REGISTER_S, what="the registration")
            except AssertionError:
                raise AssertionError(
                    f"CTL-6: the restarted server (generation {gen}) saw no {REGISTER} from the "
                    f"client within {_REGISTER_S:.2f} s") from None
            self.must_register = False
        self.settled = True

    def _client(self) -> Client:
        assert self.client is not None
        return self.client

    def _outage(self) -> None:
        if self.outage_since is None:
            self.outage_since = time.monotonic()
        self.settled = False

    def _back(self) -> None:
        if self.reachable:
            self.outage_since = None

    def _expect_failure(self, kind: str, body: dict[str, Any]) -> None:
        window = host_stall.Window()
        reply, _, took = self._client().attempt(kind, body)
        assert reply is None, (
            f"CTL-4: {kind} succeeded ({reply!r:.80}) while the server is "
            f"{'partitioned' if self.partitioned else 'stopped'}")
        if took > _FAIL_BY_S and took * 1000 - window.stolen_ms() <= _FAIL_BY_S * 1000:
            # The host kept the client (or this process) waiting for the whole overrun.
            raise HostStalled(f"CTL-4: {kind} failed after {took * 1000:.0f} ms, over the "
                              f"{_FAIL_BY_S * 1000:.0f} ms bound, but the host kept the "
                              f"working processes waiting {window.stolen_ms():.0f} ms "
                              "meanwhile (overloaded): no verdict on the time")
        assert took <= _FAIL_BY_S, (
            f"CTL-4: {kind} to an unreachable server failed only after {took * 1000:.0f} ms "
            f"(request timeout {REQUEST_TIMEOUT_MS} ms + {SLACK_MS} ms slack)")

    # -- steps --------------------------------------------------------------------

    @initialize()
    @_noted
    def start(self) -> None:
        self.rig.start_server()
        self.up = True
        self.client = self.rig.client("worker")
        self.must_register = True

    @rule(data=msgpack_values(max_leaves=6))
    @_noted
    def echo(self, data: Any) -> None:
        """An ``ECHO``: its own reply when settled, a timely failure when unreachable."""
        if not self.reachable:
            self._expect_failure(ECHO, {"nonce": nonce(), "data": data})
            return
        self._settle()
        n = nonce()
        reply = self._client().request(ECHO, {"nonce": n, "data": data})
        assert reply.get("nonce") == n, (
            f"CTL-5: {ECHO} nonce {n} returned {reply!r:.120}, another request's reply")

    @rule(ms=st.sampled_from([20, 80, 150]))
    @_noted
    def slow(self, ms: int) -> None:
        """A slow handler below the request timeout answers its own request."""
        if not self.reachable:
            self._expect_failure(SLOW, {"nonce": nonce(), "ms": ms})
            return
        self._settle()
        n = nonce()
        reply = self._client().request(SLOW, {"nonce": n, "ms": ms})
        assert reply.get("nonce") == n, f"CTL-5: {SLOW} nonce {n} returned {reply!r:.120}"

    @rule()
    @_noted
    def failing_handler(self) -> None:
        """A raising handler: the client raises at once (an error reply), the server lives."""
        if not self.reachable:
            return
        self._settle()
        reply, exc, took = self._client().attempt(FAIL, {"nonce": nonce()})
        clause = self.handler_clause
        assert reply is None, f"{clause}: a raising handler's request returned {reply!r:.80}"
        assert took < REQUEST_TIMEOUT_MS / 1000, (
            f"{clause}: a raising handler's request failed only after {took * 1000:.0f} ms "
            f"({exc!r}): no error reply came, the request timed out")

    @rule()
    @_noted
    def heartbeats(self) -> None:
        """Two intervals of ticking; settled and reachable: the client reports alive."""
        if self.reachable:
            self._settle()
        self.rig.drive(2 * HEARTBEAT_IVL_MS / 1000, tick=[self._client()])
        if self.reachable:
            assert self._client().alive, (
                "CTL-5: the client reports the server dead while it answers requests")

    @precondition(lambda self: not self.reachable and self.outage_since is not None)
    @rule()
    @_noted
    def outage_detected(self) -> None:
        """Unreachable: ``alive`` turns False by timeout + interval + slack after the outage."""
        assert self.outage_since is not None
        deadline = self.outage_since + _DEAD_BY_S
        client = self._client()
        while client.alive:
            if time.monotonic() > deadline + 0.05:
                raise AssertionError(
                    f"CTL-5: the server has been unreachable for "
                    f"{(time.monotonic() - self.outage_since) * 1000:.0f} ms and the client "
                    f"still reports it alive (allowed {_DEAD_BY_S * 1000:.0f} ms)")
            client.tick()
            time.sleep(0.002)

    @rule()
    @_noted
    def restart_server(self) -> None:
        """Stop and start again at once on the same port (faster than the heartbeat timeout)."""
        self.rig.restart_server()
        self.up = True
        self.settled = False
        self.must_register = True
        self._back()

    @precondition(lambda self: self.up)
    @rule()
    @_noted
    def stop_server(self) -> None:
        self.rig.stop_server()
        self.up = False
        self._outage()

    @precondition(lambda self: not self.up)
    @rule()
    @_noted
    def start_server(self) -> None:
        self.rig.start_server()
        self.up = True
        self.settled = False
        self.must_register = True
        self._back()

    @invariant()
    @_noted
    def serve_loop_alive(self) -> None:
        if self.up:
            self.rig.check()

    def teardown(self) -> None:
        self.rig.close()


class ChaosControlMachine(ControlMachine):
    """The machine plus a silent partition and its heal, through the rig's proxy."""

    def __init__(self, spec: ControlSpec, make_rig: Callable[[ControlSpec], Rig]) -> None:
        super().__init__(spec, make_rig)
        self._partition: Any = None

    @precondition(lambda self: not self.partitioned)
    @rule()
    @_noted
    def partition(self) -> None:
        from conformance.contracts.control.faults import ChaosRig

        assert isinstance(self.rig, ChaosRig)
        self._partition = self.rig.partition()
        self.partitioned = True
        if self.up:
            self.outage_since = self._partition.in_place_at
        self.settled = False

    @precondition(lambda self: self.partitioned)
    @rule()
    @_noted
    def heal(self) -> None:
        from conformance.contracts.control.faults import ChaosRig

        assert isinstance(self.rig, ChaosRig)
        self.rig.heal(self._partition)
        self.partitioned = False
        self.settled = False
        self._back()



def run(build: Callable[[], ControlMachine], settings: Settings, side: Side = "both") -> None:
    """Run machines ``build()`` makes as a Hypothesis test
    (:func:`conformance.testing.state_machines.run`: a timing-dependent failure
    Hypothesis cannot replay is raised as the error it first was, so the report
    names its clause and the real error, never the wrapper). With one side
    under test (``side``), a failure naming a clause of the other side is
    relabelled to the side under test (see the module docstring).
    """
    first: list[BaseException] = []

    def noted_build() -> ControlMachine:
        machine = build()
        machine.first_failure = first
        return machine

    try:
        state_machines.run(noted_build, settings, seen=first)
    except AssertionError as exc:
        if side == "both":
            raise
        relabelled = _relabelled(exc, side)
        if relabelled is exc:
            raise
        raise relabelled from exc


def _relabelled(exc: BaseException, side: Side, suffix: str = "") -> AssertionError:
    """``exc`` as an AssertionError naming a clause of ``side`` (its notes kept)."""
    message = str(exc) if isinstance(exc, AssertionError) else f"{type(exc).__name__}: {exc}"
    foreign = _CLIENT_CLAUSES if side == "server" else _SERVER_CLAUSES if side == "client" else ()
    head = message[:6]
    if any(head.startswith(c) for c in foreign):
        own = "CTL-3" if side == "server" else "CTL-5"
        who = ("the reference client failed against the server under test" if side == "server"
               else "the client under test failed against the reference server")
        message = f"{own}: {who} ({message})"
    elif isinstance(exc, AssertionError) and not suffix:
        return exc
    result = AssertionError(f"{message} {suffix}".rstrip())
    for note in getattr(exc, "__notes__", ()):
        result.add_note(note)
    return result


def machine_settings() -> Settings:
    """Half the profile's examples and steps: each step waits on the network."""
    profile = profiles.active()
    return profiles.suite_settings(max_examples=max(4, profile.max_examples // 2),
                                   stateful_step_count=max(8, profile.stateful_step_count // 2))
