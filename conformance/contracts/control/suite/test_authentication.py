"""CTL-8: with authentication declared, strangers are not served and impostors are refused.

The implementation declares ``authentication`` (on its server factory) and
so takes the CURVE keywords of :mod:`conformance.testing.credentials`: the server its
secret key and the allowed client keys, the client its own secret key and the
server key to pin. Each test draws fresh keys.

- Server side: a plain DEALER and a CURVE DEALER with a key pair of its own
  (that knows the real server key) send well-formed requests; none reaches a
  handler and none is answered, while the honest client is served.
- Client side: on the server's endpoint sits an impostor (the reference
  server, plain or holding another key and allowing the client's key). No
  request of the client reaches it, including requests after the client
  rebuilt its socket (a request timeout is a lazy-pirate rebuild).
- Honest peers keep working across a client rebuild and a server restart
  with the same keys; no secret key appears in the logs or the client's repr.
"""

from __future__ import annotations

import logging

import pytest
import zmq

from conformance.contracts.control.harness import (
    ECHO,
    REQUEST_TIMEOUT_MS,
    SLACK_MS,
    SLOW,
    WireClient,
    nonce,
    rig,
    suite_body,
)
from conformance.contracts.control.spec import ControlSpec
from conformance.testing.credentials import (
    IMPOSTORS,
    KeyPair,
    SuiteCredentials,
    assert_no_secret_leaked,
    strangers,
)
from reference_impl.control import ControlServer

CLAUSE = "CTL-8"
#: How long a stranger waits for a reply it must not get (seconds).
_STRANGER_WAIT_S = 0.5
#: Requests the client under test sends to an impostor: enough to span rebuilds.
_IMPOSTOR_REQUESTS = 3


def _require_authentication(spec: ControlSpec) -> None:
    if not spec.capabilities.authentication:
        pytest.skip(f"{CLAUSE}: requires capability authentication; declare it with "
                    "zmq_conformance_capabilities = {..., 'authentication': True} on a server "
                    "factory that takes curve_server_secret_key and curve_allowed_client_keys "
                    "(and a client factory that takes curve_client_secret_key and "
                    "curve_server_key)")


def _echo(data: str) -> dict[str, object]:
    return {"nonce": nonce(), "data": data}


@pytest.mark.clause(CLAUSE)
def test_no_request_from_a_stranger_reaches_a_handler(control_spec: ControlSpec) -> None:
    _require_authentication(control_spec)
    control_spec.require("server", CLAUSE)
    creds = SuiteCredentials.generate()
    with rig(control_spec, credentials=creds) as r:
        honest = r.client("honest", register=False)
        body = _echo("honest")
        assert honest.request(ECHO, body).get("nonce") == body["nonce"], (
            f"{CLAUSE}: the authenticated client's echo came back wrong")
        wires: list[tuple[str, WireClient]] = [
            (kind, r.wire(secure=secure)) for kind, secure in strangers(creds)]
        sent: dict[object, str] = {}
        for kind, wire in wires:
            body = _echo("stranger")
            sent[body["nonce"]] = kind
            frames = wire.profile.request(nonce(), ECHO, suite_body(ECHO, body), wire.codes)
            try:
                wire.sock.send_multipart(frames, zmq.NOBLOCK)
            except zmq.Again:  # no connection to queue on: refused before any request
                continue
            answer = wire.recv(_STRANGER_WAIT_S)
            assert answer is None, f"{CLAUSE}: a {kind} stranger got an answer {answer!r:.120}"
        body = _echo("honest-after")
        assert honest.request(ECHO, body).get("nonce") == body["nonce"]
        reached = [sent[s.nonce] for s in r.handlers.seen(type=ECHO) if s.nonce in sent]
        assert not reached, f"{CLAUSE}: requests of strangers ({', '.join(reached)}) " \
                            "reached a handler"


@pytest.mark.parametrize("impostor", IMPOSTORS)
@pytest.mark.clause(CLAUSE)
def test_the_client_refuses_an_impostor_server(control_spec: ControlSpec,
                                               impostor: str) -> None:
    _require_authentication(control_spec)
    control_spec.require("client", CLAUSE)
    creds = SuiteCredentials.generate()
    options = {} if impostor == "plain" else {
        "curve_server_secret_key": KeyPair.generate().secret,
        "curve_allowed_client_keys": [creds.client.public]}
    with rig(control_spec, server=False, credentials=creds) as r:
        r.start_impostor(ControlServer, options)
        client = r.client("pinned")
        for n in range(_IMPOSTOR_REQUESTS):
            reply, error, _ = client.attempt(ECHO, _echo(f"to-impostor-{n}"))
            assert reply is None, (
                f"{CLAUSE}: the client got the reply {reply!r} from a {impostor} server that "
                "does not hold the pinned server key" + (" (after a rebuild)" if n else ""))
            assert error is not None
        r.drive(REQUEST_TIMEOUT_MS / 1000, tick=[client])
        seen = r.handlers.seen()
        assert not seen, (
            f"{CLAUSE}: {len(seen)} request(s) of the client ({', '.join(s.type for s in seen)})"
            f" reached a {impostor} impostor server")


@pytest.mark.clause(CLAUSE)
def test_authenticated_peers_survive_rebuilds_and_restarts(control_spec: ControlSpec,
                                                            caplog: pytest.LogCaptureFixture
                                                            ) -> None:
    _require_authentication(control_spec)
    creds = SuiteCredentials.generate()
    caplog.set_level(logging.DEBUG)
    with rig(control_spec, credentials=creds) as r:
        client = r.client("honest")
        body = _echo("first")
        assert client.request(ECHO, body).get("nonce") == body["nonce"]
        # A request that outlives its timeout: the client rebuilds its socket.
        _, error, _ = client.attempt(SLOW, {"nonce": nonce(),
                                            "ms": REQUEST_TIMEOUT_MS + SLACK_MS})
        assert error is not None, f"{CLAUSE}: a request slower than its timeout succeeded"

        def served(tag: str) -> bool:
            reply, _, _ = client.attempt(ECHO, _echo(tag))
            return reply is not None

        r.wait_until(lambda: served("after-rebuild"), timeout=5.0,
                     what=f"{CLAUSE}: a request after the client rebuilt its socket")
        r.restart_server()
        r.wait_until(lambda: served("after-restart"), timeout=5.0,
                     what=f"{CLAUSE}: a request after the server restarted with the same keys")
        texts = [repr(client.raw)]
    texts.extend(record.getMessage() for record in caplog.records)
    assert_no_secret_leaked(texts, creds.secret_keys(), clause=CLAUSE, where="a log or repr")
