"""CTL-4..6 under faults through toxiproxy, with measured detection and recovery times.

Detection is measured like HB-1: from the moment the fault is in place to
the first tick that sees ``alive`` False, bounded by ``[timeout - interval,
timeout + interval + slack + tick granularity]`` (the lower bound from the
moment the fault started: a PING already in flight may be lost with it).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from chaos.proxy import Toxiproxy
from conformance.contracts.control.faults import ChaosRig
from conformance.contracts.control.harness import (
    ECHO,
    HEARTBEAT_IVL_MS,
    HEARTBEAT_TIMEOUT_MS,
    RECONNECT_MAX_MS,
    REGISTER,
    REQUEST_TIMEOUT_MS,
    SLACK_MS,
    Client,
    nonce,
)
from conformance.contracts.control.machine import ChaosControlMachine, machine_settings, run
from conformance.contracts.control.spec import ControlSpec

pytestmark = pytest.mark.chaos

Recorder = Callable[[str, object], None]

_FAIL_BY_S = (REQUEST_TIMEOUT_MS + SLACK_MS) / 1000
_RECOVER_S = (HEARTBEAT_TIMEOUT_MS + REQUEST_TIMEOUT_MS + RECONNECT_MAX_MS + SLACK_MS) / 1000


def _ready(rig: ChaosRig, client: Client) -> None:
    rig.wait_until(lambda: client.attempt(ECHO, {"nonce": 0})[0] is not None,
                   timeout=_RECOVER_S, what="a first request through the proxy")
    rig.wait_until(lambda: client.alive, tick=[client], timeout=_RECOVER_S,
                   what="the client to report the server alive")


def _watch(client: Client, until: float, want: bool) -> tuple[float | None, float]:
    last, gran = time.monotonic(), 0.0
    while True:
        client.tick()
        now = time.monotonic()
        gran, last = max(gran, (now - last) * 1000), now
        if client.alive is want:
            return now, gran
        if now >= until:
            return None, gran
        time.sleep(0.001)


def _own_reply(client: Client, what: str) -> None:
    n = nonce()
    reply = client.request(ECHO, {"nonce": n})
    assert reply.get("nonce") == n, f"CTL-5: {what}: nonce {n} got {reply!r:.100}"


def _recovers(rig: ChaosRig, client: Client, what: str) -> float:
    started = time.monotonic()
    last: list[BaseException | None] = [None]

    def works() -> bool:
        reply, exc, _ = client.attempt(ECHO, {"nonce": 0})
        last[0] = exc
        return reply is not None

    try:
        rig.wait_until(works, timeout=_RECOVER_S, what=what)
    except AssertionError:
        raise AssertionError(f"CTL-4: {what}: no request succeeded within {_RECOVER_S:.2f} s "
                             f"after the heal; last error {last[0]!r}") from None
    return time.monotonic() - started


@pytest.mark.clause("CTL-5")
def test_ctl5_silent_partition_detected_in_window_and_alive_after_heal(
    chaos_rig: ChaosRig, control_spec: ControlSpec, record_property: Recorder
) -> None:
    control_spec.require("client", "CTL-5")
    control_spec.require_suite_types("CTL-5")
    client = chaos_rig.client()
    _ready(chaos_rig, client)
    fault = chaos_rig.partition()
    dead_at, gran = _watch(client, fault.in_place_at + 3 * HEARTBEAT_TIMEOUT_MS / 1000, False)
    latest = HEARTBEAT_TIMEOUT_MS + HEARTBEAT_IVL_MS + SLACK_MS + gran
    assert dead_at is not None, (
        f"CTL-5: silent partition never detected: alive after "
        f"{(time.monotonic() - fault.in_place_at) * 1000:.0f} ms (allowed {latest:.0f} ms)")
    detection = (dead_at - fault.in_place_at) * 1000
    record_property("detection_ms", round(detection))
    record_property("detection_vs_timeout", round(detection / HEARTBEAT_TIMEOUT_MS, 2))
    print(f"CTL-5: partition detected after {detection:.0f} ms (timeout {HEARTBEAT_TIMEOUT_MS}, "
          f"interval {HEARTBEAT_IVL_MS}, granularity {gran:.1f} ms)")
    assert (dead_at - fault.started_at) * 1000 >= HEARTBEAT_TIMEOUT_MS - HEARTBEAT_IVL_MS, (
        f"CTL-5: marked dead {(dead_at - fault.started_at) * 1000:.0f} ms after the partition "
        f"started, before timeout - interval")
    assert detection <= latest, (
        f"CTL-5: partition detected after {detection:.0f} ms; allowed {latest:.0f} ms")
    healed = chaos_rig.heal(fault)
    alive_at, _ = _watch(client, healed + _RECOVER_S, True)
    assert alive_at is not None, (
        f"CTL-5: the partition healed {_RECOVER_S * 1000:.0f} ms ago; the client still reports "
        "the server dead")
    record_property("alive_after_heal_ms", round((alive_at - healed) * 1000))
    _own_reply(client, "after the heal")


@pytest.mark.clause("CTL-4")
@pytest.mark.parametrize("kind", ["partition", "reset", "disable"])
def test_ctl4_requests_fail_in_time_under_a_fault_then_recover(
    chaos_rig: ChaosRig, control_spec: ControlSpec, record_property: Recorder, kind: str
) -> None:
    control_spec.require("client", "CTL-4")
    control_spec.require_suite_types("CTL-4")
    client = chaos_rig.client()
    _ready(chaos_rig, client)
    fault = {"partition": chaos_rig.partition, "reset": chaos_rig.reset,
             "disable": chaos_rig.disable}[kind]()
    for i in range(2):
        reply, exc, took = client.attempt(ECHO, {"nonce": nonce()})
        assert reply is None, f"CTL-4: request {i} succeeded through a {kind} ({reply!r:.80})"
        assert took <= _FAIL_BY_S, (
            f"CTL-4: request {i} under a {kind} failed only after {took * 1000:.0f} ms "
            f"({exc!r}); request timeout {REQUEST_TIMEOUT_MS} ms + {SLACK_MS} ms slack")
    chaos_rig.heal(fault)
    recovered = _recovers(chaos_rig, client, f"after a {kind}")
    record_property("recovered_after_ms", round(recovered * 1000))
    for _ in range(3):
        _own_reply(client, f"after a {kind} healed")


@pytest.mark.clause("CTL-5")
def test_ctl5_latency_below_the_timeout_is_no_death(
    chaos_rig: ChaosRig, control_spec: ControlSpec
) -> None:
    """60 ms each way on every byte (RTT well under the heartbeat and request timeouts)."""
    control_spec.require("client", "CTL-5")
    control_spec.require_suite_types("CTL-5")
    client = chaos_rig.client()
    _ready(chaos_rig, client)
    chaos_rig.latency(60, jitter_ms=20)
    deadline = time.monotonic() + 4 * HEARTBEAT_TIMEOUT_MS / 1000
    while time.monotonic() < deadline:
        _own_reply(client, "under 60 ms latency")
        client.tick()
        assert client.alive, "CTL-5: 60 ms latency (timeout 500 ms) made the client declare death"


@pytest.mark.clause("CTL-6")
def test_ctl6_server_restarted_behind_a_partition(
    chaos_rig: ChaosRig, control_spec: ControlSpec, record_property: Recorder
) -> None:
    control_spec.require("client", "CTL-6")
    control_spec.require_suite_types("CTL-6")
    client = chaos_rig.client("worker")
    _ready(chaos_rig, client)
    first = chaos_rig.generation
    chaos_rig.wait_until(lambda: chaos_rig.handlers.seen(type=REGISTER, generation=first),
                         tick=[client], timeout=_RECOVER_S, what="CTL-6: the first registration")
    chaos_rig.drive(2 * HEARTBEAT_IVL_MS / 1000, tick=[client])  # its reply is back
    fault = chaos_rig.partition()
    chaos_rig.restart_server()
    gen = chaos_rig.generation
    chaos_rig.drive(HEARTBEAT_TIMEOUT_MS / 1000, tick=[client])
    healed = chaos_rig.heal(fault)
    try:
        chaos_rig.wait_until(lambda: chaos_rig.handlers.seen(type=REGISTER, generation=gen),
                             tick=[client], timeout=_RECOVER_S, what="the registration")
    except AssertionError:
        raise AssertionError(
            f"CTL-6: the server restarted behind a partition; {_RECOVER_S:.2f} s after the heal "
            f"it has seen no {REGISTER} from the client") from None
    record_property("reregistered_after_heal_ms", round((time.monotonic() - healed) * 1000))
    _own_reply(client, "after re-registering")


@pytest.mark.clause("CTL-4", "CTL-5", "CTL-6")
def test_control_chaos_machine(
    control_spec: ControlSpec, toxiproxy: Toxiproxy, record_property: Recorder
) -> None:
    """The machine with silent partitions and heals among its steps."""
    control_spec.require("client", "CTL-4")
    control_spec.require_suite_types("CTL-4")
    built: list[ChaosControlMachine] = []

    def build() -> ChaosControlMachine:
        built.append(ChaosControlMachine(control_spec,
                                         lambda spec: ChaosRig(spec, toxiproxy)))
        return built[-1]

    try:
        run(build, machine_settings(), "both" if control_spec.server is not None else "client")
    finally:
        record_property("examples", len(built))
