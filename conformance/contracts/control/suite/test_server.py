"""The server's side of the contract: CTL-1 (declared types), CTL-2 (bad input), CTL-3.

The suite talks to the server under test with raw pyzmq sockets
(:class:`~conformance.contracts.control.harness.WireClient`) speaking the
declared wire profile (:mod:`conformance.contracts.control.wire`), so these
tests need no client and check the wire itself: a reply must decode under
the profile, an error reply must be one, and silence is a failure (a REQ
peer, or LMCache's waiting future, would wait forever). A server loop that
dies of a request is reported under the clause of the test that sent it.
"""

from __future__ import annotations

import socket
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
    nonce,
    rig,
)
from conformance.contracts.control.spec import ControlSpec
from conformance.contracts.control.wire import PROFILES, Reply
from conformance.testing.values import first_difference, msgpack_values, text

#: Longest wait for one reply from an idle server on loopback.
_REPLY_S = 2.0

_bodies = st.dictionaries(text(max_size=8).filter(lambda k: k not in ("type", "nonce")),
                          msgpack_values(max_leaves=8), max_size=4)


def _expect_success(spec: ControlSpec, reply: Reply | None, clause: str, what: str,
                    result: str = "any") -> Reply:
    assert reply is not None, (
        f"{clause}: {what}: no reply within {_REPLY_S} s (silence: a waiting peer waits forever)")
    problem = spec.profile.success_problem(reply, result)
    assert problem is None, f"{clause}: {what}: {problem}"
    return reply


def _expect_error(reply: Reply | None, clause: str, what: str) -> str:
    assert reply is not None, (
        f"{clause}: {what}: no reply within {_REPLY_S} s; an unknown or malformed request "
        "must get an error reply, never silence (a waiting peer would wait forever)")
    assert reply.error is not None, (
        f"{clause}: {what}: the reply {reply.value!r:.120} is not an error reply")
    return reply.error


def _probe_type(spec: ControlSpec) -> tuple[str, dict[str, Any]]:
    """A request that must succeed: the suite's ``ZMQC_ECHO``, else a declared type other
    than PING (a missing PING handler is CTL-1's failure, not this clause's), else PING."""
    if spec.capabilities.added_handlers:
        return ECHO, {"nonce": nonce()}
    others = [(k, dict(v)) for k, v in spec.capabilities.request_types.items() if k != "PING"]
    return others[0] if others else ("PING", dict(spec.capabilities.request_types["PING"]))


def _still_serving(r: Rig, clause: str) -> None:
    """A request from a fresh peer still succeeds and the server's loop is alive."""
    r.check()
    kind, body = _probe_type(r.spec)
    reply = r.wire().call(kind, body, _REPLY_S)
    got = _expect_success(r.spec, reply, clause, f"{kind} after the bad requests (the server "
                                                 "must keep serving)",
                          "map" if kind == ECHO else r.spec.capabilities.result_of(kind))
    if kind == ECHO:
        assert isinstance(got.value, dict) and got.value.get("nonce") == body["nonce"], (
            f"{clause}: {ECHO} got another request's reply {got.value!r:.80}")
    r.check()


# -- CTL-1 ---------------------------------------------------------------------


@pytest.mark.clause("CTL-1")
@pytest.mark.parametrize("socket_kind", ["REQ", "DEALER"])
def test_ctl1_every_declared_type_succeeds(server_spec: ControlSpec, socket_kind: str) -> None:
    """Each declared request type, PING included, with its declared body, from REQ and DEALER;
    the result has its declared type (``results``)."""
    spec = server_spec
    if socket_kind == "REQ" and not spec.profile.req_compatible:
        pytest.skip(f"CTL-1 from a REQ socket does not apply: wire profile {spec.profile.name} "
                    "has no empty delimiter, so REQ peers cannot speak it")
    caps = spec.capabilities
    with rig(spec, clause="CTL-1") as r:
        peer = r.wire(getattr(zmq, socket_kind))
        for kind, body in caps.request_types.items():
            reply = peer.call(kind, body, _REPLY_S)
            _expect_success(spec, reply, "CTL-1",
                            f"declared request type {kind!r} from a {socket_kind}",
                            caps.result_of(kind))
        r.check()


