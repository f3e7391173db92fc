"""The toxiproxy server the chaos suite uses behaves like toxiproxy 2.x.

Two halves: the HTTP API (endpoints, JSON shapes, status codes) and each
toxic's effect on real TCP traffic between a client socket and an echo
server started here, with measured timings. Timing assertions use the
configured value as a hard lower bound (a toxic that does nothing fails)
and a loose upper bound (2-core loaded CI).

By default the tests target the server ``chaos.fixtures.toxiproxy`` finds:
the embedded one unless a ``toxiproxy-server`` binary is on PATH. To run
them against a real toxiproxy, start one and point ``TOXIPROXY_URL`` at it::

    toxiproxy-server -host 127.0.0.1 -port 8474 &
    TOXIPROXY_URL=http://127.0.0.1:8474 pytest tests/fault_proxy -m chaos

Proxy names carry a per-process prefix, so a shared server is safe under
``pytest -n auto``. The tests of the embedded server's process (CLI, port
reporting, SIGTERM, parent death) always start their own embedded server.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, Protocol

import psutil
import pytest
import requests

import chaos
from chaos import launcher
from chaos.launcher import ENV_SERVER, ENV_URL, ToxiproxyUnavailable, launch
from chaos.proxy import Proxy, Toxiproxy, ToxiproxyError
from conformance.supervision.runqueue import HostDelay

pytestmark = pytest.mark.chaos

_IO_TIMEOUT_S = 5.0
_SLACK_S = 1.5  # loose upper bound on top of any configured delay


# -- helpers ------------------------------------------------------------------

RecordProperty = Callable[[str, object], None]


class EchoServer(Protocol):
    """The ``echo_server`` fixture (tests/fault_proxy/conftest.py)."""

    address: str
    close_command: bytes


def _connect(proxy: Proxy) -> socket.socket:
    sock = socket.create_connection((proxy.listen_host, proxy.listen_port), _IO_TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _recv_exactly(sock: socket.socket, size: int, timeout: float = _IO_TIMEOUT_S) -> bytes:
    deadline = time.monotonic() + timeout
    buf = bytearray()
    while len(buf) < size:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        data = sock.recv(size - len(buf))
        if not data:
            raise ConnectionError(f"EOF after {len(buf)} of {size} bytes")
        buf += data
    return bytes(buf)


def _roundtrip(sock: socket.socket, payload: bytes) -> float:
    """Send ``payload`` through the echo server; return the seconds until it is all back."""
    start = time.monotonic()
    sock.sendall(payload)
    assert _recv_exactly(sock, len(payload)) == payload
    return time.monotonic() - start


def _wait_closed(sock: socket.socket, timeout: float = _IO_TIMEOUT_S) -> tuple[bytes, str]:
    """Read until the peer closes; return (bytes read, "eof" | "reset")."""
    deadline = time.monotonic() + timeout
    buf = bytearray()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"connection still open after {timeout} s ({len(buf)} bytes)")
        sock.settimeout(remaining)
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return bytes(buf), "reset"
        except TimeoutError:
            continue
        if not data:
            return bytes(buf), "eof"
        buf += data


def _assert_silent(sock: socket.socket, seconds: float) -> None:
    """Nothing arrives, and the connection is not closed, for ``seconds``."""
    sock.settimeout(seconds)
    with pytest.raises(TimeoutError):
        data = sock.recv(65536)
        raise AssertionError(f"expected silence, got {data!r}")


def _refused(proxy: Proxy) -> bool:
    try:
        socket.create_connection((proxy.listen_host, proxy.listen_port), 2.0).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.fixture
def proxy(toxiproxy: Toxiproxy, echo_server: EchoServer) -> Iterator[Proxy]:
    """A fresh proxy in front of a fresh echo server."""
    p = toxiproxy.create_proxy(toxiproxy.unique_name("echo"), upstream=echo_server.address)
    try:
        yield p
    finally:
        p.destroy()


class _Api:
    """Raw HTTP access for status-code checks; deletes the proxies it names at teardown."""

    def __init__(self, handle: Toxiproxy) -> None:
        self.url = handle.url
        self.prefix = handle.prefix
        self._names: set[str] = set()
        self._handle = handle

    def name(self, stem: str) -> str:
        full = f"{self.prefix}{self._handle.unique_name(stem)}"
        self._names.add(full)
        return full

    def call(self, method: str, path: str, body: Any = None, raw: bytes | None = None) -> Any:
        return requests.request(
            method, f"{self.url}{path}", json=body, data=raw, timeout=_IO_TIMEOUT_S
        )

    def cleanup(self) -> None:
        for name in self._names:
            self.call("DELETE", f"/proxies/{name}")


@pytest.fixture
def api(toxiproxy: Toxiproxy) -> Iterator[_Api]:
    helper = _Api(toxiproxy)
    try:
        yield helper
    finally:
        helper.cleanup()


# -- HTTP API -----------------------------------------------------------------


def test_version_answers_json(api: _Api) -> None:
    resp = api.call("GET", "/version")
    assert resp.status_code == 200
    assert isinstance(resp.json()["version"], str)


def test_proxy_create_show_list_delete(api: _Api, echo_server: EchoServer) -> None:
    name = api.name("crud")
    resp = api.call(
        "POST", "/proxies", {"name": name, "listen": "127.0.0.1:0", "upstream": echo_server.address}
    )
    assert resp.status_code == 201
    created = resp.json()
    assert set(created) == {"name", "listen", "upstream", "enabled", "Logger", "toxics"}
    assert created["name"] == name
    assert created["upstream"] == echo_server.address
    assert created["enabled"] is True
    assert created["toxics"] == []
    host, _, port = created["listen"].rpartition(":")
    assert host == "127.0.0.1" and int(port) > 0  # port 0 resolved to the bound port

    listing = api.call("GET", "/proxies")
    assert listing.status_code == 200
    assert listing.json()[name] == created

    shown = api.call("GET", f"/proxies/{name}")
    assert shown.status_code == 200 and shown.json() == created

    assert api.call("DELETE", f"/proxies/{name}").status_code == 204
    assert api.call("GET", f"/proxies/{name}").status_code == 404
    assert name not in api.call("GET", "/proxies").json()


def test_proxy_errors(api: _Api, echo_server: EchoServer) -> None:
    name = api.name("errors")
    body = {"name": name, "listen": "127.0.0.1:0", "upstream": echo_server.address}
    assert api.call("POST", "/proxies", body).status_code == 201
    duplicate = api.call("POST", "/proxies", body)
    assert duplicate.status_code == 409
    assert "error" in duplicate.json()

    no_upstream = api.call("POST", "/proxies", {"name": api.name("noup"), "listen": "127.0.0.1:0"})
    assert no_upstream.status_code == 400
    assert api.call("POST", "/proxies", {"upstream": echo_server.address}).status_code == 400
    assert api.call("POST", "/proxies", raw=b"{not json").status_code == 400

    missing = api.name("missing")
    assert api.call("GET", f"/proxies/{missing}").status_code == 404
    assert api.call("POST", f"/proxies/{missing}", {"enabled": False}).status_code == 404
    assert api.call("DELETE", f"/proxies/{missing}").status_code == 404
    assert api.call("GET", f"/proxies/{missing}/toxics").status_code == 404
    assert api.call("POST", f"/proxies/{missing}/toxics", {"type": "latency"}).status_code == 404


def test_toxic_crud_shapes_and_codes(api: _Api, echo_server: EchoServer) -> None:
    name = api.name("toxics")
    api.call(
        "POST", "/proxies", {"name": name, "listen": "127.0.0.1:0", "upstream": echo_server.address}
    )
    base = f"/proxies/{name}/toxics"

    created = api.call("POST", base, {"type": "latency", "attributes": {"latency": 100}})
    assert created.status_code == 200  # toxiproxy answers 200 (not 201) to a toxic create
    toxic = created.json()
    assert toxic["name"] == "latency_downstream"  # default name: <type>_<stream>
    assert toxic["type"] == "latency"
    assert toxic["stream"] == "downstream"  # default stream
    assert toxic["toxicity"] == 1.0  # default toxicity
    assert toxic["attributes"]["latency"] == 100
    assert toxic["attributes"].get("jitter", 0) == 0

    up = api.call(
        "POST",
        base,
        {
            "type": "bandwidth",
            "stream": "upstream",
            "name": "slow",
            "toxicity": 0.5,
            "attributes": {"rate": 10},
        },
    )
    assert up.status_code == 200
    assert up.json()["stream"] == "upstream" and up.json()["toxicity"] == 0.5

    listed = api.call("GET", base)
    assert listed.status_code == 200
    assert sorted(t["name"] for t in listed.json()) == ["latency_downstream", "slow"]
    assert [t["name"] for t in api.call("GET", f"/proxies/{name}").json()["toxics"]] == [
        t["name"] for t in listed.json()
    ]

    shown = api.call("GET", f"{base}/latency_downstream")
    assert shown.status_code == 200 and shown.json() == toxic

    updated = api.call("POST", f"{base}/latency_downstream", {"attributes": {"jitter": 7}})
    assert updated.status_code == 200
    assert updated.json()["attributes"]["latency"] == 100  # kept
    assert updated.json()["attributes"]["jitter"] == 7  # changed

    assert api.call("POST", base, {"type": "latency"}).status_code == 409  # same default name
    assert api.call("POST", base, {"type": "no_such_toxic"}).status_code == 400
    assert api.call("POST", base, {"type": "latency", "stream": "sideways"}).status_code == 400
    assert api.call("GET", f"{base}/nope").status_code == 404
    assert api.call("POST", f"{base}/nope", {"attributes": {}}).status_code == 404

    assert api.call("DELETE", f"{base}/latency_downstream").status_code == 204
    assert api.call("DELETE", f"{base}/latency_downstream").status_code == 404
    assert [t["name"] for t in api.call("GET", base).json()] == ["slow"]


def test_update_enabled_and_populate_and_reset(api: _Api, echo_server: EchoServer) -> None:
    first, second = api.name("pop1"), api.name("pop2")
    body = [
        {"name": first, "listen": "127.0.0.1:0", "upstream": echo_server.address},
        {"name": second, "listen": "127.0.0.1:0", "upstream": echo_server.address},
    ]
    populated = api.call("POST", "/populate", body)
    assert populated.status_code == 201
    proxies = populated.json()["proxies"]
    assert [p["name"] for p in proxies] == [first, second]
    assert all(p["enabled"] for p in proxies)

    disabled = api.call("POST", f"/proxies/{first}", {"enabled": False})
    assert disabled.status_code == 200
    assert disabled.json()["enabled"] is False
    assert disabled.json()["listen"] == proxies[0]["listen"]
    api.call("POST", f"/proxies/{second}/toxics", {"type": "timeout"})

    # A shared real server holds other workers' proxies: only check /reset on our own server.
    if os.environ.get(ENV_URL):
        pytest.skip("POST /reset would disturb other users of the shared server")
    assert api.call("POST", "/reset").status_code == 204
    after = api.call("GET", "/proxies").json()
    assert after[first]["enabled"] is True
    assert after[first]["listen"] == proxies[0]["listen"]  # same address again
    assert after[second]["toxics"] == []


# -- toxics on real TCP ---------------------------------------------------------


def test_passthrough_is_byte_exact(proxy: Proxy) -> None:
    payload = os.urandom(1_000_000)
    with _connect(proxy) as sock:
        sock.sendall(payload[:100])
        assert _recv_exactly(sock, 100) == payload[:100]
        # Large transfer both ways at once: sender and echo overlap, nothing lost or reordered.
        sock.sendall(payload)
        assert _recv_exactly(sock, len(payload), timeout=20) == payload


def test_latency_adds_at_least_its_delay(proxy: Proxy, record_property: RecordProperty) -> None:
    with _connect(proxy) as sock:
        baseline = min(_roundtrip(sock, b"ping") for _ in range(3))
        proxy.add_toxic("latency", latency=200)  # applies to this live connection too
        rtts = [_roundtrip(sock, b"ping") for _ in range(3)]
    record_property("latency_baseline_s", baseline)
    record_property("latency_200ms_rtts_s", rtts)
    assert all(rtt >= 0.2 for rtt in rtts), rtts
    assert max(rtts) < 0.2 + _SLACK_S, rtts


def test_latency_both_streams_add_up_and_jitter_stays_in_range(
    proxy: Proxy, record_property: RecordProperty
) -> None:
    proxy.add_toxic("latency", stream="upstream", latency=100)
    proxy.add_toxic("latency", stream="downstream", latency=100, jitter=50)
    with _connect(proxy) as sock:
        rtts = [_roundtrip(sock, b"ping") for _ in range(5)]
    record_property("latency_100up_100pm50down_rtts_s", rtts)
    # upstream 100 + downstream 100 +/- 50  =>  every round trip >= 150 ms
    assert all(rtt >= 0.15 for rtt in rtts), rtts
    assert max(rtts) < 0.25 + _SLACK_S, rtts


def test_bandwidth_limits_throughput(proxy: Proxy, record_property: RecordProperty) -> None:
    size, rate_kbps = 50_000, 100
    expected = size / (rate_kbps * 1000)  # 0.5 s
    with _connect(proxy) as sock:
        unlimited = _roundtrip(sock, os.urandom(size))
        proxy.add_toxic("bandwidth", rate=rate_kbps)
        limited = _roundtrip(sock, os.urandom(size))
    record_property("bandwidth_unlimited_s", unlimited)
    record_property("bandwidth_100KBps_50KB_s", limited)
    assert limited >= 0.9 * expected, limited
    assert limited < expected + 3.0, limited


def test_timeout_zero_blackholes_until_removed(
    proxy: Proxy, record_property: RecordProperty
) -> None:
    with _connect(proxy) as sock:
        _roundtrip(sock, b"before")
        proxy.add_toxic("timeout", name="partition", timeout=0)
        sock.sendall(b"lost")
        _assert_silent(sock, 0.7)  # no bytes, and the connection is not closed either
        with _connect(proxy) as during:  # new connections are blackholed too
            during.sendall(b"lost too")
            _assert_silent(during, 0.3)
            start = time.monotonic()
            proxy.remove_toxic("partition")
            # As toxiproxy: removing a timeout toxic closes the connections it applied to
            # (bytes were dropped, the stream cannot be trusted), new ones flow again.
            _, how = _wait_closed(sock)
            record_property("timeout_removed_close_s", time.monotonic() - start)
            record_property("timeout_removed_close_kind", how)
            _wait_closed(during)
    with _connect(proxy) as after:
        assert _roundtrip(after, b"healed") < _SLACK_S


def test_timeout_positive_closes_after_timeout(
    proxy: Proxy, record_property: RecordProperty
) -> None:
    proxy.add_toxic("timeout", timeout=300)
    start = time.monotonic()
    with _connect(proxy) as sock:
        sock.sendall(b"never echoed")
        data, how = _wait_closed(sock)
    elapsed = time.monotonic() - start
    record_property("timeout_300ms_close_s", elapsed)
    assert data == b""
    assert 0.3 <= elapsed < 0.3 + _SLACK_S, (elapsed, how)


def test_reset_peer_resets_the_connection(proxy: Proxy) -> None:
    proxy.add_toxic("reset_peer", timeout=0)
    with _connect(proxy) as sock:
        sock.sendall(b"trigger")
        data, how = _wait_closed(sock)
    assert (data, how) == (b"", "reset")


def test_reset_peer_waits_for_its_timeout(proxy: Proxy, record_property: RecordProperty) -> None:
    proxy.add_toxic("reset_peer", stream="upstream", timeout=300)
    with _connect(proxy) as sock:
        start = time.monotonic()
        sock.sendall(b"trigger")
        data, how = _wait_closed(sock)
        elapsed = time.monotonic() - start
    record_property("reset_peer_300ms_s", elapsed)
    assert how == "reset" and data == b""
    assert 0.3 <= elapsed < 0.3 + _SLACK_S, elapsed


def test_slicer_delivers_everything_in_many_reads(
    proxy: Proxy, record_property: RecordProperty
) -> None:
    proxy.add_toxic("slicer", average_size=100, size_variation=20, delay=20_000)
    payload = os.urandom(2000)
    reads: list[int] = []
    with _connect(proxy) as sock:
        start = time.monotonic()
        sock.sendall(payload)
        buf = bytearray()
        while len(buf) < len(payload):
            sock.settimeout(_IO_TIMEOUT_S)
            data = sock.recv(65536)
            assert data, "EOF before all sliced bytes arrived"
            reads.append(len(data))
            buf += data
        elapsed = time.monotonic() - start
    record_property("slicer_reads", reads)
    record_property("slicer_elapsed_s", elapsed)
    assert bytes(buf) == payload
    assert len(reads) >= 4, reads  # ~20 slices 20 ms apart: a loaded box still sees several
    assert elapsed >= 0.2, elapsed  # at least ~10 of the ~19 inter-slice delays


def test_limit_data_closes_after_n_bytes(proxy: Proxy) -> None:
    proxy.add_toxic("limit_data", bytes=100)
    with _connect(proxy) as sock:
        sock.sendall(b"x" * 300)
        data, _ = _wait_closed(sock)
    assert data == b"x" * 100


def test_slow_close_delays_the_close(
    proxy: Proxy, echo_server: EchoServer, record_property: RecordProperty
) -> None:
    with _connect(proxy) as sock:
        start = time.monotonic()
        sock.sendall(echo_server.close_command)
        _wait_closed(sock)
        fast = time.monotonic() - start
    proxy.add_toxic("slow_close", delay=300)
    with _connect(proxy) as sock:
        _roundtrip(sock, b"still works")
        start = time.monotonic()
        sock.sendall(echo_server.close_command)
        _wait_closed(sock)
        slow = time.monotonic() - start
    record_property("slow_close_baseline_s", fast)
    record_property("slow_close_300ms_s", slow)
    assert slow >= 0.3, slow
    assert slow < 0.3 + _SLACK_S, slow


def test_disable_closes_connections_and_refuses_then_enable_listens_again(
    proxy: Proxy,
) -> None:
    listen = proxy.listen
    with _connect(proxy) as sock:
        _roundtrip(sock, b"up")
        proxy.disable()
        assert proxy.info().enabled is False
        _wait_closed(sock)
    assert _refused(proxy)
    proxy.enable()
    assert proxy.listen == listen
    with _connect(proxy) as sock:
        assert _roundtrip(sock, b"back") < _SLACK_S


def test_delete_closes_connections_and_listener(
    toxiproxy: Toxiproxy, echo_server: EchoServer
) -> None:
    p = toxiproxy.create_proxy(toxiproxy.unique_name("doomed"), upstream=echo_server.address)
    with _connect(p) as sock:
        _roundtrip(sock, b"hi")
        p.destroy()
        _wait_closed(sock)
    assert _refused(p)
    assert p not in toxiproxy.proxies()


def test_toxicity_zero_never_applies_and_one_always_does(proxy: Proxy) -> None:
    proxy.add_toxic("latency", name="never", latency=1000, toxicity=0.0)
    for _ in range(5):
        with _connect(proxy) as sock:
            assert _roundtrip(sock, b"fast") < 0.5
    proxy.add_toxic("latency", name="always", latency=200, toxicity=1.0)
    with _connect(proxy) as sock:
        assert _roundtrip(sock, b"slow") >= 0.2


def test_toxic_update_applies_to_live_connections(proxy: Proxy) -> None:
    with _connect(proxy) as sock:
        proxy.add_toxic("latency", latency=0)
        assert _roundtrip(sock, b"a") < 0.5
        proxy.update_toxic("latency_downstream", latency=300)
        assert _roundtrip(sock, b"b") >= 0.3
        proxy.remove_toxic("latency_downstream")
        assert _roundtrip(sock, b"c") < 0.5


def test_unreachable_upstream_closes_the_client(toxiproxy: Toxiproxy) -> None:
    with socket.socket() as probe:  # a port with nothing listening
        probe.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{probe.getsockname()[1]}"
    p = toxiproxy.create_proxy(toxiproxy.unique_name("dead"), upstream=dead)
    try:
        with _connect(p) as sock:
            sock.sendall(b"anyone?")
            data, _ = _wait_closed(sock)
        assert data == b""
    finally:
        p.destroy()


# -- the client handle ------------------------------------------------------------


def test_handle_typed_api_and_errors(toxiproxy: Toxiproxy, echo_server: EchoServer) -> None:
    p = toxiproxy.create_proxy(toxiproxy.unique_name("typed"), upstream=echo_server.address)
    try:
        assert p.name.startswith(toxiproxy.prefix)
        info = p.add_toxic("latency", stream="upstream", latency=10)
        assert (info.name, info.stream, info.attributes["latency"]) == (
            "latency_upstream",
            "upstream",
            10,
        )
        assert p.update_toxic("latency_upstream", latency=20).attributes["latency"] == 20
        with pytest.raises(ToxiproxyError, match=r"exists|409"):
            p.add_toxic("latency", stream="upstream", latency=10)
        with pytest.raises(ToxiproxyError, match="no_such"):
            p.remove_toxic("no_such")
        with p.disabled():
            assert p.info().enabled is False
        toxiproxy.reset()
        assert p.info().enabled is True and p.toxics() == []
        with _connect(p) as sock, p.partitioned():
            assert {t.name for t in p.toxics()} == {"partition_upstream", "partition_downstream"}
            sock.sendall(b"into the void")
            _assert_silent(sock, 0.3)
        assert p.toxics() == []
    finally:
        p.destroy()
    p.destroy()  # idempotent


# -- the embedded server process ---------------------------------------------------


def _embedded_env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(chaos.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def _readline(stream: IO[bytes] | None, timeout: float = 15.0) -> bytes:
    """First line a child prints, or fail after ``timeout`` (never hang the run)."""
    assert stream is not None
    ready, _, _ = select.select([stream], [], [], timeout)
    assert ready, f"child printed nothing within {timeout} s"
    return stream.readline()


def _gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.05)
    return _gone(pid)


def test_embedded_cli_reports_port_and_stops_cleanly_on_sigterm(
    tmp_path: Path, echo_server: EchoServer
) -> None:
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "chaos.toxiproxy_server",
            "-host",
            "127.0.0.1",
            "-port",
            "0",
            "--port-file",
            str(port_file),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=_embedded_env(),
    )
    try:
        line = _readline(proc.stdout).decode().strip()
        assert line.startswith("listening on 127.0.0.1:"), line
        port = int(line.rpartition(":")[2])
        assert int(port_file.read_text().strip()) == port
        handle = Toxiproxy("127.0.0.1", port)
        p = handle.create_proxy("sigterm", upstream=echo_server.address)
        with _connect(p) as sock:
            _roundtrip(sock, b"hi")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(_IO_TIMEOUT_S) == 0
            _wait_closed(sock)  # no proxied connection outlives the server
        assert _refused(p)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_embedded_server_exits_when_its_parent_dies(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    parent_script = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-m", "chaos.toxiproxy_server",
            "--host", "127.0.0.1", "--port", "0", "--port-file", {str(port_file)!r},
            "--parent-pid", str(os.getpid())], stdout=subprocess.DEVNULL)
        print(child.pid, flush=True)
        time.sleep(60)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_script], stdout=subprocess.PIPE, env=_embedded_env()
    )
    child_pid = 0
    try:
        child_pid = int(_readline(parent.stdout))
        deadline = time.monotonic() + 15
        while not port_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert port_file.exists(), "embedded server never reported its port"
        parent.kill()
        parent.wait()
        assert _wait_gone(child_pid, 5.0), "embedded server outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if child_pid and not _gone(child_pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child_pid, signal.SIGKILL)


def test_launcher_embedded_lease_stops_its_process() -> None:
    lease = launch("embedded")
    proc = lease.process
    assert proc is not None and lease.kind == "embedded"
    assert requests.get(f"{lease.url}/version", timeout=_IO_TIMEOUT_S).status_code == 200
    lease.stop()
    assert proc.poll() is not None
    lease.stop()  # idempotent


def test_launcher_names_the_env_var_when_the_url_is_dead(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv(ENV_URL, f"http://127.0.0.1:{port}")
    with pytest.raises(ToxiproxyUnavailable, match=ENV_URL):
        launch()
    monkeypatch.setenv(ENV_URL, "not a url")
    with pytest.raises(ToxiproxyUnavailable, match=ENV_URL):
        launch()


def test_launcher_starts_a_toxiproxy_server_binary_from_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stand-in "toxiproxy-server" that is our embedded server: checks that the binary
    # path passes real toxiproxy's -host/-port flags and waits until the API answers.
    fake = tmp_path / "toxiproxy-server"
    fake.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m chaos.toxiproxy_server "$@"\n')
    fake.chmod(0o755)
    monkeypatch.delenv(ENV_URL, raising=False)
    monkeypatch.delenv(ENV_SERVER, raising=False)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", _embedded_env()["PYTHONPATH"])
    lease = launch("binary")
    try:
        assert lease.kind == "binary"
        assert requests.get(f"{lease.url}/version", timeout=_IO_TIMEOUT_S).status_code == 200
    finally:
        lease.stop()


def test_launcher_names_the_binary_when_it_cannot_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "toxiproxy-server"
    fake.write_text("#!/bin/sh\necho 'simulated startup failure' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.delenv(ENV_URL, raising=False)
    monkeypatch.delenv(ENV_SERVER, raising=False)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(ToxiproxyUnavailable, match="toxiproxy-server") as info:
        launch()
    assert "simulated startup failure" in str(info.value)
    assert "code 3" in str(info.value)


def test_launcher_starts_the_binary_toxiproxy_server_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``TOXIPROXY_SERVER`` names a binary outside PATH (a release unpacked
    anywhere, or CI's copy); it wins over PATH and over the embedded server."""
    fake = tmp_path / "elsewhere" / "my-toxiproxy"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m chaos.toxiproxy_server "$@"\n')
    fake.chmod(0o755)
    monkeypatch.delenv(ENV_URL, raising=False)
    monkeypatch.setenv(ENV_SERVER, str(fake))
    monkeypatch.setenv("PYTHONPATH", _embedded_env()["PYTHONPATH"])
    lease = launch()
    try:
        assert lease.kind == "binary"
        assert lease.process is not None
        args = lease.process.args
        assert isinstance(args, list) and args[0] == str(fake)
        assert requests.get(f"{lease.url}/version", timeout=_IO_TIMEOUT_S).status_code == 200
    finally:
        lease.stop()


