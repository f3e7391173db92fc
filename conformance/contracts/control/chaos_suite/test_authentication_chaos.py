"""CTL-8 under faults: with CURVE on, the client recovers after a fault heals within the
same bound as a plain one (CTL-4), and an authenticated client is still authenticated on
the sockets its lazy-pirate rebuilds open while the link was down. A server restarted
behind a partition with the same keys serves the client again after the heal; one
restarted with a new server key is refused by the client that pins the old one.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from conformance.contracts.control.faults import ChaosRig
from conformance.contracts.control.harness import (
    ECHO,
    HEARTBEAT_TIMEOUT_MS,
    RECONNECT_MAX_MS,
    REQUEST_TIMEOUT_MS,
    SLACK_MS,
    nonce,
)
from conformance.contracts.control.spec import ControlSpec
from conformance.testing.credentials import KeyPair, SuiteCredentials

pytestmark = pytest.mark.chaos

CLAUSE = "CTL-8"
_RECOVER_S = (HEARTBEAT_TIMEOUT_MS + REQUEST_TIMEOUT_MS + RECONNECT_MAX_MS + SLACK_MS) / 1000


@pytest.mark.clause(CLAUSE)
@pytest.mark.parametrize("kind", ["partition", "reset"])
def test_authenticated_client_recovers_after_a_fault_heals(
    chaos_rig: ChaosRig, control_spec: ControlSpec,
    record_property: Callable[[str, object], None], kind: str,
) -> None:
    if not control_spec.capabilities.authentication:
        pytest.skip(f"{CLAUSE}: requires capability authentication (see the CTL-8 tests)")
    chaos_rig.credentials = SuiteCredentials.generate()
    chaos_rig.restart_server()  # now a CURVE server
    client = chaos_rig.client()
    chaos_rig.wait_until(lambda: client.attempt(ECHO, {"nonce": 0})[0] is not None,
                         timeout=_RECOVER_S, what=f"{CLAUSE}: a first request over CURVE")
    fault = {"partition": chaos_rig.partition, "reset": chaos_rig.reset}[kind]()
    for _ in range(2):  # each timeout rebuilds the client's socket, inside the fault
        reply, _, _ = client.attempt(ECHO, {"nonce": nonce()})
        assert reply is None, f"{CLAUSE}: a request crossed a {kind}"
    healed = chaos_rig.heal(fault)

    def works() -> bool:
        return client.attempt(ECHO, {"nonce": 0})[0] is not None

    chaos_rig.wait_until(works, timeout=_RECOVER_S,
                         what=f"{CLAUSE}: an authenticated request after the {kind} healed")
    record_property("recovered_after_ms", round((time.monotonic() - healed) * 1000))
    n = nonce()
    assert client.request(ECHO, {"nonce": n}).get("nonce") == n


@pytest.mark.clause(CLAUSE)
@pytest.mark.parametrize("keys", ["same", "new"])
def test_server_restarted_behind_a_partition(
    chaos_rig: ChaosRig, control_spec: ControlSpec,
    record_property: Callable[[str, object], None], keys: str,
) -> None:
    """Same keys: the client is served again within the recovery bound after the heal.
    New server key (the client's key still allowed): the client, pinning the old server
    key, gets no reply and none of its requests reaches a handler."""
    if not control_spec.capabilities.authentication:
        pytest.skip(f"{CLAUSE}: requires capability authentication (see the CTL-8 tests)")
    creds = SuiteCredentials.generate()
    chaos_rig.credentials = creds
    chaos_rig.restart_server()  # now a CURVE server
    client = chaos_rig.client()
    chaos_rig.wait_until(lambda: client.attempt(ECHO, {"nonce": 0})[0] is not None,
                         timeout=_RECOVER_S, what=f"{CLAUSE}: a first request over CURVE")
    fault = chaos_rig.partition()
    if keys == "new":
        chaos_rig.credentials = SuiteCredentials(KeyPair.generate(), creds.client)
    chaos_rig.restart_server()
    healed = chaos_rig.heal(fault)
    if keys == "same":
        chaos_rig.wait_until(lambda: client.attempt(ECHO, {"nonce": 0})[0] is not None,
                             timeout=_RECOVER_S,
                             what=f"{CLAUSE}: a request after the server restarted behind a "
                             "partition with the same keys")
        record_property("recovered_after_ms", round((time.monotonic() - healed) * 1000))
        return
    sent: set[object] = set()
    deadline = time.monotonic() + _RECOVER_S
    while time.monotonic() < deadline:
        n = nonce()
        sent.add(n)
        reply, _, _ = client.attempt(ECHO, {"nonce": n})
        assert reply is None, (
            f"{CLAUSE}: the client got the reply {reply!r} from the server restarted with a new "
            "key, although it pins the old server key")
    reached = [s for s in chaos_rig.handlers.seen(type=ECHO) if s.nonce in sent]
    assert not reached, (f"{CLAUSE}: {len(reached)} request(s) of a client pinning the old "
                         "server key reached the server restarted with a new key")
