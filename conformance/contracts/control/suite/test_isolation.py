"""CTL-7: slow handlers, vanished and stalled clients never block the others.

Head-of-line policy (a server capability): ``serial`` servers may delay a
request queued behind a slow handler by that handler's duration, no more;
``concurrent`` servers may not delay it at all. Either way, a client that
vanished mid-request or stopped reading its replies costs the others
nothing: the server must drop (or queue) replies it cannot deliver, never
wait for them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec
import pytest

from conformance.config.profiles import scaled
from conformance.contracts.control.harness import (
    ECHO,
    SLACK_MS,
    SLOW,
    WireClient,
    error_text,
    nonce,
    rig,
)
from conformance.contracts.control.spec import ControlSpec

Recorder = Callable[[str, object], None]

_SLOW_MS = 300
#: A reply the other client must get after the slow request, by policy (ms).
_BOUND_MS = {"serial": _SLOW_MS + SLACK_MS, "concurrent": SLACK_MS}
_REPLY_S = 2.0


def _timed_probe(peer: WireClient, bound_ms: float, what: str) -> float:
    """Another client's ``ZMQC_ECHO`` (not PING: a missing PING handler is CTL-1's)."""
    started = time.monotonic()
    reply = peer.ask({"type": ECHO, "nonce": -1}, max(_REPLY_S, bound_ms / 1000 * 2))
    took = (time.monotonic() - started) * 1000
    assert reply is not None and error_text(reply) is None, (
        f"CTL-7: {what}: another client's request got {reply!r:.80} (no reply or an error)")
    assert took <= bound_ms, (
        f"CTL-7: {what}: another client's request took {took:.0f} ms; the declared "
        f"head-of-line policy allows {bound_ms:.0f} ms")
    return took


def _policy_bound(spec: ControlSpec) -> float:
    return _BOUND_MS[spec.capabilities.head_of_line]


@pytest.mark.clause("CTL-7")
def test_ctl7_slow_handler_delays_others_only_by_policy(
    control_spec: ControlSpec, record_property: Recorder
) -> None:
    control_spec.require("server", "CTL-7")
    with rig(control_spec) as r:
        slow, other = r.wire(), r.wire()
        assert other.ask({"type": ECHO}, _REPLY_S) is not None, "CTL-7: no reply at all"
        rid = nonce().to_bytes(8, "big")
        slow.send([rid, b"", msgspec.msgpack.encode({"type": SLOW, "ms": _SLOW_MS})])
        r.wait_until(lambda: r.handlers.seen(type=SLOW), timeout=_REPLY_S,
                     what="the slow handler to start")
        took = _timed_probe(other, _policy_bound(control_spec), "during a slow handler")
        got = slow.recv(_REPLY_S)
        assert got is not None and got[0] == rid, "CTL-7: the slow request itself got no reply"
        record_property("other_client_wait_ms", round(took))
        r.check()


@pytest.mark.clause("CTL-7")
def test_ctl7_client_vanishing_mid_request_costs_nothing(control_spec: ControlSpec) -> None:
    control_spec.require("server", "CTL-7")
    with rig(control_spec) as r:
        other = r.wire()
        for i in range(scaled(3)):
            gone = WireClient(r.client_endpoint)
            gone.send([b"\x00" * 8, b"", _encode({"type": SLOW, "ms": 100, "nonce": i})])
            gone.send([b"\x01" * 8, b"", _encode({"type": ECHO, "nonce": i})])
            gone.close()  # vanishes with two requests in flight
            _timed_probe(other, _policy_bound(control_spec) + 100, f"vanished client {i}")
        for _ in range(3):
            n = nonce()
            reply = other.ask({"type": ECHO, "nonce": n}, _REPLY_S)
            assert isinstance(reply, dict) and reply.get("nonce") == n, (
                f"CTL-7: after clients vanished mid-request, {ECHO} got {reply!r:.80}")
        r.check()


@pytest.mark.clause("CTL-7")
def test_ctl7_client_that_never_reads_cannot_stall_the_server(
    control_spec: ControlSpec,
) -> None:
    """A client floods requests with large replies and never reads one."""
    control_spec.require("server", "CTL-7")
    with rig(control_spec) as r:
        stalled = r.wire(rcvhwm=1, rcvbuf=4096, sndhwm=0)
        other = r.wire()
        blob = b"x" * 8192
        count = scaled(2500)
        for i in range(count):
            stalled.send([i.to_bytes(8, "big"), b"", _encode({"type": ECHO, "data": blob})])
        r.wait_until(lambda: len(r.handlers.seen(type=ECHO)) >= count, timeout=10.0,
                     what=f"the server to take in the {count} requests of the stalled client")
        _timed_probe(other, SLACK_MS + 500, "while a client's replies pile up unread")
        r.check()


def _encode(value: object) -> bytes:
    return msgspec.msgpack.encode(value)

