"""PIPE-13: with authentication declared, strangers get nothing in and impostors nothing out.

The implementation declares ``authentication`` and so takes the CURVE
keywords of :mod:`conformance.testing.credentials`. The client binds every
socket of the pipeline, so it is the CURVE server (its secret key and the
engines' allowed public keys); each engine is a CURVE client (its own
secret key and the client's server key, pinned). Each test draws fresh keys.

- Client side: strangers posing as engine 0 (a plain one, and a CURVE one
  with a key pair of its own that knows the real server key) send HELLO,
  connect a request DEALER with engine 0's identity and an output PUSH
  straight to the data sockets. None gets a WELCOME or a request, and none
  of their forged outputs or ``ENGINE_CORE_DEAD`` sentinels reach the
  client: the keyed engine's stream is exact and the client goes on.
- Engine side: at the handshake address sits an impostor client (the suite,
  plain or a CURVE server holding another key); the engine sends it no
  HELLO, however long it waits and however often it retries.
- Keyed peers work (requests, a payload, an abort, a utility call) and no
  secret key appears in the client's logs or repr or the engine's stderr
  (its logging at DEBUG).

Either side that the implementation does not provide is played by the
reference, keyed the same way.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import pytest
import zmq

from conformance.contracts.engine_pipeline.harness import (
    PROCESS_READY_S,
    Rig,
    guarded,
    request_id,
)
from conformance.contracts.engine_pipeline.peers import RawClient, RawEngine
from conformance.contracts.engine_pipeline.spec import PipelineSpec
from conformance.testing.credentials import (
    IMPOSTORS,
    SuiteCredentials,
    impostor_server,
    strangers,
)
from conformance.testing.credentials import secrets_in as leaked_secrets
from reference_impl.engine_pipeline import profiles
from reference_impl.engine_pipeline.wire import ENGINE_CORE_DEAD, EngineOutput, EngineOutputs

CLAUSE = "PIPE-13"
#: How long a stranger waits for an answer it must not get (seconds).
_STRANGER_WAIT_S = 0.5
#: How long an impostor client listens for a HELLO it must not get: several times any
#: sane handshake retry interval (seconds).
_IMPOSTOR_WAIT_S = 1.5
#: A token no request of the fake model produces at position 0 (a forged output).
_FORGED_TOKEN = 7


def require_authentication(spec: PipelineSpec) -> None:
    """Skip ``PIPE-13`` (naming what to declare) unless the implementation declares it."""
    if not spec.capabilities.authentication:
        pytest.skip(f"{CLAUSE}: requires capability authentication; declare it with "
                    "capabilities = {..., 'authentication': True} on an implementation whose "
                    "client factory takes curve_server_secret_key and curve_allowed_client_keys "
                    "and whose engine factory takes curve_client_secret_key and "
                    "curve_server_key")


def _keyed_engine(rig: Rig, addresses: list[str], creds: SuiteCredentials,
                  **options: Any) -> Any:
    """The implementation's engine (the reference's when it has none), keyed."""
    return rig.engine(addresses, under_test=rig.spec.engine is not None, clause=CLAUSE,
                      **creds.client_kwargs(), **options)


@pytest.mark.clause(CLAUSE)
def test_a_stranger_engine_gets_no_welcome_no_request_and_no_output_in(rig: Rig) -> None:
    require_authentication(rig.spec)
    rig.spec.require("client", CLAUSE)
    creds = SuiteCredentials.generate()
    client = rig.client(clause=CLAUSE, **creds.server_kwargs())
    addresses = client.addresses
    finish_ready = rig.ready_in_background(client, clause=CLAUSE)
    posing: list[tuple[str, RawEngine]] = []
    for kind, secure in strangers(creds):
        stranger = RawEngine(addresses["handshake"], engine_index=0, secure=secure,
                             wire=rig.caps.wire)
        rig.closers.append(stranger.close)
        answer = stranger.hello(_STRANGER_WAIT_S)
        assert answer is None, (
            f"{CLAUSE}: a {kind} stranger posing as engine 0 got an answer to its HELLO "
            f"({answer.get('status')!r}): the client's handshake socket lets it in")
        stranger.intrude(addresses["input"], addresses["output"])
        posing.append((kind, stranger))
    process = _keyed_engine(rig, [addresses["handshake"]], creds, model={"stall_ms": 20})
    finish_ready()
    rid = request_id("p13-")
    try:
        guarded("add()", lambda: client.add(rid, [1], 20), 5.0)
    except AssertionError:  # CallBlocked included: a blocked add() stays blocked
        raise
    except Exception as exc:  # strangers that got in can take engine 0's place first
        raise AssertionError(
            f"{CLAUSE}: with strangers posing as engine 0 on the client's sockets, add() "
            f"raised {type(exc).__name__}: {exc}; {process.describe()}") from exc
    forged = [bytes(f) for f in profiles.codec(rig.caps.wire).Encoder().encode(
        EngineOutputs(0, [EngineOutput(rid, [_FORGED_TOKEN])]))]
    for _, stranger in posing:
        assert stranger.push is not None
        for frames in (forged, [ENGINE_CORE_DEAD]):
            # A refused handshake leaves the PUSH without a peer: a blocking send would hang.
            with contextlib.suppress(zmq.Again):
                stranger.push.send_multipart(frames, zmq.NOBLOCK)
    for kind, stranger in posing:
        got = stranger.requests(_STRANGER_WAIT_S)
        assert not got, (f"{CLAUSE}: a {kind} stranger with engine 0's identity received "
                         f"{len(got)} request(s) on the client's request socket")
    try:
        streams = rig.collect(client, [rid], clause=CLAUSE)
        after = request_id("p13-after-")
        guarded("add()", lambda: client.add(after, [1], 3), 5.0)
        rig.collect(client, [after], clause=CLAUSE, streams=streams)
    except AssertionError:
        raise
    except Exception as exc:
        raise AssertionError(
            f"{CLAUSE}: after strangers' forged outputs and ENGINE_CORE_DEAD the client failed "
            f"with {type(exc).__name__}: {exc}; {process.describe()}") from exc
    try:
        streams.check(rid, CLAUSE, max_tokens=20)
    except AssertionError as exc:
        raise AssertionError(f"{exc} (strangers pushed forged outputs for this request)"
                             ) from None
    streams.check(after, CLAUSE, max_tokens=3)


@pytest.mark.parametrize("impostor", IMPOSTORS)
@pytest.mark.clause(CLAUSE)
def test_an_engine_sends_no_hello_to_an_impostor_client(rig: Rig, impostor: str) -> None:
    require_authentication(rig.spec)
    rig.spec.require("engine", CLAUSE)
    creds = SuiteCredentials.generate()
    fake = RawClient(secure=impostor_server(impostor), wire=rig.caps.wire)
    rig.closers.append(fake.close)
    process = _keyed_engine(rig, [fake.handshake_address], creds)
    assert process.wait_line("SERVING", PROCESS_READY_S), (
        f"{CLAUSE}: the engine given curve_client_secret_key and curve_server_key did not "
        f"start serving: {process.describe()}")
    frames = fake.handshake_frames(_IMPOSTOR_WAIT_S)
    assert not frames, (
        f"{CLAUSE}: the engine sent {len(frames)} message(s) (its HELLO) to a {impostor} "
        "client that does not hold the secret of the server key it pins")


@pytest.mark.clause(CLAUSE)
def test_keyed_peers_are_unaffected_and_no_key_leaks(rig: Rig,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    require_authentication(rig.spec)
    creds = SuiteCredentials.generate()
    caplog.set_level(logging.DEBUG)
    # A client in a driver process logs there: at DEBUG too, into the driver's stderr.
    options: dict[str, Any] = dict(creds.server_kwargs())
    if getattr(rig.spec.client, "accepts_log_level", False):
        options["log_level"] = "DEBUG"
    client = rig.client(under_test=rig.spec.client is not None, clause=CLAUSE, **options)
    process = _keyed_engine(rig, [client.addresses["handshake"]], creds, log_level="DEBUG")
    rig.ready(client, process, clause=CLAUSE)
    rids = [request_id("p13-keyed-") for _ in range(4)]
    payload = bytes(range(256)) * 300  # past the inline threshold: an aux frame
    for n, rid in enumerate(rids):
        guarded("add()", lambda: client.add(rid, [1], 5, payload if n == 0 else None),  # noqa: B023
                5.0)
    streams = rig.collect(client, rids, clause=CLAUSE)
    for rid in rids:
        streams.check(rid, CLAUSE, max_tokens=5)
    first = streams.outputs[rids[0]][0]
    assert bytes(first.payload) == payload, (
        f"{CLAUSE}: over CURVE the payload came back changed ({len(bytes(first.payload))} "
        f"bytes of {len(payload)})")
    value = guarded("call()", lambda: client.call("echo", 42), 10.0)
    assert value == [42], f"{CLAUSE}: over CURVE call('echo', 42) returned {value!r}"
    texts = [repr(client)]
    guarded("client close()", client.close, 10.0)
    process.terminate()
    process.exit_status(10.0)
    texts.append(process.stderr_tail(1 << 20))
    texts.append(getattr(client, "driver_log", lambda: "")())
    texts.extend(record.getMessage() for record in caplog.records)
    leaked = leaked_secrets("\n".join(texts), creds.secret_keys())
    assert not leaked, (f"{CLAUSE}: {', '.join(leaked)} appeared in the client's logs or repr "
                        "(its driver's stderr, for a client in a driver) or the engine's stderr")
