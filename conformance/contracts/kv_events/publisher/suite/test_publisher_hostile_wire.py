"""EVT-11: hostile bytes on the publisher's ports cannot stop it, starve readers or grow it.

Plain TCP clients write the streams of :mod:`conformance.testing.hostile_wire`
(random and truncated greetings, garbage NULL and CURVE handshakes, a CURVE
HELLO with random boxes, a command and a frame announcing 1 GiB followed by
1 MiB of real bytes) to both the PUB and the replay port, many copies each,
with CURVE off and, where the publisher declares authentication, on. The
honest subscriber keeps receiving every batch, a replay still completes,
and the peak RSS growth of the process (the publisher runs in it) is
recorded as ``rss_growth_kb`` and bounded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from conformance.contracts.kv_events.publisher.peers import Rig, make_batch
from conformance.contracts.kv_events.spec import PublisherSpec
from conformance.testing.credentials import SuiteCredentials, as_client
from conformance.testing.hostile_wire import (
    OVERSIZE_PAYLOAD,
    PeakRss,
    hostile_streams,
    send_streams,
)

CLAUSE = "EVT-11"
#: Connections per hostile stream and port.
COPIES = 24
#: Half of what one oversize stream's copies on one port cost if buffered (libzmq's
#: own buffers for the hundreds of held connections cost a few MiB).
RSS_BOUND_KB = COPIES * OVERSIZE_PAYLOAD // 1024 // 2
_SEED = 0xE711


def _port(endpoint: str) -> int:
    return int(endpoint.rpartition(":")[2])


@pytest.mark.clause(CLAUSE)
@pytest.mark.parametrize("mode", ["plain", "curve"])
def test_hostile_handshakes_and_oversize_frames(kv_publisher_spec: PublisherSpec, mode: str,
                                                record_property: Callable[[str, object], None]
                                                ) -> None:
    options: dict[str, Any] = {}
    secure = None
    if mode == "curve":
        if not kv_publisher_spec.capabilities.authentication:
            pytest.skip(f"{CLAUSE} with CURVE: the publisher does not declare authentication "
                        "(the plain variant runs)")
        creds = SuiteCredentials.generate()
        options = creds.server_kwargs()
        secure = as_client(creds.client, creds.server.public)
    with Rig(kv_publisher_spec, clause=CLAUSE, **options) as rig:
        sub = rig.sub(secure=secure)
        rig.join(sub)
        for _ in range(3):
            rig.publish(make_batch())
        rig.wait_all(sub)
        # Before any hostile byte: a replay that is not served now is not theirs to answer
        # for (authentication is EVT-10's, replay itself EVT-4's).
        before = rig.replay_client(secure=secure)
        before.request(len(rig.model) - 3)
        rig.check_served(before, len(rig.model) - 3, "EVT-10" if secure else "EVT-4")
        with PeakRss() as memory:
            for endpoint, kind in ((rig.endpoint, b"SUB"), (rig.replay_endpoint, b"DEALER")):
                send_streams("127.0.0.1", _port(endpoint),
                             hostile_streams(_SEED, socket_type=kind), copies=COPIES)
            for _ in range(10):
                rig.publish(make_batch())
            rig.wait_all(sub)
        rig.check_stream(sub, clause=CLAUSE, contiguous=True)
        client = rig.replay_client(secure=secure)
        # From three back, so a replay that starts late (EVT-4's defect) still answers:
        # EVT-11 asks that replays are served, not where they start.
        start = (rig.offset or 0) + len(rig.model) - 3
        client.request(start)
        rig.check_served(client, start, CLAUSE)
    record_property("rss_growth_kb", memory.growth_kb)
    print(f"{CLAUSE} ({mode}): peak RSS growth {memory.growth_kb} KiB (bound {RSS_BOUND_KB})")
    if memory.growth_kb is not None:
        assert memory.growth_kb <= RSS_BOUND_KB, (
            f"{CLAUSE}: the publisher's process grew by {memory.growth_kb} KiB while raw peers "
            f"sent frames announcing 1 GiB (bound {RSS_BOUND_KB} KiB): with no receive limit "
            "(ZMQ_MAXMSGSIZE) libzmq buffers every byte a stranger sends")
