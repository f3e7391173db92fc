"""Control wire profiles and verdict accuracy: what each profile reads, the preflight's
mismatch, servers on their own I/O thread, and the verdicts a run gives to subjects that
are silent, one-sided or plain objects (through the CLI, as a user runs it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
from hypothesis import given, settings

from conformance.contracts.control import preflight
from conformance.contracts.control.harness import Rig, SuiteHandlers
from conformance.contracts.control.machine import _relabelled
from conformance.contracts.control.spec import make_spec
from conformance.contracts.control.wire import PROFILES
from conformance.contracts.control.wire import decode as wire_decode
from conformance.errors import ConfigError
from conformance.reporting.verdicts import one_reason, strip_hypothesis_notes
from conformance.testing.net import free_port
from reference_impl.control import REFERENCE, REFERENCE_MQ, ControlClient, ControlServer
from reference_impl.control.wire import REFERENCE_CODES

_ROOT = Path(__file__).resolve().parents[1]
_FAST: dict[str, Any] = {
    "heartbeat_ivl_ms": 100, "heartbeat_timeout_ms": 500, "request_timeout_ms": 400,
}


# -- the profiles, pure ---------------------------------------------------------------


def test_each_profile_reads_its_own_replies_and_not_the_other() -> None:
    rep, mq = PROFILES["rep-envelope"], PROFILES["lmcache-mq"]
    rep_reply = [b"\x00" * 7 + b"\x01", b"", msgspec.msgpack.encode({"type": "PONG"})]
    rep_error = [b"\x00" * 7 + b"\x02", b"", msgspec.msgpack.encode({"error": "no"})]
    mq_reply = [msgspec.msgpack.encode(3), msgspec.msgpack.encode(12),
                msgspec.msgpack.encode(True)]
    mq_error = mq_reply[:2]
    assert rep.read(rep_reply) is not None and rep.read(rep_reply).error is None  # type: ignore[union-attr]
    assert rep.read(rep_error).error == "no"  # type: ignore[union-attr]
    assert rep.read(mq_reply) is None and rep.read(mq_error) is None
    assert mq.read(mq_reply).value is True  # type: ignore[union-attr]
    assert mq.read(mq_error).empty  # type: ignore[union-attr]
    assert mq.read(rep_reply) is None  # an 8-byte id is not a MessagePack int
    # The [id, error] of a server that dropped the delimiter is not a rep-envelope reply.
    assert rep.read([rep_error[0], rep_error[2]]) is None


def test_typed_results_are_checked() -> None:
    mq = PROFILES["lmcache-mq"]
    reply = mq.read([msgspec.msgpack.encode(1), msgspec.msgpack.encode(12),
                     msgspec.msgpack.encode("PONG")])
    assert reply is not None
    assert mq.success_problem(reply, "bool") == "the result 'PONG' is not a bool"
    assert mq.success_problem(reply, "str") is None
    empty = mq.read([msgspec.msgpack.encode(1), msgspec.msgpack.encode(9)])
    assert empty is not None and mq.success_problem(empty, "none") is None
    assert mq.success_problem(empty, "bool") is not None


def test_capabilities_name_the_profile_and_its_codes() -> None:
    with pytest.raises(ConfigError, match="unknown control wire profile"):
        make_spec(REFERENCE, overrides={"wire": "zmtp-json"})
    with pytest.raises(ConfigError, match="no lmcache-mq code for NOOP"):
        make_spec(REFERENCE_MQ, overrides={"request_types": {"PING": {}, "NOOP": {}}})
    spec = make_spec(REFERENCE_MQ, overrides={"request_codes": {"PING": 11}})
    assert spec.capabilities.codes()["PING"] == 11
    assert spec.capabilities.result_of("PING") == "bool"


# -- the reference speaks both ----------------------------------------------------------


def test_reference_client_and_server_on_lmcache_mq_typed_results() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    handlers = SuiteHandlers().for_generation(1)
    server = ControlServer(endpoint, handlers, wire="lmcache-mq")
    client = ControlClient(endpoint, wire="lmcache-mq", **_FAST)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            server.serve(10)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        assert client.request("PING", {}) is True
        assert client.request("ZMQC_ECHO", {"nonce": 7, "data": [1]}) == {"nonce": 7,
                                                                          "data": [1]}
        with pytest.raises(Exception, match="without a result"):
            client.request("ZMQC_FAIL", {"nonce": 1})
        raw: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        raw.connect(endpoint)
        raw.send_multipart([msgspec.msgpack.encode(5), msgspec.msgpack.encode(999)])
        assert raw.poll(2000), "no error reply to an unknown code"
        assert raw.recv_multipart() == [msgspec.msgpack.encode(5), msgspec.msgpack.encode(999)]
        raw.close(0)
    finally:
        stop.set()
        thread.join(5)
        client.close()
        server.close()
    assert REFERENCE_CODES["PING"] == 12  # LMCache 0.4.3's RequestType.PING


def test_lmcache_05_reads_like_lmcache_mq_and_never_fuzzes_stream_control() -> None:
    ops = PROFILES["lmcache-0.5"]
    codes = {"PING": "ping", "NOOP": 24}
    assert ops.request(4, "PING", {"instance_id": None}, codes) == [
        msgspec.msgpack.encode(4), msgspec.msgpack.encode("ping"), msgspec.msgpack.encode(None)]
    assert ops.request(5, "NOOP", {}, codes)[1] == msgspec.msgpack.encode(24)
    reply = ops.read([msgspec.msgpack.encode(4), msgspec.msgpack.encode("ping"),
                      msgspec.msgpack.encode(True)])
    assert reply is not None and ops.success_problem(reply, "bool") is None
    empty = ops.read([msgspec.msgpack.encode(4), msgspec.msgpack.encode("ping")])
    assert empty is not None and empty.empty and ops.success_problem(empty, "bool")


@settings(max_examples=200, deadline=None)
@given(case=PROFILES["lmcache-0.5"].malformed({"PING": "ping", "NOOP": 24}))
def test_lmcache_05_hostile_operations_name_nothing_declared(case: tuple[str, list[bytes]]
                                                             ) -> None:
    """Never a declared identifier (nor a declared type's lower-case name, which LMCache 0.5
    routes too), never the empty frame it reads as stream control and never answers."""
    description, frames = case
    assert frames[0] != b"", description
    ok, operation = wire_decode(frames[0])
    if ok and not description.startswith("ping with"):
        assert operation not in ("ping", "noop", 24), description


def test_lmcache_05_capabilities() -> None:
    from reference_impl.control import REFERENCE_MQ05

    spec = make_spec(REFERENCE_MQ05)
    assert spec.capabilities.codes()["PING"] == "ping"
    assert spec.capabilities.codes()["ZMQC_ECHO"] == "zmqc_echo"
    # Declared codes are the declared wire's: another profile is asked in its own terms.
    assert spec.capabilities.codes("lmcache-mq")["PING"] == 12
    # An empty PING body under lmcache-0.5 is ping's nil instance id; two values are not.
    spec = make_spec(REFERENCE_MQ, overrides={"wire": "lmcache-0.5"})
    assert dict(spec.capabilities.request_types["PING"]) == {"instance_id": None}
    with pytest.raises(ConfigError, match="PING takes one argument"):
        make_spec(REFERENCE_MQ05, overrides={"request_types": {"PING": {"a": 1, "b": 2}}})
    with pytest.raises(ConfigError, match=r"which only wire=lmcache-0\.5 carries"):
        make_spec(REFERENCE_MQ, overrides={"request_codes": {"PING": "ping"}})
    assert make_spec(REFERENCE_MQ05, overrides={"request_types": {
        "PING": {"instance_id": 3}, "GET_CHUNK_SIZE": {}}}).capabilities.codes()[
        "GET_CHUNK_SIZE"] == "get_chunk_size"


def test_reference_on_lmcache_05_routes_names_and_legacy_ids_and_echoes_the_frame() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    handlers = SuiteHandlers().for_generation(1)
    server = ControlServer(endpoint, handlers, wire="lmcache-0.5",
                           codes={"PING": 22, "ZMQC_ECHO": "zmqc_echo"})
    client = ControlClient(endpoint, wire="lmcache-0.5", **_FAST)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            server.serve(10)

    thread = threading.Thread(target=serve)
    thread.start()
    enc = msgspec.msgpack.encode
    raw: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    try:
        assert client.request("PING", {}) is True  # sent as "ping" with a nil instance id
        assert client.request("ZMQC_ECHO", {"nonce": 7, "data": [1]}) == {"nonce": 7,
                                                                          "data": [1]}
        raw.connect(endpoint)
        for rid, operation in enumerate((22, "ping"), start=1):  # legacy id and name alike
            raw.send_multipart([enc(rid), enc(operation), enc(None)])
            assert raw.poll(2000), f"no reply to {operation!r}"
            assert raw.recv_multipart() == [enc(rid), enc(operation), enc(True)]
        for rid, operation in enumerate(("PING", 12, True, None), start=10):
            raw.send_multipart([enc(rid), enc(operation)])
            assert raw.poll(2000), f"no error reply to {operation!r}"
            assert raw.recv_multipart() == [enc(rid), enc(operation)]
    finally:
        raw.close(0)
        stop.set()
        thread.join(5)
        client.close()
        server.close()


# -- the preflight -----------------------------------------------------------------------


def test_preflight_names_the_profile_a_mismatched_server_speaks() -> None:
    with pytest.raises(ConfigError) as rep_as_mq:
        preflight.check_profile(make_spec(REFERENCE, overrides={"wire": "lmcache-mq"}))
    assert "nothing" in str(rep_as_mq.value)
    assert "decodes under wire profile lmcache-mq" in str(rep_as_mq.value)
    assert "declare --capability wire=rep-envelope" in str(rep_as_mq.value)
    with pytest.raises(ConfigError, match="it answers under lmcache-mq"):
        preflight.check_profile(make_spec(REFERENCE_MQ, overrides={"wire": "rep-envelope",
                                                                    "results": {}}))
    preflight.check_profile(make_spec(REFERENCE))
    preflight.check_profile(make_spec(REFERENCE_MQ))


class _Silent:
    """Binds, never answers, serve() returns at once."""

    def __init__(self, endpoint: str, handlers: Any) -> None:
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(endpoint)

    def serve(self, timeout_ms: int) -> int:
        return 0

    def close(self) -> None:
        self._sock.close(0)
        self._ctx.term()


def test_preflight_leaves_a_silent_server_to_the_clauses() -> None:
    preflight.check_profile(make_spec(type("Impl", (), {"server": _Silent})()))


# -- servers on their own I/O thread -------------------------------------------------------


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_own_thread_is_reported_with_its_exception_under_the_rig_clause() -> None:
    from conformance.contracts.control.mutants import MQ_OWN_THREAD, MQ_OWN_THREAD_DIES

    with Rig(make_spec(MQ_OWN_THREAD), clause="CTL-2") as r:
        runner = r.start_server()
        assert runner.self_driven and runner.threads
        assert r.wire().call("PING", {}, 2.0) is not None
        assert runner.dead_loop() is None
    with Rig(make_spec(MQ_OWN_THREAD_DIES), clause="CTL-2") as r:
        r.start_server()
        peer = r.wire()
        peer.send([msgspec.msgpack.encode(1), msgspec.msgpack.encode(999)])
        with pytest.raises(AssertionError) as died:
            peer.recv(3.0)  # the rig's watch notices the death while waiting
        assert str(died.value).startswith(
            "CTL-2: the server's I/O thread 'own-io-thread' died: ValueError: Invalid enum")
        dead, r.runner = r.runner, None  # its death is the verdict: stop it unchecked
        assert dead is not None
        dead.stop()


# -- verdict text, pure -------------------------------------------------------------------


def test_skip_reasons_are_one_sentence_without_hypothesis_notes() -> None:
    noted = "CTL-3 needs a handler that raises.\nFailing explicit example: test(\n    x=1,\n)"
    assert strip_hypothesis_notes(noted) == "CTL-3 needs a handler that raises."
    reasons = ["the client-side machine runs for ...", "inconclusive: the test failed on CTL-4 "
               "first", "CTL-5 is a client clause and X provides no client (attribute 'client')"]
    assert one_reason(reasons, "CTL-5") == reasons[2]
    assert one_reason(reasons[:2], "CTL-5") == reasons[0]
    assert one_reason([], "CTL-5") is None


def test_one_sided_machines_blame_only_the_side_under_test() -> None:
    seen = AssertionError("CTL-4: the server is reachable again but no request succeeded")
    seen.add_note("Falsifying example: steps")
    as_server = _relabelled(seen, "server")
    assert str(as_server).startswith("CTL-3: the reference client failed against the server")
    assert "Falsifying example: steps" in getattr(as_server, "__notes__", [])
    as_client = _relabelled(AssertionError("CTL-3: a raising handler's request failed late"),
                            "client")
    assert str(as_client).startswith("CTL-5: the client under test failed against the "
                                     "reference server")
    kept = AssertionError("CTL-4: late")
    assert _relabelled(kept, "client") is kept


# -- through the CLI ----------------------------------------------------------------------

_SUBJECTS = textwrap.dedent('''
    import zmq
    from reference_impl.control import ControlClient, ControlServer

    class Silent:
        zmq_conformance_capabilities = {"request_types": {"PING": {}, "A": {}, "B": {}}}

        def __init__(self, endpoint, handlers):
            self._ctx = zmq.Context()
            self._sock = self._ctx.socket(zmq.ROUTER)
            self._sock.setsockopt(zmq.LINGER, 0)
            self._sock.bind(endpoint)

        def serve(self, timeout_ms):
            return 0

        def close(self):
            self._sock.close(0)
            self._ctx.term()

    class _SilentOnly:
        server = Silent
        client = None

    class Plain:
        def __init__(self):
            self.server = ControlServer
            self.client = ControlClient

    SILENT = _SilentOnly
    PLAIN = Plain()
''')


def _run(tmp_path: Path, *args: str) -> tuple[int, str, dict[str, Any]]:
    (tmp_path / "subjects.py").write_text(_SUBJECTS)
    report = tmp_path / "report.json"
    report.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(_ROOT)])}
    result = subprocess.run(
        [sys.executable, "-m", "conformance.cli", "run", "-q", "--contract", "control",
         "--json", str(report), *args],
        capture_output=True, text=True, timeout=600, check=False, cwd=tmp_path, env=env)
    data = json.loads(report.read_text()) if report.exists() else {}
    return result.returncode, result.stdout + result.stderr, data


def test_silent_server_fails_with_no_reply_not_blocked(tmp_path: Path) -> None:
    """The stall limit (2 s) is shorter than the suite's own wait for a reply: before, the
    wait counted as no progress and the test ended ``blocked``."""
    code, out, data = _run(tmp_path, "--transport", "subjects:SILENT", "--stall-limit", "2",
                           "--reruns", "0", "-k", "ctl1_every_declared and DEALER or ctl4_absent")
    clauses = data["clauses"]
    assert code == 1, out[-2000:]
    assert clauses["CTL-1"]["verdict"] == "failed", clauses["CTL-1"]
    assert "no reply" in clauses["CTL-1"]["counterexample"]
    assert clauses["CTL-4"]["verdict"] == "skipped"
    assert clauses["CTL-4"]["reason"] == (
        "CTL-4 is a client clause and subjects:SILENT provides no client (attribute 'client')")


def test_plain_object_is_accepted_and_a_mismatch_ends_the_run(tmp_path: Path) -> None:
    code, out, data = _run(tmp_path, "--transport", "subjects:PLAIN", "-k", "ctl1_every")
    assert code == 0, out[-2000:]
    assert data["clauses"]["CTL-1"]["verdict"] == "passed"
    code, out, data = _run(tmp_path, "--transport", "subjects:PLAIN", "--capability",
                           "wire=lmcache-mq", "-k", "ctl1_every")
    assert code == 2, out[-2000:]
    assert "nothing subjects:PLAIN answered decodes under wire profile lmcache-mq" in out
    assert not data


def test_flaky_wrappers_become_the_first_real_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    from hypothesis.errors import FlakyFailure, FlakyStrategyDefinition

    from conformance.contracts.control import machine
    from conformance.testing import state_machines

    class _Stub:
        def __init__(self) -> None:
            self.first_failure: list[BaseException] = []

    def strategy_changed(build: Any, settings: Any) -> None:
        build().first_failure.append(AssertionError("CTL-5: a reply to another request"))
        raise FlakyStrategyDefinition("Inconsistent data generation!")

    monkeypatch.setattr(state_machines, "run_state_machine_as_test", strategy_changed)
    with pytest.raises(AssertionError) as err:
        machine.run(_Stub, None)  # type: ignore[arg-type]
    assert str(err.value).startswith("CTL-5: a reply to another request [Hypothesis could not")

    def failure_not_replayed(build: Any, settings: Any) -> None:
        raise FlakyFailure("Hypothesis test_x produces unreliable results",
                           [AssertionError("CTL-4: failed after 900 ms")])

    monkeypatch.setattr(state_machines, "run_state_machine_as_test", failure_not_replayed)
    with pytest.raises(AssertionError) as err:
        machine.run(_Stub, None, "both")  # type: ignore[arg-type]
    assert str(err.value).startswith("CTL-4: failed after 900 ms")
    assert "unreliable" not in str(err.value)


def test_a_peer_that_cannot_send_is_a_run_error_not_a_verdict() -> None:
    from conformance.contracts.control.harness import WireClient

    # Nothing listens and ZMQ_IMMEDIATE queues nothing: the send cannot go out (EAGAIN).
    peer = WireClient(f"tcp://127.0.0.1:{free_port()}", immediate=1)
    try:
        with pytest.raises(pytest.skip.Exception, match="Run error, not a verdict"):
            peer.send([b"frame"])
    finally:
        peer.close()
