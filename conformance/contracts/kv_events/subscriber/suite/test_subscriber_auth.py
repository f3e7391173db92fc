"""EVS-10: a subscriber given the publisher's server key refuses an impostor publisher.

The subscriber declares ``authentication`` and so takes the CURVE client
keywords of :mod:`conformance.testing.credentials`: its own secret key and the
server key to pin. The suite's fake publisher plays the real publisher
(a CURVE server holding the matching secret) or an impostor on the
subscriber's endpoints: a plain one, or a CURVE one with another key. The
impostor publishes and answers replays all the time; the subscriber must
deliver none of it, for longer than its replay timeout, so a socket the
subscriber rebuilds is tested too.
"""

from __future__ import annotations

import logging
import time

import pytest

from conformance.config.loading import accepts
from conformance.contracts.kv_events.subscriber.peer import Session, SubscriberSpec
from conformance.testing.credentials import (
    CLIENT_KEYWORDS,
    IMPOSTORS,
    SuiteCredentials,
    as_server,
    assert_no_secret_leaked,
    impostor_server,
)

CLAUSE = "EVS-10"
_BATCHES = 5


def _require_authentication(spec: SubscriberSpec) -> None:
    if not spec.capabilities.get("authentication"):
        pytest.skip(f"{CLAUSE}: requires capability authentication; declare it with "
                    "zmq_conformance_capabilities = {'authentication': True} on a factory that "
                    "takes curve_client_secret_key and curve_server_key")
    missing = [k for k in CLIENT_KEYWORDS if not accepts(spec.factory, k)]
    assert not missing, (f"{CLAUSE}: the subscriber declares authentication but its factory "
                         f"takes no {', '.join(missing)}")


def _impostor_window_s(spec: SubscriberSpec) -> float:
    """Longer than one replay timeout (a rebuilt replay socket is covered), at least 1.5 s."""
    return max(1.5, 2.5 * spec.replay_timeout_ms / 1000)


@pytest.mark.clause(CLAUSE)
def test_the_real_publisher_is_heard(kv_subscriber_spec: SubscriberSpec) -> None:
    _require_authentication(kv_subscriber_spec)
    creds = SuiteCredentials.generate()
    with Session(kv_subscriber_spec, clause=CLAUSE, fake_secure=as_server(creds.server),
                 **creds.client_kwargs()) as session:
        session.subscribed()
        expected = [(seq, session.fake.batches[seq])
                    for seq in (session.fake.publish() for _ in range(_BATCHES))]
        session.drive_until(lambda: len(session.delivered) >= _BATCHES, timeout=5.0,
                            what="the authenticated publisher's batches")
        session.check_delivered(expected)


@pytest.mark.parametrize("impostor", IMPOSTORS)
@pytest.mark.clause(CLAUSE)
def test_an_impostor_publisher_is_refused(kv_subscriber_spec: SubscriberSpec,
                                          impostor: str,
                                          caplog: pytest.LogCaptureFixture) -> None:
    _require_authentication(kv_subscriber_spec)
    creds = SuiteCredentials.generate()
    caplog.set_level(logging.DEBUG)
    secure = impostor_server(impostor)
    with Session(kv_subscriber_spec, clause=CLAUSE, fake_secure=secure,
                 **creds.client_kwargs()) as session:
        fake = session.fake
        window = _impostor_window_s(kv_subscriber_spec)
        deadline = time.monotonic() + window
        while time.monotonic() < deadline:
            fake.publish()
            session.drive_for(0.05)
        assert not session.delivered, (
            f"{CLAUSE}: the subscriber delivered {len(session.delivered)} batches from a "
            f"{impostor} impostor publisher that does not hold the pinned server key")
        assert not fake.subscriptions and not fake.requests, (
            f"{CLAUSE}: the subscriber completed a handshake with a {impostor} impostor "
            f"publisher ({fake.subscriptions} subscriptions, {len(fake.requests)} replay "
            "requests reached it)")
        texts = [repr(session.sub), *(r.getMessage() for r in caplog.records)]
    assert_no_secret_leaked(texts, [creds.client.secret], clause=CLAUSE, where="a log or repr")


@pytest.mark.clause(CLAUSE)
def test_the_real_publisher_restarted_with_the_same_keys_is_heard(
    kv_subscriber_spec: SubscriberSpec,
) -> None:
    """A publisher restart (same keys, same endpoints, seq from 0) is authenticated anew
    and its batches are delivered (EVS-4's restart, with CURVE)."""
    _require_authentication(kv_subscriber_spec)
    creds = SuiteCredentials.generate()
    with Session(kv_subscriber_spec, clause=CLAUSE, fake_secure=as_server(creds.server),
                 **creds.client_kwargs()) as session:
        fake = session.fake
        session.subscribed()
        for _ in range(_BATCHES):
            fake.publish()
        session.drive_until(lambda: len(session.delivered) >= _BATCHES, timeout=5.0,
                            what="the authenticated publisher's batches")
        fake.restart(salt=1)
        session.subscribed()
        seqs = [fake.publish() for _ in range(_BATCHES)]
        session.drive_until(lambda: session.seqs()[-_BATCHES:] == seqs, timeout=5.0,
                            what="the batches of the publisher restarted with the same keys")
