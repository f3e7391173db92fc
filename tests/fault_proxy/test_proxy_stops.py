"""A fault proxy that stops mid-run is a run error, never a clause verdict.

Each test starts its own server (it is killed or paused here, so never the
worker's shared one): the embedded server always, the real
``toxiproxy-server`` when one is found (as the parity test finds it). The
kill comes in the middle of a run: after the first proxy was made, or, for
the chaos machines, between two Hypothesis examples, so the next example's
first API call meets the dead server. Before the fix these were ``RES-1``
violations ("building node n0 raised ToxiproxyError ... unreachable"), the
false verdict a fresh-clone CI run once reported 5 of 5 times.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import textwrap
import threading
import time
from pathlib import Path

import pytest

from chaos.launcher import BINARY, start_binary
from chaos.proxy import FaultProxyStopped, Toxiproxy
from conformance.config import profiles
from conformance.contracts.p2p.chaos_machine import ChaosMachine
from conformance.contracts.p2p.machines import ClusterMachine, run_machine
from conformance.contracts.p2p.process_machine import ProcessChaosMachine
from conformance.contracts.p2p.spec import TransportSpec, make_spec
from conformance.errors import RUN_ERROR_PREFIX
from reference_impl import ZmqTransport
from tests.plugin_project import load_json, make_project, run_cli


def _kill(handle: Toxiproxy) -> None:
    assert handle.lease is not None and handle.lease.process is not None
    handle.lease.process.send_signal(signal.SIGKILL)
    handle.lease.process.wait(5)


def test_an_api_call_to_a_killed_proxy_is_a_run_error_with_exit_status_and_log(
    own_server: Toxiproxy,
) -> None:
    own_server.create_proxy("before", upstream="127.0.0.1:9")
    _kill(own_server)
    assert own_server.lease is not None
    with pytest.raises(FaultProxyStopped) as caught:
        own_server.create_proxy("after", upstream="127.0.0.1:9")
    message = str(caught.value)
    assert message.startswith(f"{RUN_ERROR_PREFIX}: the fault proxy at {own_server.url} (")
    assert "stopped: exit status -9 (killed by SIGKILL), last log lines:" in message
    assert "(empty)" not in message, "the server's log should have lines by now"
    # No harness's ``except Exception`` can turn it into a clause violation.
    assert not isinstance(caught.value, Exception)
    assert isinstance(caught.value, pytest.skip.Exception)
    assert own_server.problem() is not None


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


def test_a_paused_proxy_is_named_as_still_there_but_stopped(own_server: Toxiproxy) -> None:
    assert own_server.problem(timeout=15.0) is None
    assert own_server.lease is not None and own_server.lease.process is not None
    process = own_server.lease.process
    process.send_signal(signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 5.0
        while not _stopped(process.pid):
            assert time.monotonic() < deadline, "the server never reached the stopped state"
            time.sleep(0.005)
        problem = own_server.problem(timeout=0.5)
    finally:
        process.send_signal(signal.SIGCONT)
    assert problem is not None
    assert f"its process {process.pid} is still there (stopped: SIGSTOP" in problem


class _Pump:
    """A TCP server that writes to each client as fast as the client lets it."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.closed = threading.Event()
        self.sent = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while not self.closed.is_set():
                conn, _ = self.listener.accept()
                threading.Thread(target=self._pump, args=(conn,), daemon=True).start()

    def _pump(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            while not self.closed.is_set():
                conn.sendall(b"x" * 65536)
                self.sent += 65536

    def wait_blocked(self, quiet_s: float = 0.3, timeout_s: float = 15.0) -> None:
        """Until nothing more could be written for ``quiet_s``: the chain is full."""
        deadline = time.monotonic() + timeout_s
        last, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            if self.sent != last:
                last, since = self.sent, time.monotonic()
            elif self.sent and time.monotonic() - since >= quiet_s:
                return
            time.sleep(0.01)
        raise AssertionError(f"the writer never blocked within {timeout_s} s (sent {last})")

    def close(self) -> None:
        self.closed.set()
        self.listener.close()


def test_the_real_servers_remove_toxic_deadlock_is_a_run_error_naming_it(
    real_binary: str,
) -> None:
    """What stopped the real server in CI: toxiproxy-server 2.x's RemoveToxic never
    returns while the toxic's reader is stalled (a SIGSTOPped node does not read), and
    that proxy's API stays wedged after the reader resumes (Shopify/toxiproxy#558).
    A heal that hangs this way is a run error naming the server, still running."""
    lease = start_binary(real_binary)
    handle = Toxiproxy(lease.host, lease.port, lease=lease)
    pump = _Pump()
    try:
        proxy = handle.create_proxy("stalled", upstream=f"127.0.0.1:{pump.port}")
        proxy.add_toxic("latency", latency=20)
        with socket.create_connection((proxy.listen_host, proxy.listen_port)):
            # The client never reads: the proxy's writer blocks on a full socket.
            assert handle.problem() is None
            pump.wait_blocked()  # the backlog fills the kernel buffers and the toxic
            handle.http_timeout_s = 2.0
            with pytest.raises(FaultProxyStopped) as caught:
                proxy.remove_toxic("latency_downstream")
        message = str(caught.value)
        assert f"the fault proxy at {handle.url} ({BINARY} " in message
        assert "timed out" in message and "Shopify/toxiproxy#558" in message
        assert "is still there (running)" in message
        # Deleting the wedged proxy still works (ChaosCluster.close relies on it), and
        # then no later reset touches it.
        proxy.destroy()
        handle.reset()
        assert handle.problem() is None and not handle.proxies()
    finally:
        pump.close()
        lease.stop()


@pytest.fixture
def spec() -> TransportSpec:
    return make_spec(ZmqTransport)


@pytest.mark.parametrize("machine", [ChaosMachine, ProcessChaosMachine],
                         ids=["chaos_machine", "process_chaos_machine"])
def test_a_proxy_killed_between_machine_examples_is_a_run_error_not_res1(
    own_server: Toxiproxy, spec: TransportSpec, machine: type[ChaosMachine]
) -> None:
    built: list[ClusterMachine] = []

    def build() -> ClusterMachine:
        if len(built) == 1:
            _kill(own_server)  # mid-run: the first example ran against a live server
        built.append(machine(spec, own_server))
        return built[-1]

    settings = profiles.suite_settings(max_examples=3, stateful_step_count=3)
    with pytest.raises(FaultProxyStopped, match="stopped: exit status -9"):
        run_machine(build, settings, seed=1)
    assert len(built) == 2


_TRAFFIC_SUITE = '''
import pytest

from chaos.proxy import Toxiproxy


@pytest.mark.clause("HB-1")
@pytest.mark.chaos
def test_traffic_through_a_proxy_that_dies(toxiproxy: Toxiproxy) -> None:
    toxiproxy.create_proxy("dies", upstream="127.0.0.1:9")
    toxiproxy.lease.process.kill()
    toxiproxy.lease.process.wait(5)
    # What a test sees first when its proxy dies: its traffic breaks.
    raise AssertionError("HB-1: the connection through the proxy died")
'''


def test_a_run_whose_proxy_died_exits_3_with_the_run_error_and_no_verdict(
    tmp_path: Path,
) -> None:
    """End to end: the CLI reports no failed clause, lists the run errors, exits 3."""
    project = make_project(tmp_path / "project")
    (project / "dying_suite").mkdir()
    (project / "dying_suite" / "test_dying.py").write_text(textwrap.dedent(_TRAFFIC_SUITE))
    result = run_cli(project, "run", "--suite", "dying_suite", "--chaos",
                     "--transport", "fakes:Good", "--json", "r.json", "-n", "0",
                     env={"TOXIPROXY_URL": "", "TOXIPROXY_SERVER": ""})
    output = result.stdout + result.stderr
    assert result.returncode == 3, output
    data = load_json(project / "r.json")
    entry = data["clauses"]["HB-1"]
    assert entry["verdict"] == "skipped", entry
    assert entry["reason"].startswith(f"{RUN_ERROR_PREFIX}: the fault proxy at "), entry
    assert "stopped: exit status -9 (killed by SIGKILL)" in entry["reason"], entry
    assert "the test had failed with AssertionError: HB-1" in entry["reason"], entry
    assert len(data["run_errors"]) == 1, data["run_errors"]
    assert "run error: " in result.stderr, output
