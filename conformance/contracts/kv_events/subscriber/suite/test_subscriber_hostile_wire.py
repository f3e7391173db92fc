"""EVS-11: an impostor speaking garbage ZMTP on the publisher's endpoints cannot kill the
subscriber, and the real publisher is heard again once it is back.

The suite's publisher goes away and raw TCP servers take its two ports
(:class:`conformance.testing.hostile_wire.HostileListener`): every connection the
subscriber makes (libzmq reconnects, the idle resync's replay socket) is
answered with one of the hostile streams (random and truncated greetings,
garbage NULL and CURVE handshakes, a frame announcing 1 GiB followed by 1 MiB
of real bytes) and closed. ``poll()`` never raises and delivers nothing
meanwhile; when the real publisher comes back (a new incarnation), its
batches are delivered. CURVE off, and on where the subscriber declares
authentication. The peak RSS growth is recorded as ``rss_growth_kb``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from conformance.contracts.kv_events.subscriber.peer import Session, SubscriberSpec
from conformance.testing.credentials import SuiteCredentials, as_server
from conformance.testing.hostile_wire import HostileListener, PeakRss, hostile_streams

CLAUSE = "EVS-11"
_WINDOW_S = 2.0
_BATCHES = 5
_SEED = 0xE511


def _port(endpoint: str) -> int:
    return int(endpoint.rpartition(":")[2])


@pytest.mark.clause(CLAUSE)
@pytest.mark.parametrize("mode", ["plain", "curve"])
def test_garbage_from_an_impostor_on_both_endpoints(kv_subscriber_spec: SubscriberSpec,
                                                    mode: str,
                                                    record_property: Callable[[str, object], None]
                                                    ) -> None:
    options: dict[str, Any] = {}
    secure = None
    if mode == "curve":
        if not kv_subscriber_spec.capabilities.get("authentication"):
            pytest.skip(f"{CLAUSE} with CURVE: the subscriber does not declare "
                        "authentication (the plain variant runs)")
        creds = SuiteCredentials.generate()
        options = creds.client_kwargs()
        secure = as_server(creds.server)
    with Session(kv_subscriber_spec, clause=CLAUSE, fake_secure=secure, **options) as session:
        fake = session.fake
        session.subscribed()
        first = fake.publish()
        session.drive_until(lambda: bool(session.delivered), timeout=5.0,
                            what="the first batch before the impostor takes over")
        fake.go_away()
        streams = hostile_streams(_SEED, socket_type=b"PUB")
        with PeakRss() as memory, \
                HostileListener("127.0.0.1", _port(fake.endpoint), streams) as live, \
                HostileListener("127.0.0.1", _port(fake.replay_endpoint), streams) as replay:
            deadline = time.monotonic() + _WINDOW_S
            while time.monotonic() < deadline:
                session.poll_once()
        assert [seq for seq, _ in session.delivered] == [first], (
            f"{CLAUSE}: the subscriber delivered {session.seqs()} from an impostor's garbage")
        fake.restart(salt=1)
        session.subscribed()
        seqs = [fake.publish() for _ in range(_BATCHES)]
        session.drive_until(lambda: session.seqs()[-_BATCHES:] == seqs, timeout=5.0,
                            what="the real publisher's batches after the impostor left")
    record_property("rss_growth_kb", memory.growth_kb)
    record_property("hostile_connections", live.served + replay.served)
    print(f"{CLAUSE} ({mode}): {live.served} live and {replay.served} replay connections "
          f"answered with garbage; peak RSS growth {memory.growth_kb} KiB")
