"""Regressions for false verdicts found by re-testing third-party implementations.

Each test puts a correct stand-in, built from the reference and speaking the
same bytes as the third party, where the third party stood, so no third-party
package is needed: the verdict the stand-in gets is the one the suite gave
for the wrong reason (``docs/adapters.md`` names the run that showed it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

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


def _run(tmp_path: Path, *args: str) -> tuple[int, str, dict[str, Any]]:
    (tmp_path / "subjects.py").write_text(_SUBJECTS)
    report = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(_ROOT)])}
    result = subprocess.run(
        [sys.executable, "-m", "conformance.cli", "run", "-q", "--json", str(report),
         "--reruns", "0", "-n", "0", *args],
        capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path, env=env)
    data = json.loads(report.read_text()) if report.exists() else {}
    return result.returncode, result.stdout + result.stderr, data


def test_ctl9_judges_a_closed_enum_server_by_its_declared_types(tmp_path: Path) -> None:
    """LMCache 0.4.2 and 0.4.3 failed CTL-9 before any hostile byte: its honest request
    was the suite's echo, which a server with ``added_handlers`` false cannot serve (no
    code on its wire; LMCache's I/O thread died on the invented one, and the death was
    reported as CTL-3). The honest request is now a declared type: a correct server of
    that shape passes."""
    code, out, data = _run(tmp_path, "--contract", "control", "--transport",
                           "subjects:CLOSED_ENUM", "-k", "hostile_handshakes")
    clause = data.get("clauses", {}).get("CTL-9", {})
    assert clause.get("verdict") == "passed", (clause, out[-3000:])
    assert code == 0, out[-3000:]
