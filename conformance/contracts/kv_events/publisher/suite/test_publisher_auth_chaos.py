"""EVT-10 under faults: authenticated subscribers are served again after a partition heals
and after a restart behind a partition with the same keys; strangers still get nothing.

The honest subscriber (the allowed client key, pinning the publisher's server
key) reaches the publisher's PUB endpoint through toxiproxy. A silent partition
(``timeout`` toxics: no byte passes, nothing closed) swallows what is published
while it lasts; healing it closes the connections it held, so the subscriber's
libzmq reconnects and shakes hands again, over CURVE. Within :data:`HEAL_BOUND_S`
of the heal the subscriber receives the publisher's batches again (the
publisher's restart behind the partition included: a restarted publisher that
bound plain would refuse it), and a plain stranger behind the same proxy still
receives nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import zmq

from conformance.contracts.kv_events.publisher.peers import Rig, Sub, make_batch
from conformance.contracts.kv_events.spec import PublisherSpec
from conformance.testing.credentials import SuiteCredentials, as_client

pytest.importorskip("toxiproxy", reason="chaos extras not installed")

from chaos.fixtures import toxiproxy, toxiproxy_reset
from chaos.proxy import Proxy, Toxiproxy

__all__ = ["toxiproxy", "toxiproxy_reset"]

CLAUSE = "EVT-10"
#: From the heal to the first batch received again: a reconnect (the suite's SUB retries
#: every 10 ms) and a CURVE handshake, with room for a loaded machine.
HEAL_BOUND_S = 10.0
#: How long the partition lasts.
PARTITION_S = 1.0
#: How long a stranger is given to receive something it must not (milliseconds).
_STRANGER_WINDOW_MS = 300


@pytest.fixture
def pub_proxy(toxiproxy: Toxiproxy) -> Iterator[list[Proxy]]:
    proxies: list[Proxy] = []
    yield proxies
    for proxy in proxies:
        proxy.destroy()


def _through(rig: Rig, toxiproxy: Toxiproxy, proxies: list[Proxy]) -> str:
    proxy = toxiproxy.create_proxy(toxiproxy.unique_name("evt10"),
                                   rig.endpoint.removeprefix("tcp://"))
    proxies.append(proxy)
    return f"tcp://{proxy.listen}"


def _sub(rig: Rig, endpoint: str,
         secure: Callable[[zmq.Socket[bytes]], None] | None = None) -> Sub:
    sub = Sub(rig.ctx, endpoint, rig.topic, secure=secure)
    rig.peers.append(sub)
    return sub


@pytest.mark.clause(CLAUSE)
@pytest.mark.chaos
@pytest.mark.parametrize("during", ["nothing", "restart"])
def test_authenticated_subscriber_is_served_after_the_heal(
    kv_publisher_spec: PublisherSpec, toxiproxy: Toxiproxy, pub_proxy: list[Proxy],
    during: str,
) -> None:
    if not kv_publisher_spec.capabilities.authentication:
        pytest.skip(f"{CLAUSE}: requires capability authentication (see the EVT-10 tests)")
    creds = SuiteCredentials.generate()
    with Rig(kv_publisher_spec, clause=CLAUSE, **creds.server_kwargs()) as rig:
        endpoint = _through(rig, toxiproxy, pub_proxy)
        sub = _sub(rig, endpoint, as_client(creds.client, creds.server.public))
        rig.join(sub)
        with pub_proxy[0].partitioned():
            if during == "restart":
                rig.restart()  # same endpoints, same keys
            for _ in range(5):
                rig.publish(make_batch())
            sub.drain(int(PARTITION_S * 1000))
        sub.got.clear()
        what = "a restart with the same keys behind it" if during == "restart" else "it"
        try:
            rig.join(sub, timeout=HEAL_BOUND_S)
        except AssertionError as exc:
            raise AssertionError(f"{exc} (the authenticated subscriber, after a partition "
                                 f"and {what} healed)") from None
        stranger = _sub(rig, endpoint)
        for _ in range(5):
            rig.publish(make_batch())
        stranger.drain(_STRANGER_WINDOW_MS)
        assert not stranger.got, (
            f"{CLAUSE}: a plain subscriber received {len(stranger.got)} batches after a "
            f"partition and {what} healed")
