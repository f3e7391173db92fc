"""SEC-3: hostile bytes below ZeroMQ cannot crash the node, starve its peers or grow it.

Plain TCP clients write what :mod:`conformance.testing.hostile_wire` builds (random
and truncated greetings, NULL and CURVE handshakes with garbage commands, a
CURVE HELLO with random boxes, a command and a frame announcing 1 GiB
followed by 1 MiB of real bytes), many copies of each, to the node's bound
port, with CURVE off and, where the transport declares authentication, on.
Meanwhile and afterwards an honest peer keeps talking; no stranger becomes
a connection; the process's peak RSS growth over the attack (the node runs
in the suite's process) is recorded as ``rss_growth_kb`` and bounded by
:data:`RSS_BOUND_KB`: a receive limit refuses an oversize frame at its
header, while a node without one buffers every byte it is sent.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from conformance.contracts.p2p.harness import Cluster, handshake, receive
from conformance.contracts.p2p.process_nodes import is_process_spec
from conformance.contracts.p2p.spec import TransportSpec
from conformance.testing.credentials import SuiteCredentials
from conformance.testing.hostile_wire import (
    OVERSIZE_PAYLOAD,
    PeakRss,
    hostile_streams,
    send_streams,
)

#: Connections per hostile stream (two of the streams carry OVERSIZE_PAYLOAD each).
COPIES = 24
#: Allowed peak RSS growth: half of what one oversize stream's copies cost if buffered
#: (the reference grows by about 1 MiB).
RSS_BOUND_KB = COPIES * OVERSIZE_PAYLOAD // 1024 // 2
_SEED = 0x5EC3


@pytest.mark.clause("SEC-3")
@pytest.mark.parametrize("mode", ["plain", "curve"])
def test_hostile_handshakes_and_oversize_frames(zmq_transport_spec: TransportSpec, mode: str,
                                                record_property: Callable[[str, object], None]
                                                ) -> None:
    creds = None
    if mode == "curve":
        if not zmq_transport_spec.capabilities.authentication:
            pytest.skip("SEC-3 with CURVE: the transport does not declare authentication "
                        "(the plain variant runs)")
        creds = SuiteCredentials.generate()
    streams = hostile_streams(_SEED)
    with Cluster(zmq_transport_spec, credentials=creds) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        out, inbound = handshake(a, b)
        with PeakRss() as memory:
            written = send_streams(cluster.host, b.port, streams, copies=COPIES)
            cluster.drive(0.1)
            out.send({"honest": "after-hostile-bytes"})
            got = receive(inbound, 1, nodes=[a],
                          what="SEC-3: the honest peer's message after hostile handshakes")
        assert got == [{"honest": "after-hostile-bytes"}], f"SEC-3: received {got!r}"
        strangers = [c.peer_id for c in b.inbound if c.peer_id != a.local_id]
        assert not strangers, f"SEC-3: raw TCP clients became connections: {strangers!r}"
    record_property("rss_growth_kb", memory.growth_kb)
    record_property("streams_written", sum(written.values()))
    print(f"SEC-3 ({mode}): peak RSS growth {memory.growth_kb} KiB over "
          f"{len(streams) * COPIES} hostile connections (bound {RSS_BOUND_KB} KiB)")
    if is_process_spec(zmq_transport_spec) or memory.growth_kb is None:
        return  # the node's memory is in another process, or cannot be read here
    assert memory.growth_kb <= RSS_BOUND_KB, (
        f"SEC-3: the node's process grew by {memory.growth_kb} KiB while {COPIES} peers each "
        f"sent frames announcing 1 GiB (bound {RSS_BOUND_KB} KiB): frames past the receive "
        "limit must be refused at their header, not buffered")
