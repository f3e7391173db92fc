"""Regressions for false verdicts found by re-testing third-party implementations.

Each test puts a correct stand-in, built from the reference and speaking the
same bytes as the third party, where the third party stood, so no third-party
package is needed: the verdict the stand-in gets is the one the suite gave
for the wrong reason (``docs/adapters.md`` names the run that showed it).
"""

from __future__ import annotations

import importlib.util
import os
import textwrap
from pathlib import Path

import pytest
from _cli_run import run_contract

from conformance.contracts.control import preflight
from conformance.contracts.control.spec import make_spec
from conformance.errors import ConfigError

_ROOT = Path(__file__).resolve().parents[1]

#: LMCache 0.4.x's shape on the ``lmcache-mq`` wire: declared types only, a closed
#: request enum (the handlers the suite passes are not served), its own I/O thread not
#: needed here. Everything it is asked, it answers correctly.
_SUBJECTS = textwrap.dedent('''
    from reference_impl.control import MqControlServer
    from reference_impl.control.wire import REFERENCE_CODES

    class ClosedEnumServer(MqControlServer):
        zmq_conformance_capabilities = {
            "wire": "lmcache-mq", "request_types": {"PING": {}},
            "request_codes": dict(REFERENCE_CODES), "results": {"PING": "bool"},
            "added_handlers": False,
        }

        def __init__(self, endpoint, handlers):
            super().__init__(endpoint, None)  # the suite's handlers are not served

    class _ServerOnly:
        server = ClosedEnumServer
        client = None

    CLOSED_ENUM = _ServerOnly

    # LMCache 0.5.6's shape on the lmcache-0.5 wire (lmcache/v1/multiprocess/transport/
    # zmq_impl): a ROUTER on its own I/O thread ('mq-server-thread') routing an operation
    # frame that is a name ('ping') or a frozen legacy id (ping 22, noop 24, get_chunk_size
    # 21) alike, echoing it; ping takes one argument (an instance id or nil), noop and
    # get_chunk_size none; a closed set of operations. Correct where LMCache 0.5.6 is not:
    # what it cannot answer gets the profile's error reply [id, operation] instead of
    # silence.
    import threading

    from reference_impl.control import Mq05ControlServer, MqControlServer

    LEGACY_IDS_056 = {"PING": 22, "NOOP": 24, "GET_CHUNK_SIZE": 21}
    RESULTS = {"PING": "bool", "NOOP": "str", "GET_CHUNK_SIZE": "int"}
    CAPS_05 = {
        "wire": "lmcache-0.5",
        "request_types": {"PING": {"instance_id": None}, "NOOP": {}, "GET_CHUNK_SIZE": {}},
        "request_codes": {"PING": "ping", "NOOP": "noop", "GET_CHUNK_SIZE": "get_chunk_size"},
        "results": RESULTS, "added_handlers": False,
    }

    def _taking(count, result):
        def handler(request):
            if len(request["args"]) != count:
                raise ValueError("Payload count does not match expected count")
            return result
        return handler

    class Lmcache056Shaped:
        zmq_conformance_capabilities = CAPS_05

        def __init__(self, endpoint, handlers):
            own = {"PING": _taking(1, True), "NOOP": _taking(0, "OK"),
                   "GET_CHUNK_SIZE": _taking(0, 256)}
            self._server = Mq05ControlServer(endpoint, own, codes=LEGACY_IDS_056)
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._loop, name="mq-server-thread",
                                            daemon=True)
            self._thread.start()

        def _loop(self):
            while not self._stop.is_set():
                self._server.serve(10)

        def close(self):
            self._stop.set()
            self._thread.join(5)
            self._server.close()

    class Lmcache056WithOldAdapter(Lmcache056Shaped):
        """The 0.4.3 adapter's declaration (lmcache-mq, RequestType codes) on 0.5.6."""
        zmq_conformance_capabilities = {
            "wire": "lmcache-mq", "results": RESULTS, "added_handlers": False,
            "request_types": {"PING": {}, "NOOP": {}, "GET_CHUNK_SIZE": {}},
            "request_codes": {"PING": 12, "NOOP": 13, "GET_CHUNK_SIZE": 11},
        }

    class Lmcache043WithNewAdapter(MqControlServer):
        """An 0.4.x-shaped server (PING code 12, no names) declared as 0.5.6's adapter."""
        zmq_conformance_capabilities = CAPS_05

    class _Only:
        def __init__(self, server):
            self.server, self.client = server, None

    LMCACHE_056 = _Only(Lmcache056Shaped)
    LMCACHE_056_OLD_ADAPTER = _Only(Lmcache056WithOldAdapter)
    LMCACHE_043_NEW_ADAPTER = _Only(Lmcache043WithNewAdapter)
''')


