"""CTL-7: slow handlers, vanished and stalled clients never block the others.

Head-of-line policy (a server capability): ``serial`` servers may delay a
request queued behind a slow handler by that handler's duration, no more;
``concurrent`` servers may not delay it at all. Either way, a client that
vanished mid-request or stopped reading its replies costs the others
nothing: the server must drop (or queue) replies it cannot deliver, never
wait for them.

The slow handler is long enough that the policies are told apart with a
wide margin on a loaded machine: ``serial`` allows the handler's 300 ms plus
slack; ``concurrent`` allows the slack alone, and its slow handler takes
1200 ms, so a server that declares ``concurrent`` but serialises makes the
other client wait about 1200 ms against a 250 ms bound (not 300 against 250).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from conformance.config.profiles import scaled
from conformance.contracts.control.harness import (
    ECHO,
    SLACK_MS,
    SLOW,
    Rig,
    WireClient,
    nonce,
    rig,
    suite_body,
)
from conformance.contracts.control.spec import ControlSpec

Recorder = Callable[[str, object], None]

#: The slow handler's duration by policy (ms): long where the bound is short.
_SLOW_MS = {"serial": 300, "concurrent": 1200}
#: A reply the other client must get after the slow request, by policy (ms).
_BOUND_MS = {"serial": _SLOW_MS["serial"] + SLACK_MS, "concurrent": SLACK_MS}
_REPLY_S = 2.0


def _timed_probe(peer: WireClient, bound_ms: float, what: str) -> float:
    """Another client's ``ZMQC_ECHO`` (not PING: a missing PING handler is CTL-1's)."""
    started = time.monotonic()
    reply = peer.call(ECHO, {"nonce": -1}, max(_REPLY_S, bound_ms / 1000 * 2))
    took = (time.monotonic() - started) * 1000
    assert reply is not None and reply.error is None, (
        f"CTL-7: {what}: another client's request got "
        f"{'no reply' if reply is None else reply.error!r:.80} (no reply or an error)")
    assert took <= bound_ms, (
        f"CTL-7: {what}: another client's request took {took:.0f} ms; the declared "
        f"head-of-line policy allows {bound_ms:.0f} ms")
    return took


def _policy_bound(spec: ControlSpec) -> float:
    return _BOUND_MS[spec.capabilities.head_of_line]


def _request(r: Rig, rid: int, kind: str, body: dict[str, object]) -> list[bytes]:
    """The frames of one suite request under the declared profile."""
    return r.spec.profile.request(rid, kind, suite_body(kind, body), r.spec.capabilities.codes())


@pytest.mark.clause("CTL-7")
def test_ctl7_slow_handler_delays_others_only_by_policy(
    server_spec: ControlSpec, record_property: Recorder
) -> None:
    server_spec.require_added_handlers("CTL-7", "a slow handler")
    slow_ms = _SLOW_MS[server_spec.capabilities.head_of_line]
    with rig(server_spec, clause="CTL-7") as r:
        slow, other = r.wire(), r.wire()
        assert other.call(ECHO, {}, _REPLY_S) is not None, "CTL-7: no reply at all"
        rid = nonce()
        slow.send(_request(r, rid, SLOW, {"ms": slow_ms}))
        r.wait_until(lambda: r.handlers.seen(type=SLOW), timeout=_REPLY_S,
                     what="the slow handler to start")
        took = _timed_probe(other, _policy_bound(server_spec),
                            f"during a {slow_ms} ms handler of another client")
        got = slow.recv(_REPLY_S + slow_ms / 1000)
        assert got is not None and got[0] == server_spec.profile.correlation(rid), (
            "CTL-7: the slow request itself got no reply")
        record_property("other_client_wait_ms", round(took))
        record_property("slow_handler_ms", slow_ms)
        r.check()


@pytest.mark.clause("CTL-7")
def test_ctl7_client_vanishing_mid_request_costs_nothing(server_spec: ControlSpec) -> None:
    server_spec.require_added_handlers("CTL-7", "a slow handler")
    with rig(server_spec, clause="CTL-7") as r:
        other = r.wire()
        for i in range(scaled(3)):
            gone = WireClient(r.client_endpoint, profile=server_spec.profile)
            gone.send(_request(r, nonce(), SLOW, {"ms": 100, "nonce": i}))
            gone.send(_request(r, nonce(), ECHO, {"nonce": i}))
            gone.close()  # vanishes with two requests in flight
            _timed_probe(other, _policy_bound(server_spec) + 100, f"vanished client {i}")
        for _ in range(3):
            n = nonce()
            reply = other.call(ECHO, {"nonce": n}, _REPLY_S)
            value = None if reply is None else reply.value
            assert isinstance(value, dict) and value.get("nonce") == n, (
                f"CTL-7: after clients vanished mid-request, {ECHO} got {value!r:.80}")
        r.check()


@pytest.mark.clause("CTL-7")
def test_ctl7_client_that_never_reads_cannot_stall_the_server(
    server_spec: ControlSpec,
) -> None:
    """A client floods requests with large replies and never reads one."""
    server_spec.require_added_handlers("CTL-7", "the suite's echo handler")
    with rig(server_spec, clause="CTL-7") as r:
        stalled = r.wire(rcvhwm=1, rcvbuf=4096, sndhwm=0)
        other = r.wire()
        blob = b"x" * 8192
        count = scaled(2500)
        for i in range(count):
            stalled.send(_request(r, i, ECHO, {"data": blob}))
        r.wait_until(lambda: len(r.handlers.seen(type=ECHO)) >= count, timeout=10.0,
                     what=f"the server to take in the {count} requests of the stalled client")
        _timed_probe(other, SLACK_MS + 500, "while a client's replies pile up unread")
        r.check()