def test_launcher_names_toxiproxy_server_when_it_is_not_a_binary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that asked for a real server never falls back to the embedded one."""
    monkeypatch.delenv(ENV_URL, raising=False)
    monkeypatch.setenv(ENV_SERVER, str(tmp_path / "missing"))
    for prefer in ("auto", "binary"):
        with pytest.raises(ToxiproxyUnavailable, match=ENV_SERVER):
            launch(prefer)


def test_toxiproxy_python_client_works_against_the_server(
    toxiproxy: Toxiproxy, echo_server: EchoServer
) -> None:
    from toxiproxy import Toxiproxy as RawClient
    from toxiproxy.api import APIConsumer

    saved = (APIConsumer.host, APIConsumer.port)
    raw = RawClient()
    raw.update_api_consumer(toxiproxy.host, toxiproxy.port)
    name = f"{toxiproxy.prefix}{toxiproxy.unique_name('raw')}"
    try:
        assert raw.running() and raw.version()
        created = raw.create(upstream=echo_server.address, name=name, listen="127.0.0.1:0")
        assert created.listen.startswith("127.0.0.1:")
        assert raw.get_proxy(name) is not None
        created.add_toxic(type="latency", attributes={"latency": 250})
        assert set(created.toxics()) == {"latency_downstream"}
        host, _, port = created.listen.rpartition(":")
        with socket.create_connection((host, int(port)), _IO_TIMEOUT_S) as sock:
            assert _roundtrip(sock, b"via raw client") >= 0.25
        created.destroy_toxic("latency_downstream")
        assert created.toxics() == {}
        with created.down():
            assert raw.get_proxy(name).enabled is False
        assert raw.get_proxy(name).enabled is True
        assert raw.destroy(created)
        assert raw.get_proxy(name) is None
    finally:
        APIConsumer.host, APIConsumer.port = saved
        with contextlib.suppress(requests.RequestException):
            requests.delete(f"{toxiproxy.url}/proxies/{name}", timeout=_IO_TIMEOUT_S)


def test_disable_under_load_closes_everything_and_stays_responsive(proxy: Proxy) -> None:
    proxy.add_toxic("latency", latency=20)
    socks = [_connect(proxy) for _ in range(10)]
    try:
        for sock in socks:
            sock.sendall(os.urandom(50_000))  # data in flight in every link
        proxy.disable()
        for sock in socks:
            _wait_closed(sock)
        proxy.enable()
        with _connect(proxy) as fresh:
            assert _roundtrip(fresh, b"alive") >= 0.02
    finally:
        for sock in socks:
            sock.close()


def test_server_launched_by_a_killed_process_does_not_outlive_it() -> None:
    parent_script = textwrap.dedent(
        """
        import time
        from chaos.launcher import launch
        lease = launch("embedded")
        print(lease.process.pid, flush=True)
        time.sleep(60)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_script], stdout=subprocess.PIPE, env=_embedded_env()
    )
    child_pid = 0
    try:
        child_pid = int(_readline(parent.stdout))
        assert not _gone(child_pid)
        parent.kill()  # SIGKILL: no atexit, no cleanup in the parent
        parent.wait()
        assert _wait_gone(child_pid, 5.0), "launched server outlived its killed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if child_pid and not _gone(child_pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child_pid, signal.SIGKILL)


def test_launcher_start_limit_runs_out_at_once_for_a_server_that_sleeps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start-up limit does not count the host's run-queue delay, but a server
    that sleeps instead of answering is not waiting for a CPU: it runs out in
    about the limit's wall time, never the patience cap."""
    fake = tmp_path / "toxiproxy-server"
    fake.write_text("#!/bin/sh\nexec sleep 60\n")
    fake.chmod(0o755)
    monkeypatch.delenv(ENV_URL, raising=False)
    monkeypatch.setenv(ENV_SERVER, str(fake))
    monkeypatch.setattr(launcher, "_START_TIMEOUT_S", 0.5)
    started = time.monotonic()
    with pytest.raises(ToxiproxyUnavailable, match="of its own time"):
        launch()
    # Three attempts (a port can be taken between probe and bind), each 0.5 s of
    # own time: far below the 120 s patience cap even on a loaded host.
    assert time.monotonic() - started < 30.0


def test_host_delay_of_a_process_is_never_negative_and_stays_once_it_is_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "sum(range(10**6))"])
    delay = HostDelay(child.pid)
    child.wait(30)
    first = delay.seconds()
    assert first >= 0.0
    assert delay.seconds() == first
