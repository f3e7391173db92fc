"""CURVE in the references: key checks, options before bind, no threads, no key in text.

The behavioural claims (strangers refused, impostors refused, keys not
leaked in a run) are the suite's clauses SEC-2, EVT-10, EVS-10 and CTL-8,
checked against the references and their mutants in the contract tests; these
are the pure parts and the construction-time contract of every reference.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from zmq.utils import z85

from conformance.testing.credentials import KeyPair, SuiteCredentials, secrets_in
from conformance.testing.net import free_port
from reference_impl._curve import client_config, server_config
from reference_impl.control import ControlClient, ControlServer
from reference_impl.kv_events.publisher import KVEventPublisher
from reference_impl.kv_events.subscriber import KVEventSubscriber
from reference_impl.p2p.transport import ZmqTransport

_BAD_KEYS: list[Any] = ["short", b"x" * 39, "~" * 40, 12345, "é" * 40]


@pytest.mark.parametrize("bad", _BAD_KEYS, ids=repr)
def test_a_key_that_does_not_fit_is_a_value_error_naming_the_option(bad: Any) -> None:
    good = KeyPair.generate()
    with pytest.raises(ValueError, match="curve_server_secret_key") as server_error:
        server_config(bad, [good.public])
    with pytest.raises(ValueError, match=r"curve_allowed_client_keys\[0\]"):
        server_config(good.secret, [bad])
    with pytest.raises(ValueError, match="curve_client_secret_key"):
        client_config(bad, good.public)
    with pytest.raises(ValueError, match="curve_server_key") as client_error:
        client_config(good.secret, bad)
    for error in (server_error, client_error):
        assert not (isinstance(bad, str | bytes) and len(bad) > 8 and str(bad) in str(error.value))


def test_raw_and_z85_keys_are_the_same_key() -> None:
    pair = KeyPair.generate()
    raw = z85.decode(pair.secret)
    assert client_config(raw, pair.public) == client_config(pair.secret.decode(), pair.public)


def test_incomplete_configurations_are_refused() -> None:
    pair = KeyPair.generate()
    with pytest.raises(ValueError, match="exactly one of"):
        server_config(pair.secret)  # nobody named: everyone who knows the key would get in
    with pytest.raises(ValueError, match="exactly one of"):
        server_config(pair.secret, [pair.public], lambda key, address: True)
    with pytest.raises(ValueError, match="need curve_server_secret_key"):
        server_config(None, [pair.public])
    with pytest.raises(ValueError, match="go together"):
        client_config(pair.secret, None)
    assert server_config() is None and client_config() is None


def test_reprs_hide_every_key() -> None:
    creds = SuiteCredentials.generate()
    texts = [repr(server_config(creds.server.secret, [creds.client.public])),
             repr(client_config(creds.client.secret, creds.server.public)),
             repr(creds), repr(creds.server), str(creds)]
    assert not secrets_in("\n".join(texts), creds.secret_keys())
    assert all(creds.client.public.decode() not in t for t in texts)


def test_secrets_in_finds_every_form() -> None:
    pair = KeyPair.generate()
    raw = z85.decode(pair.secret)
    for text in (pair.secret.decode(), raw.hex(), repr(raw), repr(pair.secret)):
        assert len(secrets_in(f"config: {text}", [pair.secret])) == 1, text
    assert secrets_in("nothing here", [pair.secret]) == []


def _endpoints() -> tuple[str, str]:
    return f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"


_FACTORIES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "p2p": lambda kw: ZmqTransport(f"127.0.0.1:{(p := free_port())}", "127.0.0.1", p, **kw),
    "publisher": lambda kw: KVEventPublisher(*_endpoints(), **kw),
    "subscriber": lambda kw: KVEventSubscriber(*_endpoints(), **kw),
    "server": lambda kw: ControlServer(_endpoints()[0], {}, **kw),
    "client": lambda kw: ControlClient(_endpoints()[0], **kw),
}
_SIDES = {"p2p": "node", "publisher": "server", "subscriber": "client", "server": "server",
          "client": "client"}


def _close(obj: Any) -> None:
    (obj.shutdown if hasattr(obj, "shutdown") else obj.close)()


@pytest.mark.parametrize("name", list(_FACTORIES))
def test_every_reference_takes_the_keywords_and_starts_no_thread(name: str) -> None:
    creds = SuiteCredentials.generate()
    side = _SIDES[name]
    kwargs = getattr(creds, f"{side}_kwargs")()
    before = threading.active_count()
    obj = _FACTORIES[name](kwargs)
    try:
        own = 1 if name == "publisher" else 0  # the publisher's own thread, CURVE or not
        assert threading.active_count() == before + own, "authentication started a thread"
        assert not secrets_in(repr(obj), creds.secret_keys())
    finally:
        _close(obj)
    bad = dict(kwargs)
    key = next(iter(bad))
    bad[key] = "not a key"
    with pytest.raises(ValueError, match=key):
        _close(_FACTORIES[name](bad))


@pytest.mark.parametrize("factory", [ZmqTransport, KVEventPublisher, KVEventSubscriber,
                                     ControlServer], ids=lambda f: f.__name__)
def test_every_reference_declares_authentication(factory: Any) -> None:
    """(The control client's capabilities are declared on the server factory.)"""
    assert factory.zmq_conformance_capabilities["authentication"] is True


def test_an_authenticated_exchange_releases_every_descriptor_and_thread() -> None:
    """RES-1 with CURVE on: the ZAP socket and the CURVE sessions close with the nodes."""
    from conformance.testing import resources

    if not resources.supported():
        pytest.skip("cannot count descriptors here")

    def exchange() -> None:
        keys = SuiteCredentials.generate().node_kwargs()
        ports = free_port(), free_port()
        a = ZmqTransport(f"127.0.0.1:{ports[0]}", "127.0.0.1", ports[0], **keys)
        b = ZmqTransport(f"127.0.0.1:{ports[1]}", "127.0.0.1", ports[1], **keys)
        try:
            a.connect(b.local_id).send({"n": 1})
            deadline = time.monotonic() + 5
            while not b.poll():
                a.poll()
                assert time.monotonic() < deadline, "no authenticated message arrived"
        finally:
            a.close()
            b.close()

    exchange()  # warm-up: libzmq keeps a few descriptors after a first connection
    baseline = resources.wait_until_stable()
    exchange()
    resources.wait_for_release(baseline, what="an authenticated exchange")
