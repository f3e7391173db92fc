"""The server's side of the contract: CTL-1 (declared types), CTL-2 (bad input), CTL-3.

The suite talks to the server under test with raw pyzmq sockets
(:class:`~conformance.contracts.control.harness.WireClient`), so these tests
need no client and check the wire itself: a reply is a MessagePack map, an
error reply a map with a str ``error``, silence is a failure (a REQ peer
would wait forever).
"""

from __future__ import annotations

from typing import Any

import pytest
import zmq
from hypothesis import example, given
from hypothesis import strategies as st

from conformance.config import profiles
from conformance.contracts.control.harness import (
    BAD,
    ECHO,
    FAIL,
    Rig,
    error_text,
    nonce,
    rig,
)
from conformance.contracts.control.spec import ControlSpec
from conformance.testing.values import first_difference, msgpack_values

#: Longest wait for one reply from an idle server on loopback.
_REPLY_S = 2.0

_bodies = st.dictionaries(st.text(max_size=8).filter(lambda k: k not in ("type", "nonce")),
                          msgpack_values(max_leaves=8), max_size=4)


def _expect_success(reply: Any, clause: str, what: str) -> dict[str, Any]:
    assert reply is not None, (
        f"{clause}: {what}: no reply within {_REPLY_S} s (silence: a REQ peer waits forever)")
    assert isinstance(reply, dict), f"{clause}: {what}: the reply {reply!r:.120} is not a map"
    err = error_text(reply)
    assert err is None, f"{clause}: {what}: error reply {err!r}, expected success"
    return reply


def _expect_error(reply: Any, clause: str, what: str) -> str:
    assert reply is not None, (
        f"{clause}: {what}: no reply within {_REPLY_S} s; an unknown or malformed request "
        "must get an error reply, never silence (a REQ peer would wait forever)")
    err = error_text(reply)
    assert err is not None, (
        f"{clause}: {what}: the reply {reply!r:.120} is not an error reply (a map with a str "
        "'error')")
    return err


def _still_serving(r: Rig, clause: str) -> None:
    """A request from a fresh peer still succeeds and the serve loop is alive.

    The probe is the suite's own ``ZMQC_ECHO``, not ``PING``: a missing PING
    handler is CTL-1's failure, not this clause's.
    """
    r.check()
    n = nonce()
    reply = r.wire().ask({"type": ECHO, "nonce": n}, _REPLY_S)
    got = _expect_success(reply, clause, f"{ECHO} after the bad requests (the server must keep "
                                         "serving)")
    assert got.get("nonce") == n, f"{clause}: {ECHO} got another request's reply {got!r:.80}"
    r.check()


# -- CTL-1 ---------------------------------------------------------------------


@pytest.mark.clause("CTL-1")
@pytest.mark.parametrize("socket_kind", ["REQ", "DEALER"])
def test_ctl1_every_declared_type_succeeds(control_spec: ControlSpec, socket_kind: str) -> None:
    """Each declared request type, PING included, with its declared body, from REQ and DEALER."""
    control_spec.require("server", "CTL-1")
    types = control_spec.capabilities.request_types
    with rig(control_spec) as r:
        peer = r.wire(getattr(zmq, socket_kind))
        for kind, body in types.items():
            reply = peer.ask({"type": kind, **body}, _REPLY_S)
            _expect_success(reply, "CTL-1", f"declared request type {kind!r} from a {socket_kind}")
        r.check()


@pytest.mark.clause("CTL-1")
@profiles.suite_settings()
@given(bodies=st.lists(_bodies, min_size=1, max_size=5))
def test_ctl1_added_handlers_answer_their_own_requests(
    control_spec: ControlSpec, bodies: list[dict[str, Any]]
) -> None:
    """Handlers passed to the factory answer, with the request's own values, in order."""
    control_spec.require("server", "CTL-1")
    with rig(control_spec) as r:
        peer = r.wire()
        for body in bodies:
            n = nonce()
            reply = _expect_success(peer.ask({"type": ECHO, "nonce": n, "data": body}, _REPLY_S),
                                    "CTL-1", f"{ECHO} (a handler given to the factory)")
            assert reply.get("nonce") == n, (
                f"CTL-1: the reply {reply!r:.120} answers another request (nonce {n} expected)")
            diff = first_difference(body, reply.get("data"), "data")
            assert diff is None, f"CTL-1: the request reached the handler altered: {diff}"


# -- CTL-2 ---------------------------------------------------------------------


