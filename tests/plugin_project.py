"""A throwaway user project for driving the plugin and the CLI the way users do.

The project has its own ``pytest.ini`` and tests, a module ``fakes.py`` of
tiny transports (not installed: ``MODULE:ATTR`` must resolve from the current
directory), and a dedicated clause-marked test module ``tiny_suite/`` that
stands in for the real suite (``--zmq-suite``/``--suite``), so the plugin's
mechanics are checked in well under a second per run. The fakes are pure
logic: what is under test here is the plugin, not ZeroMQ.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import conformance
from conformance.config import hypothesis_warmup
from conformance.config.run_args import plugin_autoloaded

REPO_ROOT = Path(conformance.__file__).resolve().parent.parent
RUN_TIMEOUT_S = 120

FAKES = '''
"""Tiny in-memory transports with known defects."""
import time


class _Conn:
    def __init__(self, peer_id):
        self.peer_id = peer_id
        self.alive = True

    def send(self, msg):
        pass

    def recv(self):
        return []

    def mark_dead(self):
        self.alive = False

    def close(self):
        self.alive = False


class Good:
    def __init__(self, local_id, host, port):
        self.local_id = local_id

    def connect(self, peer_id):
        return _Conn(peer_id)

    def poll(self):
        return []

    def close(self):
        pass

    def echo(self, n):
        return n


class Broken(Good):
    """connect() always raises; echo() is off by one from 10 on."""

    def connect(self, peer_id):
        raise RuntimeError("connect always fails")

    def echo(self, n):
        return n if n < 10 else n + 1


class Stuck(Good):
    """poll() never returns."""

    def poll(self):
        time.sleep(3600)


class Sized(Good):
    zmq_conformance_capabilities = {"max_message_bytes": 1024}


NOT_CALLABLE = 3
'''

TINY_SUITE = '''
import os
import threading

import pytest
from hypothesis import given, strategies as st

from conformance.errors import CallBlocked
from conformance.config.profiles import active, suite_settings


def _watchdog(call, fn, seconds=0.5):
    box = []
    thread = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise CallBlocked(call, seconds)
    return box[0]


def _node(spec):
    return spec.build("127.0.0.1:5001", "127.0.0.1", 5001)


@pytest.mark.clause("CONN-1")
def test_connect(zmq_transport_spec):
    assert _node(zmq_transport_spec).connect("127.0.0.1:5002").peer_id == "127.0.0.1:5002"


@pytest.mark.clause("MSG-1", "MSG-2")
@suite_settings()
@given(n=st.integers(min_value=0, max_value=10_000))
def test_echo(zmq_transport_spec, n):
    assert _node(zmq_transport_spec).echo(n) == n


@pytest.mark.clause("POLL-4")
def test_poll_quick(zmq_transport_spec):
    assert list(_watchdog("poll()", _node(zmq_transport_spec).poll)) == []


@pytest.mark.clause("MSG-5")
def test_size_limit(zmq_transport_spec):
    limit = zmq_transport_spec.capabilities.max_message_bytes
    if limit is None:
        pytest.skip("capability max_message_bytes not declared")
    assert limit == 1024


@pytest.mark.clause("RES-1")
def test_profile(zmq_transport_spec):
    assert active().name == os.environ.get("TINY_PROFILE", "ci")
    # suite_settings() ran at import time: the profile was active before the import.
    assert test_echo._hypothesis_internal_use_settings.max_examples == active().max_examples


@pytest.mark.clause("HB-1")
@pytest.mark.chaos
def test_partition(zmq_transport_spec):
    assert zmq_transport_spec.name
'''

OWN_TESTS = '''
from hypothesis import given, settings, strategies as st


def test_own():
    assert True


@given(st.integers())
def test_own_hypothesis_keeps_default_settings(x):
    assert settings().max_examples == 100
'''

BROKEN_REFERENCE = '''
"""The reference transport, except that connect() always raises."""
from reference_impl import ZmqTransport


class ConnectRaises(ZmqTransport):
    def connect(self, peer_id):
        raise RuntimeError("deliberately broken connect")
'''


_tables: Path | None = None


def _shared_tables() -> Path:
    """A storage directory with Hypothesis's Unicode tables, built once per test process:
    every project's runs (opted in, they build them before the first test) copy it
    instead of paying seconds of CPU each."""
    global _tables
    if _tables is None:
        where = Path(tempfile.mkdtemp(prefix="zmq-conformance-tables-"))
        atexit.register(shutil.rmtree, where, ignore_errors=True)
        hypothesis_warmup.build_into(where)
        _tables = where
    return _tables


def make_project(root: Path) -> Path:
    """Write the project under ``root`` and return it (its Hypothesis storage holding
    the shared Unicode tables, and no example database)."""
    (root / "tiny_suite").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "pytest.ini").write_text("[pytest]\ntestpaths = tests\n")
    (root / "fakes.py").write_text(textwrap.dedent(FAKES))
    (root / "brokenref.py").write_text(textwrap.dedent(BROKEN_REFERENCE))
    (root / "tiny_suite" / "test_tiny.py").write_text(textwrap.dedent(TINY_SUITE))
    (root / "tests" / "test_own.py").write_text(textwrap.dedent(OWN_TESTS))
    hypothesis_warmup.seed_tables(root / ".hypothesis", _shared_tables())
    return root


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "ZMQ_CONFORMANCE_", "TINY_", "GITHUB_"))
        and k != "COV_CORE_SOURCE"  # GITHUB_*: the project's own CI must not get annotations
    }
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    env.update(extra or {})
    return env


def run_pytest(
    project: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m pytest ARGS`` in ``project`` (plugin loaded as users get it)."""
    plugin = [] if plugin_autoloaded() else ["-p", "conformance.plugin"]
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin, *args],
        cwd=project, env=_env(env), capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
        check=False,
    )


def run_cli(
    project: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``zmq-conformance ARGS`` in ``project`` (through the module, like the script)."""
    return subprocess.run(
        [sys.executable, "-m", "conformance.cli", *args],
        cwd=project, env=_env(env), capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
        check=False,
    )


def load_json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def verdicts(data: dict[str, Any]) -> dict[str, str]:
    return {cid: entry["verdict"] for cid, entry in data["clauses"].items()}


def junit_cases(path: Path) -> dict[str, ET.Element]:
    """Parse the JUnit file (raises on invalid XML) into testcases by clause ID."""
    root = ET.parse(path).getroot()
    assert root.tag == "testsuite"
    return {case.attrib["name"].split()[0]: case for case in root.iter("testcase")}
