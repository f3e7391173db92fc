"""Regressions for false verdicts found by re-testing third-party implementations.

Each test puts a correct stand-in, built from the reference and speaking the
same bytes as the third party, where the third party stood, so no third-party
package is needed: the verdict the stand-in gets is the one the suite gave
for the wrong reason (``docs/adapters.md`` names the run that showed it).
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from _cli_run import run_contract

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
