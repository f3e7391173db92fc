"""Hypothesis's Unicode tables are built before the first test, never inside one.

Built inside a test, the tables (seconds of CPU on a loaded machine) ran
under the stall deadline and a busy run reported the implementation
``blocked``. These runs start from an empty ``HYPOTHESIS_STORAGE_DIRECTORY``
and check, from inside the first test, that the work was already done.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from plugin_project import make_project, run_pytest

from conformance.config import hypothesis_warmup
from conformance.supervision import postmortem

TABLES_PROBE = '''
import os
from pathlib import Path

import pytest
from hypothesis.internal import charmap


@pytest.mark.clause("MSG-1")
def test_tables_ready_before_the_first_test(zmq_transport_spec):
    tables = Path(os.environ["HYPOTHESIS_STORAGE_DIRECTORY"]) / "unicode_data"
    names = sorted(p.name for p in tables.rglob("*.json.gz"))
    assert names == ["charmap.json.gz"], names
    built = charmap.charmap_file()
    before = built.stat().st_ino
    charmap.charmap()  # the test's first use: loaded, not built (a build writes a new file)
    assert built.stat().st_ino == before
'''


#: Draws from every suite strategy that makes strings; run with a fresh storage directory.
_DRAW_STRINGS = """
from hypothesis import given, settings, strategies as st
from conformance.contracts.p2p import strategies
from conformance.testing import values

drawn = [values.text(max_size=8), values.msgpack_values(), values.budgeted_msgpack_values(),
         strategies.messages(), strategies.hostile_identities()]

@settings(max_examples=30, database=None)
@given(st.tuples(*drawn))
def draw(_):
    pass

draw()
"""


def test_the_suites_strings_need_only_the_category_table(tmp_path: Path) -> None:
    """No suite strategy draws from a codec's alphabet (its table took 3.2 s of CPU to
    build, in a fresh checkout the longest step of a run's start): neither in the
    source nor when drawn."""
    root = Path(__file__).resolve().parent.parent / "conformance"
    bare = [f"{path.relative_to(root.parent)}:{source[:m.start()].count(chr(10)) + 1}"
            for path in sorted(root.rglob("*.py")) if path != root / "testing" / "values.py"
            for source in [path.read_text(encoding="utf-8")]
            for m in re.finditer(r"\bst\.text\((?!\s*alphabet=)|codec=", source)]
    assert bare == [], f"strings drawn without values.text(): {bare}"
    storage = tmp_path / "storage"
    subprocess.run([sys.executable, "-c", _DRAW_STRINGS], check=True, timeout=120,
                   env={**os.environ, "HYPOTHESIS_STORAGE_DIRECTORY": str(storage)})
    assert _tables(storage) == ["charmap.json.gz"]


def _probe_project(tmp_path: Path) -> Path:
    project = make_project(tmp_path / "proj")
    (project / "probe_suite").mkdir()
    (project / "probe_suite" / "test_probe.py").write_text(textwrap.dedent(TABLES_PROBE))
    return project


def _tables(storage: Path) -> list[str]:
    return sorted(p.name for p in (storage / hypothesis_warmup.TABLES_DIR).rglob("*.json.gz"))


def test_cold_storage_tables_are_built_before_the_first_test_in_a_worker(
    tmp_path: Path,
) -> None:
    project = _probe_project(tmp_path)
    storage = tmp_path / "cold-storage"
    result = run_pytest(
        project, "--zmq-conformance-only", "--zmq-suite", "probe_suite",
        "--zmq-transport", "fakes:Good", "-n", "1",
        env={"HYPOTHESIS_STORAGE_DIRECTORY": str(storage)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout, result.stdout


def test_the_session_process_builds_the_tables_at_configure(tmp_path: Path) -> None:
    """Collecting alone (no test, no worker) leaves the tables: the xdist controller
    builds them before it starts any worker, which then only loads the file."""
    project = _probe_project(tmp_path)
    storage = tmp_path / "cold-storage"
    result = run_pytest(
        project, "--zmq-conformance-only", "--zmq-suite", "probe_suite",
        "--zmq-transport", "fakes:Good", "--collect-only", "-q",
        env={"HYPOTHESIS_STORAGE_DIRECTORY": str(storage)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert _tables(storage) == ["charmap.json.gz"]
    assert "HypothesisSideeffectWarning" not in result.stdout + result.stderr


def test_seeded_storage_gets_the_tables_and_never_an_example_database(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    hypothesis_warmup.build_into(shared)
    (shared / "examples" / "k").mkdir(parents=True)  # a database must not travel
    run = tmp_path / "run"
    hypothesis_warmup.seed_tables(run, shared)
    assert _tables(run) == _tables(shared) == ["charmap.json.gz"]
    assert not (run / "examples").exists()
    hypothesis_warmup.seed_tables(tmp_path / "none", None)  # nothing shared: nothing done
    assert not (tmp_path / "none").exists()


def test_reset_storage_empties_the_database_and_keeps_the_tables(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    (storage / hypothesis_warmup.TABLES_DIR / "14.0.0").mkdir(parents=True)
    (storage / hypothesis_warmup.TABLES_DIR / "14.0.0" / "charmap.json.gz").write_bytes(b"x")
    (storage / "examples" / "abc").mkdir(parents=True)
    (storage / ".gitignore").write_text("*\n")
    hypothesis_warmup.reset_storage(storage)
    assert [p.name for p in storage.iterdir()] == [hypothesis_warmup.TABLES_DIR]
    assert _tables(storage) == ["charmap.json.gz"]
    hypothesis_warmup.reset_storage(tmp_path / "missing")  # no directory: nothing to do


_RUNNER = '  File "/x/_pytest/runner.py", line 1 in pytest_runtest_call\n'


def _stall(directory: Path, test_thread: str) -> str:
    (directory / "gw0.test.json").write_text(
        '{"nodeid": "s/t.py::t", "clauses": ["PROC-1"], "properties": {}, "stall_limit": 30}')
    (directory / "gw0.trace").write_text(
        "Timeout (0:00:30)!\nThread 0x1 (most recent call first):\n"
        '  File "/x/execnet.py", line 9 in serve\n\n'
        f"Thread 0x2 (most recent call first):\n{test_thread}{_RUNNER}")
    crash = postmortem.examine(directory, "gw0", "s/t.py::t")
    assert crash.verdict == "blocked"
    return crash.reason


def test_a_stall_in_hypothesis_code_says_so_in_the_reason(tmp_path: Path) -> None:
    reason = _stall(tmp_path, '  File "/v/site-packages/hypothesis/internal/charmap.py", '
                    "line 160 in intervals_from_codec\n"
                    '  File "/v/site-packages/hypothesis/core.py", line 9 in run\n')
    assert "Hypothesis's own code (intervals_from_codec in hypothesis/internal/charmap.py)" \
        in reason
    assert "not in a call into the implementation" in reason


def test_a_stall_in_the_implementation_blames_no_one_else(tmp_path: Path) -> None:
    reason = _stall(tmp_path, '  File "/v/site-packages/zmq/sugar/context.py", '
                    "line 1 in __del__\n"
                    '  File "/v/site-packages/hypothesis/core.py", line 9 in run\n')
    assert "Hypothesis" not in reason
