"""EVS-7 (chaos): a silent partition between publisher and subscriber heals gap-free.

Both of the subscriber's connections (to the PUB and to the replay ROUTER)
go through toxiproxy. A silent partition (``timeout`` toxics with timeout
0: no byte passes, nothing is closed) swallows batches published while it
lasts; healing it closes the connections it held, as a cut that heals
leaves broken TCP streams behind. Afterwards the publisher either stays
quiet (only a subscriber that checks on its own, by heartbeat or an idle
replay, can learn what it missed) or publishes again (the gap shows).
Either way the application must end with every batch the publisher still
retains, once, in order, within :data:`HEAL_BOUND_S` of the heal.

EVS-10 under the same faults, with CURVE on: the partition heals gap-free over
authenticated connections; a publisher restarted behind a partition with the same
keys is heard after the heal, one restarted with a new server key is refused by the
subscriber that pins the old one.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import pytest

from conformance.contracts.kv_events.subscriber.peer import FakePublisher, Session, SubscriberSpec
from conformance.testing.credentials import KeyPair, SuiteCredentials, as_server

pytest.importorskip("toxiproxy", reason="chaos extras not installed")

from chaos.fixtures import toxiproxy, toxiproxy_reset
from chaos.proxy import Proxy, Toxiproxy

__all__ = ["toxiproxy", "toxiproxy_reset"]

#: From the heal to the last missed batch delivered: reconnect, a heartbeat
#: or idle check, a replay and its retries fit with room for a loaded machine.
HEAL_BOUND_S = 10.0
#: How long the partition lasts: longer than the suite's heartbeat timeout
#: (500 ms) and the reference's idle check (1 s), so both act while it holds.
PARTITION_S = 1.5


@contextlib.contextmanager
def _partitioned(*proxies: Proxy) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for proxy in proxies:
            stack.enter_context(proxy.partitioned())
        yield


@pytest.mark.clause("EVS-7")
@pytest.mark.chaos
@pytest.mark.parametrize("after_heal", ["quiet", "traffic"])
def test_silent_partition_heals_gap_free(
    kv_subscriber_spec: SubscriberSpec, toxiproxy: Toxiproxy, after_heal: str
) -> None:
    proxies: list[Proxy] = []

    def through_proxies(fake: FakePublisher) -> tuple[str, str]:
        for endpoint in (fake.endpoint, fake.replay_endpoint):
            upstream = endpoint.removeprefix("tcp://")
            proxies.append(toxiproxy.create_proxy(toxiproxy.unique_name("evs7"), upstream))
        return tuple(f"tcp://{p.listen}" for p in proxies)  # type: ignore[return-value]

    try:
        with Session(kv_subscriber_spec, clause="EVS-7", route=through_proxies) as s:
            s.subscribed()
            fake = s.fake
            before = [fake.publish() for _ in range(3)]
            s.drive_until(lambda: s.seqs() == before, timeout=5.0,
                          what="the batches before the partition")
            with _partitioned(*proxies):
                during = [fake.publish() for _ in range(5)]
                s.drive_for(PARTITION_S)
            expected = before + during
            if after_heal == "traffic":
                s.subscribed(count=2, timeout=HEAL_BOUND_S)
                expected.append(fake.publish())
            s.drive_until(lambda: len(s.delivered) >= len(expected), timeout=HEAL_BOUND_S,
                          what=f"the {len(during)} batches published during the partition "
                          f"(publisher {after_heal} after the heal)")
            s.drive_for(0.05)
            s.check_delivered([(seq, fake.batches[seq]) for seq in expected])
    finally:
        for proxy in proxies:
            proxy.destroy()


# -- EVS-10 under faults: authentication across a partition and a publisher restart ----

#: How long a publisher restarted with a new key publishes to a subscriber pinning the
#: old one: several reconnects and replay timeouts of any sane subscriber.
NEW_KEY_WINDOW_S = 3.0
_AUTH_BATCHES = 3


def _require_authentication(spec: SubscriberSpec) -> None:
    if not spec.capabilities.get("authentication"):
        pytest.skip("EVS-10: requires capability authentication (see the EVS-10 tests)")


def _proxied(toxiproxy: Toxiproxy, proxies: list[Proxy]
             ) -> Callable[[FakePublisher], tuple[str, str]]:
    def through_proxies(fake: FakePublisher) -> tuple[str, str]:
        for endpoint in (fake.endpoint, fake.replay_endpoint):
            upstream = endpoint.removeprefix("tcp://")
            proxies.append(toxiproxy.create_proxy(toxiproxy.unique_name("evs10"), upstream))
        return tuple(f"tcp://{p.listen}" for p in proxies)  # type: ignore[return-value]

    return through_proxies


@contextlib.contextmanager
def _authenticated_session(
    spec: SubscriberSpec, toxiproxy: Toxiproxy
) -> Iterator[tuple[Session, list[Proxy], list[int]]]:
    """An EVS-10 session over CURVE whose endpoints go through proxies (destroyed at the
    end), with the fake publisher's first batches delivered: ``(session, proxies, their
    seqs)``. Skipped unless the subscriber declares authentication."""
    _require_authentication(spec)
    creds = SuiteCredentials.generate()
    proxies: list[Proxy] = []
    try:
        with Session(spec, clause="EVS-10", route=_proxied(toxiproxy, proxies),
                     fake_secure=as_server(creds.server), **creds.client_kwargs()) as s:
            s.subscribed()
            before = [s.fake.publish() for _ in range(_AUTH_BATCHES)]
            s.drive_until(lambda: s.seqs() == before, timeout=5.0,
                          what="the batches before the partition (over CURVE)")
            yield s, proxies, before
    finally:
        for proxy in proxies:
            proxy.destroy()


@pytest.mark.clause("EVS-10")
@pytest.mark.chaos
def test_authenticated_subscriber_heals_gap_free_after_a_partition(
    kv_subscriber_spec: SubscriberSpec, toxiproxy: Toxiproxy
) -> None:
    """EVS-7 with CURVE on: the handshakes after the heal are authenticated ones, and the
    batches missed during the partition still arrive within the same bound."""
    with _authenticated_session(kv_subscriber_spec, toxiproxy) as (s, proxies, before):
        fake = s.fake
        with _partitioned(*proxies):
            during = [fake.publish() for _ in range(5)]
            s.drive_for(PARTITION_S)
        s.subscribed(count=2, timeout=HEAL_BOUND_S)
        expected = [*before, *during, fake.publish()]
        s.drive_until(lambda: len(s.delivered) >= len(expected), timeout=HEAL_BOUND_S,
                      what="the batches published during the partition, over CURVE")
        s.drive_for(0.05)
        s.check_delivered([(seq, fake.batches[seq]) for seq in expected])


@pytest.mark.clause("EVS-10")
@pytest.mark.chaos
@pytest.mark.parametrize("keys", ["same", "new"])
def test_publisher_restarted_behind_a_partition(
    kv_subscriber_spec: SubscriberSpec, toxiproxy: Toxiproxy, keys: str
) -> None:
    """Same keys: the new incarnation's batches are delivered after the heal. A new server
    key: the subscriber, pinning the old one, delivers nothing of it and completes no
    handshake with it (no subscription, no replay request reaches it)."""
    with _authenticated_session(kv_subscriber_spec, toxiproxy) as (s, proxies, before):
        fake = s.fake
        with _partitioned(*proxies):
            if keys == "new":
                fake.secure = as_server(KeyPair.generate())
            fake.restart(salt=1)
            earlier_requests = len(fake.requests)
            s.drive_for(PARTITION_S)
        if keys == "same":
            s.subscribed(timeout=HEAL_BOUND_S)
            seqs = [fake.publish() for _ in range(_AUTH_BATCHES)]
            s.drive_until(lambda: s.seqs()[-_AUTH_BATCHES:] == seqs, timeout=HEAL_BOUND_S,
                          what="the batches of the publisher restarted behind a partition "
                          "with the same keys")
            return
        deadline = time.monotonic() + NEW_KEY_WINDOW_S
        while time.monotonic() < deadline:
            fake.publish()
            s.drive_for(0.05)
        late = s.delivered[len(before):]
        assert not late, (
            f"EVS-10: the subscriber delivered {len(late)} batches of the publisher "
            "restarted with a new server key, although it pins the old one")
        new_requests = len(fake.requests) - earlier_requests
        assert not fake.subscriptions and not new_requests, (
            "EVS-10: the subscriber completed a handshake with the publisher restarted with "
            f"a new server key ({fake.subscriptions} subscriptions, {new_requests} replay "
            "requests reached it)")