def _with_subjects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``subjects`` importable by the child run (it inherits this environment)."""
    (tmp_path / "subjects.py").write_text(_SUBJECTS)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(_ROOT)]))


def test_ctl9_judges_a_closed_enum_server_by_its_declared_types(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LMCache 0.4.2 and 0.4.3 failed CTL-9 before any hostile byte: its honest request
    was the suite's echo, which a server with ``added_handlers`` false cannot serve (no
    code on its wire; LMCache's I/O thread died on the invented one, and the death was
    reported as CTL-3). The honest request is now a declared type: a correct server of
    that shape passes."""
    _with_subjects(tmp_path, monkeypatch)
    run = run_contract("control", tmp_path, "--transport", "subjects:CLOSED_ENUM",
                       "-k", "hostile_handshakes", "--reruns", "0", "-n", "0")
    assert run.verdicts.get("CTL-9") == "passed", (run.report.get("clauses"), run.output)
    assert run.status == 0, run.output


def test_an_lmcache_056_shaped_server_gets_correct_verdicts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole gate against LMCache 0.5.6's wire (operation names, ping's instance id,
    its own I/O thread): every server clause it can be asked passes, the rest are skipped
    with their reason, never failed or blocked."""
    _with_subjects(tmp_path, monkeypatch)
    run = run_contract("control", tmp_path, "--transport", "subjects:LMCACHE_056",
                       "--reruns", "0", "-n", "0")
    assert run.status == 0, run.output
    verdicts = run.verdicts
    assert {c for c, v in verdicts.items() if v == "passed"} == {"CTL-1", "CTL-2", "CTL-9"}, (
        run.report.get("clauses"))
    assert {c for c, v in verdicts.items() if v == "skipped"} == {
        "CTL-3", "CTL-4", "CTL-5", "CTL-6", "CTL-7", "CTL-8"}, run.report.get("clauses")


def test_the_04_profile_on_an_056_server_is_one_line_naming_lmcache_05(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LMCache 0.4's adapter declaration against 0.5.6: its codes name other operations
    there (12 is free_lookup_locks, 11 retired), so every reply is an error reply that
    decodes under lmcache-mq. The run ends as a usage error naming lmcache-0.5, with no
    clause verdicts (before, it would have failed CTL-1 on a correct server)."""
    _with_subjects(tmp_path, monkeypatch)
    run = run_contract("control", tmp_path, "--transport", "subjects:LMCACHE_056_OLD_ADAPTER",
                       "-k", "ctl1_every", "--reruns", "0", "-n", "0")
    assert run.status == 2, run.output
    errors = [line for line in run.output.splitlines() if line.startswith("ERROR: control:")]
    # One line: the suite's own refusal is final (no second run with every plugin).
    assert len(errors) == 1, run.output
    assert "under wire profile lmcache-mq" in errors[0]
    assert "only error replies" in errors[0]
    assert errors[0].endswith("it answers under lmcache-0.5: declare --capability "
                              "wire=lmcache-0.5"), errors[0]
    assert not run.verdicts


def test_the_05_profile_on_an_04_server_names_lmcache_mq(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reverse: 0.5.6's adapter declaration against an 0.4-shaped server, which
    answers 'ping' with its error reply (decodes under lmcache-0.5 too): the preflight
    finds the profile where it succeeds."""
    (tmp_path / "subjects.py").write_text(_SUBJECTS)
    loader = importlib.util.spec_from_file_location("lmcache_shaped_subjects",
                                                    tmp_path / "subjects.py")
    assert loader is not None and loader.loader is not None
    subjects = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(subjects)

    with pytest.raises(ConfigError) as mismatch:
        preflight.check_profile(make_spec(subjects.LMCACHE_043_NEW_ADAPTER))
    assert "under wire profile lmcache-0.5" in str(mismatch.value)
    assert str(mismatch.value).endswith("declare --capability wire=lmcache-mq")
    preflight.check_profile(make_spec(subjects.LMCACHE_056))