@pytest.mark.clause("CTL-1")
@profiles.suite_settings()
@given(bodies=st.lists(_bodies, min_size=1, max_size=5))
def test_ctl1_added_handlers_answer_their_own_requests(
    server_spec: ControlSpec, bodies: list[dict[str, Any]]
) -> None:
    """Handlers passed to the factory answer, with the request's own values, in order."""
    server_spec.require_added_handlers("CTL-1", "a handler given to the server factory")
    with rig(server_spec, clause="CTL-1") as r:
        peer = r.wire()
        for body in bodies:
            n = nonce()
            reply = _expect_success(server_spec, peer.call(ECHO, {"nonce": n, "data": body},
                                                           _REPLY_S),
                                    "CTL-1", f"{ECHO} (a handler given to the factory)", "map")
            value = reply.value
            assert value.get("nonce") == n, (
                f"CTL-1: the reply {value!r:.120} answers another request (nonce {n} expected)")
            diff = first_difference(body, value.get("data"), "data")
            assert diff is None, f"CTL-1: the request reached the handler altered: {diff}"


# -- CTL-2 ---------------------------------------------------------------------


@st.composite
def _malformed(draw: st.DrawFn, spec: ControlSpec) -> tuple[str, list[bytes]]:
    return draw(spec.profile.malformed(spec.capabilities.codes()))


@pytest.mark.clause("CTL-2")
@profiles.suite_settings()
@given(data=st.data())
def test_ctl2_unknown_and_malformed_requests_get_error_replies(
    server_spec: ControlSpec, data: st.DataObject
) -> None:
    """The profile's hostile inputs (unknown types, undecodable frames, wrong shapes): each
    gets an error reply carrying the request's id, then the server still serves."""
    spec = server_spec
    cases = data.draw(st.lists(_malformed(spec), min_size=1, max_size=4), label="cases")
    with rig(spec, clause="CTL-2") as r:
        peer = r.wire()
        for what, frames in cases:
            correlation = spec.profile.correlation(nonce())
            peer.send([correlation, *frames])
            got = peer.recv(_REPLY_S)
            assert got is None or got[0] == correlation, (
                f"CTL-2: {what}: the error reply lost the request's id ({got!r:.120}); the "
                "id frame is echoed")
            reply = None if got is None else spec.profile.read(got)
            assert got is None or reply is not None, (
                f"CTL-2: {what}: the reply {got!r:.160} does not decode under wire profile "
                f"{spec.profile.name} ({spec.profile.summary})")
            _expect_error(reply, "CTL-2", what)
        _still_serving(r, "CTL-2")


def _rep_envelope_only(spec: ControlSpec, what: str) -> None:
    if spec.profile.name != "rep-envelope":
        pytest.skip(f"CTL-2 {what} does not apply: it is a rep-envelope case and the server "
                    f"speaks {spec.profile.name}")


@pytest.mark.clause("CTL-2")
def test_ctl2_unknown_type_from_a_req_socket_is_answered(server_spec: ControlSpec) -> None:
    """The real trap: a REQ worker sending an unknown type must not wait forever."""
    _rep_envelope_only(server_spec, "from a REQ socket")
    with rig(server_spec, clause="CTL-2") as r:
        peer = r.wire(zmq.REQ)
        err = _expect_error(peer.call("NO_SUCH_TYPE", {}, _REPLY_S), "CTL-2",
                            "unknown type from a REQ socket")
        assert err, "CTL-2: the error reply's text is empty"
        _expect_success(server_spec, peer.call(*_probe_type(server_spec), _REPLY_S), "CTL-2",
                        "a request on the same REQ socket after the error reply")
        _still_serving(r, "CTL-2")


