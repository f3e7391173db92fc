"""EVT-10: with authentication declared, strangers get no batch and no replay.

The publisher declares ``authentication`` and so takes the CURVE server
keywords of :mod:`conformance.testing.credentials`; each test draws fresh keys. The
suite's honest subscriber and replay client hold the allowed client key and
pin the publisher's server key. Strangers are a plain SUB and replay DEALER,
and CURVE ones with a key pair of their own that know the real server key
(only client authentication stops them). The honest peers are served as
usual; the strangers receive nothing; no secret key appears in the
publisher's logs, ``repr`` or ``stats()``.
"""

from __future__ import annotations

import contextlib
import logging

import pytest
import zmq

from conformance.contracts.kv_events.publisher.peers import ReplayClient, Rig, Sub, make_batch
from conformance.contracts.kv_events.spec import PublisherSpec, accepts
from conformance.testing.credentials import (
    SERVER_KEYWORDS,
    SuiteCredentials,
    as_client,
    assert_no_secret_leaked,
    strangers,
)

CLAUSE = "EVT-10"
_BATCHES = 20
#: How long a stranger is given to receive something it must not.
_STRANGER_WINDOW_MS = 300


def _require_authentication(spec: PublisherSpec) -> None:
    if not spec.capabilities.authentication:
        pytest.skip(f"{CLAUSE}: requires capability authentication; declare it with "
                    "zmq_conformance_capabilities = {'authentication': True} on a factory that "
                    "takes curve_server_secret_key and curve_allowed_client_keys")
    missing = [k for k in SERVER_KEYWORDS if not accepts(spec.factory, k)]
    assert not missing, (f"{CLAUSE}: the publisher declares authentication but its factory "
                         f"takes no {', '.join(missing)}")


def _strangers(rig: Rig, creds: SuiteCredentials
               ) -> tuple[list[tuple[str, Sub]], list[tuple[str, ReplayClient]]]:
    """Each stranger (:func:`strangers`) as a subscriber and as a replay client, by kind."""
    kinds = strangers(creds)
    subs = [(kind, rig.sub(secure=secure)) for kind, secure in kinds]
    replays = [(kind, rig.replay_client(secure=secure)) for kind, secure in kinds]
    return subs, replays


@pytest.mark.clause(CLAUSE)
def test_strangers_get_no_batch_and_no_replay(kv_publisher_spec: PublisherSpec) -> None:
    _require_authentication(kv_publisher_spec)
    creds = SuiteCredentials.generate()
    honest = as_client(creds.client, creds.server.public)
    with Rig(kv_publisher_spec, clause=CLAUSE, **creds.server_kwargs()) as rig:
        stranger_subs, stranger_replays = _strangers(rig, creds)
        sub = rig.sub(secure=honest)
        rig.join(sub)
        for _ in range(_BATCHES):
            rig.publish(make_batch())
        rig.wait_all(sub)
        rig.check_stream(sub, clause=CLAUSE, contiguous=True)
        for _, replay in stranger_replays:
            with contextlib.suppress(zmq.Again):  # never connected: nothing to queue on
                replay.sock.send_multipart([b"", bytes(8)], zmq.NOBLOCK)  # start 0
        for kind, stranger in stranger_subs:
            stranger.drain(_STRANGER_WINDOW_MS)
            assert not stranger.got and not stranger.malformed, (
                f"{CLAUSE}: a {kind} subscriber received {len(stranger.got)} batches")
        for kind, replay in stranger_replays:
            got, stranger_ended = replay.read(timeout=_STRANGER_WINDOW_MS / 1000, clause=CLAUSE)
            assert not got and not stranger_ended, (
                f"{CLAUSE}: a {kind} replay client received {len(got)} answers"
                f"{' and the end marker' if stranger_ended else ''}")
        client = rig.replay_client(secure=honest)
        client.request(0)
        # Served as usual, judged by EVT-10 alone (where it starts, the end marker: EVT-4).
        rig.check_served(client, 0, CLAUSE)


@pytest.mark.clause(CLAUSE)
def test_no_secret_key_leaks(kv_publisher_spec: PublisherSpec,
                             caplog: pytest.LogCaptureFixture) -> None:
    _require_authentication(kv_publisher_spec)
    creds = SuiteCredentials.generate()
    caplog.set_level(logging.DEBUG)
    texts: list[str] = []
    with Rig(kv_publisher_spec, clause=CLAUSE, **creds.server_kwargs()) as rig:
        _strangers(rig, creds)
        sub = rig.sub(secure=as_client(creds.client, creds.server.public))
        rig.join(sub)
        texts.append(repr(rig.publisher))
        texts.append(repr(rig.stats()))
    texts.extend(record.getMessage() for record in caplog.records)
    assert_no_secret_leaked(texts, creds.secret_keys(), clause=CLAUSE,
                            where="a log, repr or stats()")


@pytest.mark.clause(CLAUSE)
def test_a_restart_with_the_same_keys_serves_authenticated_peers_again(
    kv_publisher_spec: PublisherSpec,
) -> None:
    """After a restart on the same endpoints with the same keys, the authenticated
    subscriber (reconnected by libzmq) gets the new incarnation's batches; a plain
    stranger still gets nothing."""
    _require_authentication(kv_publisher_spec)
    creds = SuiteCredentials.generate()
    honest = as_client(creds.client, creds.server.public)
    with Rig(kv_publisher_spec, clause=CLAUSE, **creds.server_kwargs()) as rig:
        sub = rig.sub(secure=honest)
        rig.join(sub)
        rig.restart()
        stranger = rig.sub()
        sub.got.clear()
        rig.join(sub)
        stranger.drain(_STRANGER_WINDOW_MS)
        assert not stranger.got, (f"{CLAUSE}: a plain subscriber received "
                                  f"{len(stranger.got)} batches after a restart")