def _malformed() -> st.SearchStrategy[tuple[str, list[bytes]]]:
    """(description, frames after the routing id) of a malformed or unknown request."""
    enc = _encode
    unknown = st.text(min_size=1, max_size=12).filter(lambda t: not t.startswith("ZMQC_")
                                                      and t != "PING")
    return st.one_of(
        unknown.map(lambda t: (f"unknown type {t!r}", [b"", enc({"type": t})])),
        st.binary(min_size=1, max_size=24).filter(_undecodable)
        .map(lambda b: (f"undecodable payload {b!r}", [b"", b])),
        msgpack_values(max_leaves=4).filter(lambda v: not isinstance(v, dict))
        .map(lambda v: (f"payload {v!r:.40} is not a map", [b"", enc(v)])),
        st.just(("a map without 'type'", [b"", enc({"nonce": 1})])),
        st.sampled_from([1, None, b"PING", ["PING"]])
        .map(lambda t: (f"type {t!r} is not a str", [b"", enc({"type": t})])),
        st.just(("no payload frame after the delimiter", [b""])),
        st.integers(2, 4).map(lambda n: (f"{n} payload frames",
                                         [b"", *[enc({"type": "PING"})] * n])),
    )


def _encode(value: Any) -> bytes:
    import msgspec

    return msgspec.msgpack.encode(value)


def _undecodable(raw: bytes) -> bool:
    import msgspec

    try:
        msgspec.msgpack.decode(raw)
    except (msgspec.DecodeError, ValueError):
        return True
    return False


@pytest.mark.clause("CTL-2")
@profiles.suite_settings()
@given(cases=st.lists(_malformed(), min_size=1, max_size=4))
def test_ctl2_unknown_and_malformed_requests_get_error_replies(
    control_spec: ControlSpec, cases: list[tuple[str, list[bytes]]]
) -> None:
    control_spec.require("server", "CTL-2")
    with rig(control_spec) as r:
        peer = r.wire()
        for what, frames in cases:
            rid = nonce().to_bytes(8, "big")
            peer.send([rid, *frames])
            got = peer.recv(_REPLY_S)
            reply = None if got is None else _decode_last(got)
            _expect_error(reply, "CTL-2", what)
            assert got is not None and got[0] == rid, (
                f"CTL-2: {what}: the error reply lost the request's envelope ({got!r:.120}); "
                "envelope frames up to the delimiter are echoed")
        _still_serving(r, "CTL-2")


def _decode_last(frames: list[bytes]) -> Any:
    from conformance.contracts.control.harness import decode

    return decode(frames[-1])


@pytest.mark.clause("CTL-2")
def test_ctl2_unknown_type_from_a_req_socket_is_answered(control_spec: ControlSpec) -> None:
    """The real trap: a REQ worker sending an unknown type must not wait forever."""
    control_spec.require("server", "CTL-2")
    with rig(control_spec) as r:
        peer = r.wire(zmq.REQ)
        err = _expect_error(peer.ask({"type": "NO_SUCH_TYPE"}, _REPLY_S), "CTL-2",
                            "unknown type from a REQ socket")
        assert err, "CTL-2: the error reply's text is empty"
        _expect_success(peer.ask({"type": ECHO, "nonce": 1}, _REPLY_S), "CTL-2",
                        f"{ECHO} on the same REQ socket after the error reply")
        _still_serving(r, "CTL-2")


@pytest.mark.clause("CTL-2")
def test_ctl2_no_delimiter_and_raw_tcp_garbage(control_spec: ControlSpec) -> None:
    """A DEALER sending no delimiter gets ``[b"", error]``; a non-ZMTP TCP peer harms nothing."""
    import socket

    control_spec.require("server", "CTL-2")
    with rig(control_spec) as r:
        with socket.create_connection(("127.0.0.1", r.port), timeout=2) as raw:
            raw.sendall(b"\xff" * 64 + b"GET / HTTP/1.0\r\n\r\n")
            peer = r.wire()
            peer.send([_encode({"type": ECHO})])
            got = peer.recv(_REPLY_S)
            _expect_error(None if got is None else _decode_last(got), "CTL-2",
                          "a single frame without the empty delimiter")
        _still_serving(r, "CTL-2")


# -- CTL-3 ---------------------------------------------------------------------


@pytest.mark.clause("CTL-3")
@profiles.suite_settings()
@example(plan=[FAIL, BAD, ECHO])  # both kinds of failing handler, then a success: every run
@given(plan=st.lists(st.sampled_from([FAIL, BAD, ECHO]), min_size=1, max_size=6))
def test_ctl3_raising_handlers_get_error_replies(
    control_spec: ControlSpec, plan: list[str]
) -> None:
    """Handlers that raise (or return a non-map) get error replies; the rest still succeed."""
    control_spec.require("server", "CTL-3")
    with rig(control_spec) as r:
        peer = r.wire()
        for kind in plan:
            r.check()
            n = nonce()
            reply = peer.ask({"type": kind, "nonce": n}, _REPLY_S)
            if kind == ECHO:
                got = _expect_success(reply, "CTL-3", f"{ECHO} after failing handlers")
                assert got.get("nonce") == n, f"CTL-3: {ECHO} got another request's reply {got!r}"
            else:
                what = "a handler that raised" if kind == FAIL else "a handler returning a list"
                _expect_error(reply, "CTL-3", what)
        _still_serving(r, "CTL-3")
