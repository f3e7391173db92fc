"""PIPE-14: hostile bytes on the client's ports cannot stop it, starve its engines or grow it.

The client binds all three sockets of the pipeline (handshake ROUTER, request
ROUTER, output PULL), so it is the side a hostile peer on the network
reaches; an engine binds nothing (its exposure is its client's frames,
PIPE-7, and an impostor at its client's address, PIPE-13). Plain TCP peers
write the streams of :mod:`conformance.testing.hostile_wire` (random and
truncated greetings, garbage NULL and CURVE handshakes, a CURVE HELLO with
random boxes, a command and a frame announcing 1 GiB followed by 1 MiB of
real bytes), many copies of each, to each port, with CURVE off and, where
the implementation declares authentication, on. Then a flood of peers
with distinct identities (CURVE ones with keys of their own when CURVE is
on) writes garbage to every port. A keyed engine's requests are served
exactly before and afterwards, and the peak RSS growth of the process (the
client runs in it; the engine in a process of its own) is recorded as
``rss_growth_kb`` and bounded.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import zmq

from conformance.contracts.engine_pipeline.harness import Rig, Streams, guarded, request_id
from conformance.testing.credentials import KeyPair, SuiteCredentials, as_client
from conformance.testing.hostile_wire import (
    OVERSIZE_PAYLOAD,
    PeakRss,
    hostile_streams,
    send_streams,
)

CLAUSE = "PIPE-14"
COPIES = 24
#: Half of what the oversize stream's copies cost on one port if buffered.
RSS_BOUND_KB = COPIES * OVERSIZE_PAYLOAD // 1024 // 2
#: Peers of the identity flood per port, and garbage messages each.
FLOOD_PEERS, FLOOD_MESSAGES = 40, 10
_SEED = 0x9114
#: What each of the client's sockets expects its peers to be.
_PEER_TYPES: Mapping[str, tuple[int, bytes]] = {
    "handshake": (zmq.DEALER, b"DEALER"),
    "input": (zmq.DEALER, b"DEALER"),
    "output": (zmq.PUSH, b"PUSH"),
}


def _port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def _identity_flood(addresses: Mapping[str, str], server_key: bytes | None) -> None:
    """``FLOOD_PEERS`` peers per port, each with an identity (and a CURVE key) of its own."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        for role, (kind, _) in _PEER_TYPES.items():
            for n in range(FLOOD_PEERS):
                sock = ctx.socket(kind)
                sock.setsockopt(zmq.LINGER, 0)
                if kind == zmq.DEALER:
                    sock.setsockopt(zmq.ROUTING_ID, f"flood-{role}-{n}".encode())
                if server_key is not None:
                    as_client(KeyPair.generate(), server_key)(sock)
                sock.connect(addresses[role])
                for _ in range(FLOOD_MESSAGES):
                    with contextlib.suppress(zmq.Again):
                        sock.send_multipart([os.urandom(1), os.urandom(24)], zmq.NOBLOCK)
    finally:
        ctx.destroy(linger=0)


def _served(rig: Rig, client: Any, tag: str, streams: Streams) -> None:
    rid = request_id(f"p14-{tag}-")
    guarded("add()", lambda: client.add(rid, [1], 4), 5.0)
    rig.collect(client, [rid], clause=CLAUSE, streams=streams)
    streams.check(rid, CLAUSE, max_tokens=4)


@pytest.mark.clause(CLAUSE)
@pytest.mark.parametrize("mode", ["plain", "curve"])
def test_hostile_handshakes_oversize_frames_and_floods(
    rig: Rig, mode: str, record_property: Callable[[str, object], None],
) -> None:
    rig.spec.require("client", CLAUSE)
    creds: SuiteCredentials | None = None
    if mode == "curve":
        if not rig.spec.capabilities.authentication:
            pytest.skip(f"{CLAUSE} with CURVE: the implementation does not declare "
                        "authentication (the plain variant runs)")
        creds = SuiteCredentials.generate()
    server_kwargs = creds.server_kwargs() if creds else {}
    client = rig.client(clause=CLAUSE, **server_kwargs)
    process = rig.engine([client.addresses["handshake"]], under_test=rig.spec.engine is not None,
                         clause=CLAUSE, **(creds.client_kwargs() if creds else {}))
    rig.ready(client, process, clause=CLAUSE)
    addresses = {role: str(client.addresses[role]) for role in _PEER_TYPES}
    streams = Streams()
    _served(rig, client, "before", streams)
    with PeakRss() as memory:
        for offset, (role, (_, socket_type)) in enumerate(_PEER_TYPES.items()):
            send_streams("127.0.0.1", _port(addresses[role]),
                         hostile_streams(_SEED + offset, socket_type=socket_type),
                         copies=COPIES)
        _identity_flood(addresses, creds.server.public if creds else None)
        try:
            _served(rig, client, "after", streams)
        except AssertionError as exc:
            raise AssertionError(f"{exc} (after hostile bytes and a flood on the client's "
                                 f"ports; {process.describe()})") from None
        except Exception as exc:
            raise AssertionError(
                f"{CLAUSE}: after hostile bytes and a flood on its ports the client failed "
                f"with {type(exc).__name__}: {exc}; {process.describe()}") from exc
    assert process.running, f"{CLAUSE}: the engine ended: {process.describe()}"
    record_property("rss_growth_kb", memory.growth_kb)
    print(f"{CLAUSE} ({mode}): peak RSS growth {memory.growth_kb} KiB (bound {RSS_BOUND_KB})")
    if memory.growth_kb is not None:
        assert memory.growth_kb <= RSS_BOUND_KB, (
            f"{CLAUSE}: the client's process grew by {memory.growth_kb} KiB while raw peers "
            f"sent frames announcing 1 GiB (bound {RSS_BOUND_KB} KiB): frames past the receive "
            "limit (ZMQ_MAXMSGSIZE) must be refused at their header, not buffered")
