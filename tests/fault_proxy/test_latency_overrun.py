"""A proxy that adds more delay than its latency toxic promises is no HB-2 verdict.

The chaos machine calls a death under a latency toxic a false death (HB-2)
only while the delay the proxy server really adds leaves the heartbeat room
(:mod:`conformance.contracts.p2p.delay_probe`). Here the lateness is injected
deterministically: the test's own server is paused (SIGSTOP) for longer than
the heartbeat timeout while a latency fault is in place, so every connection
through it starves and the reference transport correctly declares it dead.
With the probe the machine notes an overrun and judges nothing; with the
probe's verdict switched off the same schedule is the old false HB-2. Each
test starts its own server (it is paused), the embedded one and the real
``toxiproxy-server`` when one is found.
"""

from __future__ import annotations

import signal
import time

import pytest

from chaos.proxy import Toxiproxy
from conformance.contracts.p2p import chaos_machine
from conformance.contracts.p2p.chaos_machine import ChaosMachine
from conformance.contracts.p2p.delay_probe import DelayProbe
from conformance.contracts.p2p.machines import NodeRef, Violation
from conformance.contracts.p2p.spec import (
    SUITE_HEARTBEAT_IVL_MS,
    SUITE_HEARTBEAT_TIMEOUT_MS,
    make_spec,
)
from reference_impl import ZmqTransport

pytestmark = pytest.mark.chaos

#: How long the server is paused: the heartbeat timeout plus two intervals.
_PAUSE_S = (SUITE_HEARTBEAT_TIMEOUT_MS + 2 * SUITE_HEARTBEAT_IVL_MS) / 1000




def _pause(server: Toxiproxy, seconds: float) -> None:
    """Stop the server's process for ``seconds``: every byte through it is late."""
    assert server.lease is not None and server.lease.process is not None
    process = server.lease.process
    process.send_signal(signal.SIGSTOP)
    try:
        time.sleep(seconds)  # the lateness itself, not a synchronisation
    finally:
        process.send_signal(signal.SIGCONT)


def _late_proxy_schedule(machine: ChaosMachine, server: Toxiproxy) -> None:
    """Two nodes, one connection, latency on the receiver, then the server paused;
    ``alive`` is checked against the model afterwards (as the invariant does)."""
    a, b = NodeRef("n0"), NodeRef("n1")
    machine.start_cluster(2)
    machine.connect(a, b, {"hello": 1})
    machine.poll_until_settled()
    machine.add_latency(b, 0.5, 0.0)
    machine.let_heartbeats_run(False)
    machine.connections_alive_as_modelled()
    _pause(server, _PAUSE_S)
    machine.let_heartbeats_run(True)
    conn = machine.current("n0", "n1")
    assert conn is not None
    assert not machine.proxy[conn.name].alive, (
        "the pause should starve the connection past the heartbeat timeout")
    machine.connections_alive_as_modelled()


def test_a_proxy_overrunning_its_latency_is_noted_not_judged(own_server: Toxiproxy) -> None:
    machine = ChaosMachine(make_spec(ZmqTransport), own_server)
    try:
        _late_proxy_schedule(machine, own_server)
    finally:
        machine.teardown()
    # A host stall of a loaded machine is noted too (load-verdicts); count the proxy's.
    proxy_lines = [line for line in machine.proxy_overruns if not line.startswith("the host")]
    assert len(proxy_lines) == 1, machine.proxy_overruns
    assert "latency(latency=75, jitter=0) on n1" in proxy_lines[0]


def test_without_the_probe_the_same_schedule_is_the_old_false_hb2(
    own_server: Toxiproxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: the probe's slack made huge, so no overrun is ever seen."""
    monkeypatch.setattr(chaos_machine, "PROXY_SLACK_MS", -10 * SUITE_HEARTBEAT_TIMEOUT_MS)
    machine = ChaosMachine(make_spec(ZmqTransport), own_server)
    try:
        with pytest.raises(Violation) as caught:
            _late_proxy_schedule(machine, own_server)
    finally:
        machine.teardown()
    assert caught.value.clause == "HB-2"
    assert machine.proxy_overruns == []


def test_the_probe_measures_the_configured_latency(own_server: Toxiproxy) -> None:
    """The probe sees at least the toxic's delay and not more than the server's
    worst measured lateness under load (225 ms) allows, where a probe that aged
    records from its start would read 360 ms or more; a pause of the server shows
    up in its reading even before the late records arrive."""
    probe = DelayProbe(own_server, latency_ms=60, jitter_ms=0).start()
    try:
        deadline = time.monotonic() + 5.0
        while probe.worst_delay_ms() < 60:
            assert time.monotonic() < deadline, "the probe never saw the toxic's delay"
            time.sleep(0.01)
        time.sleep(0.3)
        assert 60 <= probe.worst_delay_ms() < 60 + 290
        assert own_server.lease is not None and own_server.lease.process is not None
        own_server.lease.process.send_signal(signal.SIGSTOP)
        try:
            time.sleep(0.4)
            paused = probe.worst_delay_ms()
        finally:
            own_server.lease.process.send_signal(signal.SIGCONT)
        assert paused >= 400, f"a 400 ms pause read as {paused:.0f} ms"
    finally:
        probe.close()
