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
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from conformance.contracts.kv_events.subscriber.peer import FakePublisher, Session, SubscriberSpec
from conformance.contracts.kv_events.subscriber.suite._marks import clause

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


@clause("EVS-7")
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
