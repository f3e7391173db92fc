"""The engine pipeline through a driver (docs/drivers.md, section 8).

The engine's process is the driver process: a process fault on the suite's
engine object lands on the process that runs the engine, and its exit
status is the engine's. Clients are proxies in driver processes of their
own. Arrays cross the protocol as extension 16 without losing dtype, shape
or bytes. Nothing the tests start outlives them.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from plugin_project import REPO_ROOT, load_json, make_project, run_cli, verdicts

from conformance import contracts
from conformance.contracts.engine_pipeline.harness import Rig, request_id
from conformance.contracts.engine_pipeline.service import from_protocol, to_protocol
from conformance.contracts.engine_pipeline.spec import PipelineSpec
from conformance.drivers import driver_spec, live_pids, shutdown
from conformance.drivers.protocol import decode_body, encode_frame
from reference_impl.engine_pipeline import EngineDead, UtilityFailed

BROKEN_CLIENTS = Path(__file__).parent / "drivers"
REFERENCE = "reference_impl.engine_pipeline:REFERENCE"
PYTHON_DRIVER = f"{shlex.quote(sys.executable)} -m conformance.drivers.python {REFERENCE}"


@pytest.fixture
def spec() -> Iterator[PipelineSpec]:
    built: PipelineSpec = driver_spec(contracts.get("engine-pipeline"), PYTHON_DRIVER)
    yield built
    shutdown()
    assert live_pids() == [], "a driver process outlived the test"


@pytest.mark.parametrize("value", [
    np.arange(3, dtype="<i2"),
    np.array(1.5, dtype=">f8"),  # 0-d, big endian
    np.zeros((0, 3), dtype="<c16"),
    np.arange(24, dtype="<u4").reshape(4, 6).T,  # Fortran order: sent as its C-order bytes
    np.array([b"abc", b"de"], dtype="|S3"),
    np.array(["xy"], dtype="<U2"),
    np.array([1, 2], dtype="<M8[ns]"),
], ids=lambda v: f"{v.dtype.str}{list(v.shape)}")
def test_arrays_cross_the_protocol_exactly(value: Any) -> None:
    frame = encode_frame({"payload": {"a": to_protocol(value), "b": b"\x00"}})
    crossed = decode_body(frame[4:])  # past the length header
    back = from_protocol(crossed["payload"])
    assert back["b"] == b"\x00"
    got = back["a"]
    assert isinstance(got, np.ndarray)
    assert (got.dtype, got.shape) == (value.dtype, value.shape)
    assert got.tobytes() == value.tobytes()


def test_object_arrays_are_refused() -> None:
    import msgspec

    body = msgspec.msgpack.encode(["|O", [1], b"\x00" * 8])
    with pytest.raises(ValueError, match="objects"):
        from_protocol(msgspec.msgpack.Ext(16, body))


def test_the_engine_runs_in_its_driver_process_and_faults_land_there(
        spec: PipelineSpec, tmp_path: Path) -> None:
    with Rig(spec, tmp_path) as rig:
        client, engine = rig.pipeline(clause="PIPE-5")
        assert engine.pid != os.getpid()
        assert client.pid not in (os.getpid(), engine.pid), "a client has its own driver"
        assert client.call("pid", timeout_ms=3000) == engine.pid, (
            "the engine's utility 'pid' names another process than the one the suite faults")
        with pytest.raises(UtilityFailed, match="raised on purpose"):
            client.call("fail", timeout_ms=3000)
        rid = request_id("drv")
        client.add(rid, [1], 3)
        rig.collect(client, [rid], clause="PIPE-2").check(rid, "PIPE-2", max_tokens=3)
        engine.kill()
        assert engine.exit_status(1.0) == -9
        deadline = time.monotonic() + rig.death_bound_s + 1.0
        with pytest.raises(EngineDead):
            while time.monotonic() < deadline:
                client.outputs(50)
        assert not client.alive


def test_an_engine_failure_is_the_driver_process_exit_status(
        spec: PipelineSpec, tmp_path: Path) -> None:
    with Rig(spec, tmp_path) as rig:
        client, engine = rig.pipeline(clause="PIPE-6", model={"raise_at_step": 2})
        client.add(request_id("fail"), [1], 10)
        status = engine.exit_status(rig.death_bound_s + rig.shutdown_bound_s)
        assert status not in (None, 0), f"exit status {status}; {engine.describe()}"
        assert "raised" in engine.stderr_tail() or "failed" in engine.stderr_tail()


@pytest.mark.parametrize(("broken", "clause", "test"), [
    ("THREAD_LEFT", "PIPE-6", "client_close_is_bounded_and_leaves_nothing"),
    ("CLIENT_LOGS_KEY", "PIPE-13", "keyed_peers_are_unaffected_and_no_key_leaks"),
])
def test_a_client_broken_inside_its_driver_process_is_caught(
        tmp_path: Path, broken: str, clause: str, test: str) -> None:
    """PIPE-6 counts the client driver's own threads after close, PIPE-13 reads its stderr:
    a defect that stays in the driver process (a thread left there, a key logged there)
    fails its clause (tests/drivers/broken_pipeline_clients.py). The reference passes
    both tests through the driver in ``test_drivers_equivalence``."""
    project = make_project(tmp_path / "proj")
    driver = (f"{shlex.quote(sys.executable)} -m conformance.drivers.python "
              f"broken_pipeline_clients:{broken}")
    result = run_cli(project, "run", "--contract", "engine-pipeline", "--driver", driver,
                     "--reruns", "0", "--json", "r.json", "-k", test,
                     env={"PYTHONPATH": os.pathsep.join((str(REPO_ROOT), str(BROKEN_CLIENTS)))})
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    got = {cid: v for cid, v in verdicts(load_json(project / "r.json")).items()
           if v != "skipped"}
    assert got == {clause: "failed"}, got