@pytest.mark.clause("CTL-2")
def test_ctl2_error_replies_keep_the_envelope_of_a_correlating_req(
    server_spec: ControlSpec,
) -> None:
    """A REQ_CORRELATE worker's envelope is ``[request id, b""]``: the error reply must echo
    both, or libzmq drops it and the worker waits for its timeout (``[id, error]``)."""
    _rep_envelope_only(server_spec, "from a REQ_CORRELATE socket")
    with rig(server_spec, clause="CTL-2") as r:
        peer = r.wire(zmq.REQ, req_correlate=1, req_relaxed=1)
        for kind in ("NO_SUCH_TYPE", "ANOTHER_UNKNOWN_TYPE"):
            _expect_error(peer.call(kind, {}, _REPLY_S), "CTL-2",
                          f"unknown type {kind!r} from a REQ_CORRELATE socket")
        _expect_success(server_spec, peer.call(*_probe_type(server_spec), _REPLY_S), "CTL-2",
                        "a request on the same REQ_CORRELATE socket after the error replies")
        raw = r.wire()
        rid = nonce().to_bytes(8, "big")
        raw.send([rid, b"", PROFILES["rep-envelope"].request(0, "NO_SUCH_TYPE", {}, {})[-1]])
        got = raw.recv(_REPLY_S)
        assert got is not None and got[:2] == [rid, b""] and len(got) == 3, (
            f"CTL-2: an error reply to a DEALER's [id, b'', payload] is {got!r:.120}; the "
            "envelope up to and including the empty delimiter is echoed, then one reply frame")
        _still_serving(r, "CTL-2")


@pytest.mark.clause("CTL-2")
def test_ctl2_no_delimiter_gets_an_error_reply(server_spec: ControlSpec) -> None:
    """A DEALER sending a single frame without the empty delimiter gets ``[b"", error]``."""
    _rep_envelope_only(server_spec, "without a delimiter")
    with rig(server_spec, clause="CTL-2") as r:
        peer = r.wire()
        peer.send([PROFILES["rep-envelope"].request(0, ECHO, {}, {})[-1]])
        got = peer.recv(_REPLY_S)
        reply = None if got is None else PROFILES["rep-envelope"].read(got)
        assert got is None or reply is not None, (
            f"CTL-2: the reply {got!r:.120} to a frame without a delimiter is not [b'', error]")
        _expect_error(reply, "CTL-2", "a single frame without the empty delimiter")
        _still_serving(r, "CTL-2")


@pytest.mark.clause("CTL-2")
def test_ctl2_raw_tcp_garbage_harms_nothing(server_spec: ControlSpec) -> None:
    """A non-ZMTP TCP peer on the server's port: the server keeps serving."""
    with rig(server_spec, clause="CTL-2") as r:
        with socket.create_connection(("127.0.0.1", r.port), timeout=2) as raw:
            raw.sendall(b"\xff" * 64 + b"GET / HTTP/1.0\r\n\r\n")
            _still_serving(r, "CTL-2")
        _still_serving(r, "CTL-2")


# -- CTL-3 ---------------------------------------------------------------------


@pytest.mark.clause("CTL-3")
@profiles.suite_settings()
@example(plan=[FAIL, BAD, ECHO])  # both kinds of failing handler, then a success: every run
@given(plan=st.lists(st.sampled_from([FAIL, BAD, ECHO]), min_size=1, max_size=6))
def test_ctl3_raising_handlers_get_error_replies(
    server_spec: ControlSpec, plan: list[str]
) -> None:
    """Handlers that raise (or, under rep-envelope, return a non-map) get error replies; the
    rest still succeed. Typed profiles (lmcache-mq) allow any result, so there a handler
    returning a list is a success and the plan's ``ZMQC_BAD`` steps raise instead."""
    server_spec.require_added_handlers("CTL-3", "a handler that raises")
    typed = server_spec.profile.name != "rep-envelope"
    with rig(server_spec, clause="CTL-3") as r:
        peer = r.wire()
        for kind in plan:
            kind = FAIL if typed and kind == BAD else kind
            r.check()
            n = nonce()
            reply = peer.call(kind, {"nonce": n}, _REPLY_S)
            if kind == ECHO:
                got = _expect_success(server_spec, reply, "CTL-3", f"{ECHO} after failing "
                                      "handlers", "map")
                assert got.value.get("nonce") == n, (
                    f"CTL-3: {ECHO} got another request's reply {got.value!r:.80}")
            else:
                what = "a handler that raised" if kind == FAIL else "a handler returning a list"
                _expect_error(reply, "CTL-3", what)
        _still_serving(r, "CTL-3")
