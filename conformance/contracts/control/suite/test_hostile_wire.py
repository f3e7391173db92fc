"""CTL-9: hostile bytes on the server's port cannot stop it, starve clients or grow it.

Plain TCP clients write the streams of :mod:`conformance.testing.hostile_wire`
(random and truncated greetings, garbage NULL and CURVE handshakes, a CURVE
HELLO with random boxes, a command and a frame announcing 1 GiB followed by
1 MiB of real bytes), many copies of each, with CURVE off and, where the
implementation declares authentication, on. Then a flood of DEALERs with
distinct identities sends garbage requests. The honest client is served
afterwards, no hostile request reaches a handler, and the peak RSS growth
of the process (the server runs in it) is recorded as ``rss_growth_kb`` and
bounded.

The honest request is the suite's echo (with a nonce) where the server serves
the suite's handlers; where it does not (``added_handlers`` false, LMCache's
closed request enum), it is a declared request type other than PING with its
declared result: the suite's own types have no code on such a server's wire,
and a request it cannot serve says nothing about hostile bytes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

import pytest
import zmq

from conformance.contracts.control.harness import ECHO, Rig, nonce, rig
from conformance.contracts.control.spec import ControlSpec
from conformance.testing.credentials import SuiteCredentials
from conformance.testing.hostile_wire import (
    OVERSIZE_PAYLOAD,
    PeakRss,
    hostile_streams,
    send_streams,
)

CLAUSE = "CTL-9"
COPIES = 24
#: Half of what the oversize stream's copies cost if buffered.
RSS_BOUND_KB = COPIES * OVERSIZE_PAYLOAD // 1024 // 2
#: DEALERs of the identity flood, and garbage requests each.
FLOOD_PEERS, FLOOD_REQUESTS = 50, 20
_SEED = 0xC719
#: How long the honest declared request waits for its reply.
_REPLY_S = 2.0


def _identity_flood(endpoint: str) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        for n in range(FLOOD_PEERS):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.ROUTING_ID, f"flood-{n}".encode())
            sock.connect(endpoint)
            for _ in range(FLOOD_REQUESTS):
                with contextlib.suppress(zmq.Again):
                    sock.send_multipart([os.urandom(8), b"", os.urandom(24)], zmq.NOBLOCK)
    finally:
        ctx.destroy(linger=0)


def _declared_probe(r: Rig, when: str) -> None:
    """A declared request type other than PING (PING's own handler is CTL-1's question)
    from a fresh peer succeeds with its declared result. Before any hostile byte a failure
    is CTL-1's, after them this clause's."""
    caps = r.spec.capabilities
    others = [(k, dict(v)) for k, v in caps.request_types.items() if k != "PING"]
    kind, body = others[0] if others else ("PING", dict(caps.request_types["PING"]))
    clause = "CTL-1" if when == "before" else CLAUSE
    where = ("before any hostile byte" if when == "before"
             else "after hostile bytes and a flood")
    reply = r.wire().call(kind, body, _REPLY_S)
    assert reply is not None, (
        f"{clause}: the declared request {kind!r} {where}: no reply within {_REPLY_S} s")
    problem = r.spec.profile.success_problem(reply, caps.result_of(kind))
    assert problem is None, f"{clause}: the declared request {kind!r} {where}: {problem}"


@pytest.mark.clause(CLAUSE)
@pytest.mark.parametrize("mode", ["plain", "curve"])
def test_hostile_handshakes_oversize_frames_and_floods(
    control_spec: ControlSpec, mode: str, record_property: Callable[[str, object], None],
) -> None:
    control_spec.require("server", CLAUSE)
    creds = None
    if mode == "curve":
        if not control_spec.capabilities.authentication:
            pytest.skip(f"{CLAUSE} with CURVE: the implementation does not declare "
                        "authentication (the plain variant runs)")
        creds = SuiteCredentials.generate()
    echo = control_spec.capabilities.added_handlers
    with rig(control_spec, clause=CLAUSE, credentials=creds) as r:
        honest: set[int] = set()
        client: Any = None
        if echo:
            client = r.client("honest", register=False)
            body: dict[str, Any] = {"nonce": nonce(), "data": "before"}
            honest.add(body["nonce"])
            assert client.request(ECHO, body).get("nonce") == body["nonce"]
        else:
            _declared_probe(r, "before")
        with PeakRss() as memory:
            send_streams("127.0.0.1", r.port, hostile_streams(_SEED), copies=COPIES)
            _identity_flood(r.server_endpoint)
            r.drive(0.2)
            r.check()
            if echo:
                body = {"nonce": nonce(), "data": "after"}
                honest.add(body["nonce"])
                reply = client.request(ECHO, body)
                assert reply.get("nonce") == body["nonce"], (
                    f"{CLAUSE}: after hostile bytes and a flood the honest echo came back as "
                    f"{reply!r}")
            else:
                _declared_probe(r, "after")
        r.check()
        strangers = [s for s in r.handlers.seen() if s.nonce not in honest]
        assert not strangers, f"{CLAUSE}: hostile requests reached a handler: {strangers!r}"
    record_property("rss_growth_kb", memory.growth_kb)
    print(f"{CLAUSE} ({mode}): peak RSS growth {memory.growth_kb} KiB (bound {RSS_BOUND_KB})")
    if memory.growth_kb is not None:
        assert memory.growth_kb <= RSS_BOUND_KB, (
            f"{CLAUSE}: the server's process grew by {memory.growth_kb} KiB while raw peers "
            f"sent frames announcing 1 GiB (bound {RSS_BOUND_KB} KiB): frames past the receive "
            "limit (ZMQ_MAXMSGSIZE) must be refused at their header, not buffered")
