"""The control-channel reference server and client: their own specifics, on real sockets.

The contract itself is checked by ``conformance/contracts/control``; these
tests pin what the reference documents beyond it: the wire (echoed
envelopes, REP compatibility, error texts), batching, errors and options,
registration and lazy-pirate rebuilds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgspec
import pytest
import zmq

from conformance.contracts.control.mutants import CATALOG
from conformance.contracts.control.spec import load
from conformance.testing.net import free_port
from reference_impl.control import (
    REFERENCE,
    ClientClosed,
    ControlClient,
    ControlServer,
    RequestRejected,
    RequestTimeout,
)

_FAST: dict[str, Any] = {
    "heartbeat_ivl_ms": 100, "heartbeat_timeout_ms": 500, "request_timeout_ms": 400,
}


@contextmanager
def serving(handlers: dict[str, Any] | None = None, **options: Any) -> Iterator[str]:
    """A reference server on a free port, served in a thread; yields its endpoint."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    server = ControlServer(endpoint, handlers or {}, **options)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            server.serve(5)
        server.close()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield endpoint
    finally:
        stop.set()
        thread.join(5)
        assert not thread.is_alive(), "the serve loop did not stop"


def _dealer(endpoint: str) -> tuple[zmq.Context[zmq.Socket[bytes]], zmq.Socket[bytes]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return ctx, sock


def test_server_echoes_every_envelope_frame_and_answers_req() -> None:
    with serving() as endpoint:
        ctx, sock = _dealer(endpoint)
        try:
            sock.send_multipart([b"hop1", b"hop2", b"", msgspec.msgpack.encode({"type": "PING"})])
            assert sock.poll(2000)
            frames = sock.recv_multipart()
            assert frames[:3] == [b"hop1", b"hop2", b""]
            assert msgspec.msgpack.decode(frames[3]) == {"type": "PONG"}
            req = ctx.socket(zmq.REQ)
            req.setsockopt(zmq.LINGER, 0)
            req.connect(endpoint)
            req.send(msgspec.msgpack.encode({"type": "NOPE"}))
            assert req.poll(2000)
            reply = msgspec.msgpack.decode(req.recv())
            assert reply == {"error": "No handler registered for request type NOPE",
                             "type": "NOPE"}
        finally:
            ctx.destroy(linger=0)


def test_serve_answers_at_most_max_batch_per_call() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    server = ControlServer(endpoint, {}, max_batch=10)
    ctx, sock = _dealer(endpoint)
    try:
        for _ in range(25):
            sock.send_multipart([b"", msgspec.msgpack.encode({"type": "PING"})])
        served: list[int] = []
        deadline = time.monotonic() + 5
        while sum(served) < 25 and time.monotonic() < deadline:
            served.append(server.serve(50))
        assert sum(served) == 25
        assert max(served) <= 10
        assert server.served == 25
    finally:
        ctx.destroy(linger=0)
        server.close()
        server.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        server.serve(0)


def test_client_request_reply_errors_and_close() -> None:
    handlers = {"ADD": lambda r: {"sum": r["a"] + r["b"]},
                "BOOM": lambda r: 1 / 0}
    with serving(handlers) as endpoint:
        client = ControlClient(endpoint, **_FAST)
        try:
            assert client.request("ADD", {"a": 2, "b": 3}) == {"sum": 5}
            with pytest.raises(RequestRejected, match="ZeroDivisionError") as info:
                client.request("BOOM", {})
            assert info.value.reply["type"] == "BOOM"
            with pytest.raises(ValueError, match="'type'"):
                client.request("ADD", {"type": "x"})
            with pytest.raises(TypeError, match="encodable"):
                client.request("ADD", {"a": object()})
            assert client.request("ADD", {"a": 1, "b": 1}) == {"sum": 2}
        finally:
            client.close()
            client.close()
        with pytest.raises(ClientClosed):
            client.request("ADD", {"a": 1, "b": 1})
        client.tick()  # a no-op once closed


def test_client_timeout_rebuilds_and_the_client_talks_to_a_plain_rep_server() -> None:
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    client = ControlClient(endpoint, **_FAST)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        started = time.monotonic()
        with pytest.raises(RequestTimeout, match="400 ms"):
            client.request("PING", {})
        assert 0.35 <= time.monotonic() - started < 1.0
        assert client.rebuilds == 1
        rep = ctx.socket(zmq.REP)
        rep.setsockopt(zmq.LINGER, 0)
        rep.bind(endpoint)
        replies: list[dict[str, Any]] = []

        def answer() -> None:
            while rep.poll(2000):
                msg = msgspec.msgpack.decode(rep.recv())
                rep.send(msgspec.msgpack.encode({"echo": msg["type"]}))

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        deadline = time.monotonic() + 3
        while not replies and time.monotonic() < deadline:
            try:
                replies.append(client.request("HELLO", {}))
            except RequestTimeout:
                continue
        assert replies == [{"echo": "HELLO"}]
        thread.join(5)
    finally:
        client.close()
        ctx.destroy(linger=0)


def test_client_registers_on_connect_and_after_a_restart() -> None:
    seen: list[str] = []

    def register(request: dict[str, Any]) -> dict[str, Any]:
        seen.append(request["worker"])
        return {"ok": True}

    handlers = {"REGISTER": register}
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    client = ControlClient(endpoint, register=("REGISTER", {"worker": "w1"}), **_FAST)
    try:
        for round_ in (1, 2):
            server = ControlServer(endpoint, handlers)
            try:
                deadline = time.monotonic() + 3
                while client.registrations < round_ and time.monotonic() < deadline:
                    client.tick()
                    server.serve(5)
                    client.tick()
            finally:
                server.close()
            assert client.registrations == round_
        assert seen == ["w1", "w1"]
    finally:
        client.close()


@pytest.mark.parametrize("option", ["heartbeat_ivl_ms", "heartbeat_timeout_ms",
                                    "request_timeout_ms", "reconnect_ivl_ms"])
@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_client_rejects_bad_options_by_name(option: str, value: Any) -> None:
    with pytest.raises(ValueError, match=option):
        ControlClient("tcp://127.0.0.1:1", **{option: value})


def test_reference_and_every_mutant_resolve() -> None:
    spec = load("reference_impl.control:REFERENCE")
    assert spec.server is REFERENCE.server and spec.client is REFERENCE.client
    assert "PING" in spec.capabilities.request_types
    for mutant in CATALOG:
        loaded = load(mutant.factory)
        assert loaded.server is not None and loaded.client is not None, mutant.name
        assert all(c.startswith("CTL-") for c in mutant.clauses), mutant.name
