"""The embedded server and the real toxiproxy-server answer the same probes alike.

Each test sends one script of API calls, or one traffic probe with its
timings, to two servers this module starts side by side: the embedded
server (``python -m chaos.toxiproxy_server``) and a real
``toxiproxy-server`` binary. It asserts they agree:

- **API bytes**: status, ``Content-Type`` and body of every answer, equal
  after one normalisation, the ports each server chose for its listeners
  (the n-th new port in a script's answers is ``P<n>`` on both sides);
- **toxic behaviour**: what a client sees through each toxic (bytes
  received, how the connection ended, which reads) is equal;
- **timing** where the toxic's timing is its effect (slicer, latency with
  jitter, bandwidth, slow_close, timeouts): medians of interleaved trials
  within 20 % of each other, and both above the configured value.

The real binary is found in this order: ``TOXIPROXY_SERVER``, a
``toxiproxy-server`` on PATH, ``../shared/toxiproxy/toxiproxy-server``
beside the checkout (where the project's CI keeps a copy). Without one the
module is skipped with that reason. Only these tests know of the shared
copy; the product never looks for it.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import requests

from chaos.launcher import ServerLease, launch, start_binary

pytestmark = pytest.mark.chaos

_HTTP_TIMEOUT_S = 10.0
_IO_TIMEOUT_S = 10.0
_TIMING_TOLERANCE = 0.20
_TRIALS = 3
_CLOSE = b"__close__"  # the echo server closes the connection on reading exactly this


class _Echo:
    """What the ``echo_server`` fixture provides (tests/fault_proxy/conftest.py)."""

    address: str
    port: int


@dataclass
class _Server:
    """One of the two servers under comparison, reached over raw HTTP."""

    label: str
    lease: ServerLease

    @property
    def url(self) -> str:
        return self.lease.url

    def call(self, method: str, path: str, body: bytes | None = None) -> requests.Response:
        return requests.request(method, f"{self.url}{path}", data=body, timeout=_HTTP_TIMEOUT_S)

    def proxy(self, name: str, upstream: str) -> int:
        """Create ``name`` on a free loopback port; returns the port."""
        body = f'{{"name":"{name}","listen":"127.0.0.1:0","upstream":"{upstream}"}}'
        resp = self.call("POST", "/proxies", body.encode())
        assert resp.status_code == 201, (self.label, resp.content)
        return int(resp.json()["listen"].rpartition(":")[2])

    def toxic(self, proxy: str, body: str) -> None:
        resp = self.call("POST", f"/proxies/{proxy}/toxics", body.encode())
        assert resp.status_code == 200, (self.label, resp.content)

    def clear(self) -> None:
        """Delete every proxy (the servers are this module's own)."""
        for name in self.call("GET", "/proxies").json():
            self.call("DELETE", f"/proxies/{name}")


@pytest.fixture(scope="module")
def servers(real_binary: str) -> Iterator[tuple[_Server, _Server]]:
    """(real, embedded), both started here and stopped at the module's end."""
    real = _Server("real", start_binary(real_binary))
    try:
        embedded = _Server("embedded", launch("embedded"))
        try:
            yield real, embedded
        finally:
            embedded.lease.stop()
    finally:
        real.lease.stop()


@pytest.fixture
def pair(servers: tuple[_Server, _Server]) -> Iterator[tuple[_Server, _Server]]:
    yield servers
    for server in servers:
        server.clear()


# -- API bytes ----------------------------------------------------------------------

_PORT = re.compile(rb"(?<=127\.0\.0\.1:)\d+|(?<=\[::\]:)\d+")


def _normalised(answers: list[bytes], keep: int) -> list[bytes]:
    """Ports other than ``keep`` renamed P1, P2, ... in order of appearance."""
    names: dict[bytes, bytes] = {}

    def rename(match: re.Match[bytes]) -> bytes:
        port = match.group(0)
        if int(port) == keep:
            return b"ECHO"
        return names.setdefault(port, b"P%d" % (len(names) + 1))

    return [_PORT.sub(rename, answer) for answer in answers]


def _run_script(server: _Server, calls: list[tuple[str, str, str | None]]) -> list[bytes]:
    answers: list[bytes] = []
    for method, path, body in calls:
        resp = server.call(method, path, None if body is None else body.encode())
        content_type = resp.headers.get("Content-Type", "-")
        answers.append(
            f"{method} {path} -> {resp.status_code} {content_type}\n".encode() + resp.content
        )
    return answers


def _script(upstream: str) -> list[tuple[str, str, str | None]]:
    """Create, list, toxic, update and delete calls, errors included."""
    up = f'"upstream":"{upstream}"'
    lo = '"listen":"127.0.0.1:0"'
    calls: list[tuple[str, str, str | None]] = [
        ("GET", "/proxies", None),
        ("POST", "/proxies", f'{{"name":"alpha",{lo},{up}}}'),
        ("POST", "/proxies", f'{{"name":"alpha",{lo},{up}}}'),
        ("POST", "/proxies", f'{{"name":"beta",{lo},{up},"enabled":false}}'),
        ("POST", "/proxies", f'{{{lo},{up}}}'),
        ("POST", "/proxies", f'{{"name":"gamma",{lo}}}'),
        ("POST", "/proxies", f'{{"name":"anywhere",{up}}}'),
        ("POST", "/proxies/anywhere", '{"enabled":false}'),
        ("POST", "/proxies", ""),
        ("GET", "/proxies", None),
        ("GET", "/proxies/alpha", None),
        ("GET", "/proxies/nope", None),
        ("GET", "/proxies/alpha/toxics", None),
    ]
    toxics = [
        '{"type":"latency"}',
        '{"name":"lat","type":"latency","stream":"upstream","attributes":'
        '{"latency":100,"jitter":10}}',
        '{"name":"bw","type":"bandwidth","attributes":{"rate":100},"toxicity":0.5}',
        '{"name":"sc","type":"slow_close","attributes":{"delay":20}}',
        '{"name":"to","type":"timeout","stream":"upstream","attributes":{"timeout":0},'
        '"toxicity":0}',
        '{"name":"rp","type":"reset_peer","attributes":{"timeout":5},"toxicity":0}',
        '{"name":"sl","type":"slicer","attributes":{"average_size":32,"size_variation":24,'
        '"delay":100},"toxicity":0.1}',
        '{"name":"ld","type":"limit_data","stream":"upstream","attributes":{"bytes":1000},'
        '"toxicity":0.25}',
        '{"name":"lat","type":"latency"}',
        '{"name":"x","type":"nope"}',
        '{"name":"y","type":"latency","stream":"sideways"}',
        '{"name":"a<b>&c","type":"latency","toxicity":0.3}',
    ]
    calls += [("POST", "/proxies/alpha/toxics", body) for body in toxics]
    calls += [
        ("POST", "/proxies/nope/toxics", '{"type":"latency"}'),
        ("GET", "/proxies/alpha/toxics", None),
        ("GET", "/proxies/alpha/toxics/lat", None),
        ("GET", "/proxies/alpha/toxics/nope", None),
        ("PATCH", "/proxies/alpha/toxics/lat", '{"attributes":{"jitter":30}}'),
        ("POST", "/proxies/alpha/toxics/bw", '{"toxicity":1}'),
        ("PATCH", "/proxies/alpha/toxics/nope", '{"toxicity":1}'),
        ("GET", "/proxies/alpha", None),
        ("PATCH", "/proxies/alpha", '{"enabled":false}'),
        ("GET", "/proxies/alpha", None),
        ("POST", "/proxies/alpha", '{"enabled":true}'),
        ("PATCH", "/proxies/beta", '{"enabled":true}'),
        ("DELETE", "/proxies/alpha/toxics/lat", None),
        ("DELETE", "/proxies/alpha/toxics/lat", None),
        ("GET", "/proxies", None),
        ("POST", "/reset", None),
        ("GET", "/proxies", None),
        ("POST", "/populate", "[]"),
        ("POST", "/populate", f'[{{"name":"delta",{lo},{up}}},{{"name":"eps",{lo},{up}}}]'),
        ("POST", "/populate", f'[{{"name":"zeta",{lo},{up}}},{{{lo},{up}}}]'),
        ("GET", "/proxies", None),
        ("DELETE", "/proxies/alpha", None),
        ("DELETE", "/proxies/alpha", None),
        ("GET", "/no/such/path", None),
        ("DELETE", "/version", None),
    ]
    return calls


def test_api_answers_are_the_same_bytes(pair: tuple[_Server, _Server], echo_server: _Echo) -> None:
    script = _script(echo_server.address)
    got = {s.label: _normalised(_run_script(s, script), echo_server.port) for s in pair}
    for i, (want, have) in enumerate(zip(got["real"], got["embedded"], strict=True)):
        assert have == want, f"call {i}: {script[i]}\nreal:     {want!r}\nembedded: {have!r}"


def test_version_answers_have_the_same_shape(pair: tuple[_Server, _Server]) -> None:
    """The version string differs by design (the embedded one names itself)."""
    shapes = set()
    for server in pair:
        resp = server.call("GET", "/version")
        shape = re.sub(rb'"version": "[^"]+"', b'"version": "V"', resp.content)
        shapes.add((resp.status_code, resp.headers["Content-Type"], shape))
    assert len(shapes) == 1, shapes


#: Raw requests, each on a fresh connection: the HTTP layer's own answers.
_RAW_REQUESTS: list[bytes] = [
    b"GET /proxies HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /proxies HTTP/1.0\r\n\r\n",
    b"GET /proxies HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /proxies HTTP/1.1\nHost: x\nConnection: close\n\n",
    b"GET /proxies HTTP/1.1\r\n\r\n",
    b"garbage\r\n\r\n",
    b"GET //proxies?a=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /proxies/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /nope HTTP/1.1\r\nHost: x\r\nUser-Agent: Mozilla/5.0\r\nConnection: close\r\n\r\n",
    b"GET /proxies HTTP/1.1\r\nHost: x\r\nUser-Agent: Mozilla/5.0\r\nConnection: close\r\n\r\n",
    b"PUT /proxies HTTP/1.1\r\nHost: x\r\nUser-Agent: Mozilla/5.0\r\nConnection: close\r\n\r\n",
    b"HEAD /version HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"POST /proxies HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close"
    b"\r\n\r\n1\r\n{\r\n1;ext=1\r\n}\r\n0\r\n\r\n",
    b"POST /proxies HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n"
    b"Connection: close\r\n\r\n{}",
    # Pipelined: both answered, in order, on one connection.
    b"GET /proxies/a HTTP/1.1\r\nHost: x\r\n\r\nGET /reset HTTP/1.1\r\nHost: x\r\n"
    b"Connection: close\r\n\r\n",
]


def _raw_exchange(port: int, request: bytes) -> bytes:
    """Send ``request``; everything answered until the server closes or falls silent,
    with ``Date`` values and toxiproxy's request ids blanked."""
    with socket.create_connection(("127.0.0.1", port), _IO_TIMEOUT_S) as sock:
        sock.sendall(request)
        sock.settimeout(0.5)
        answer = b""
        with contextlib.suppress(TimeoutError):
            while data := sock.recv(65536):
                answer += data
    answer = re.sub(rb"Date: [^\r\n]+", b"Date: D", answer)
    return re.sub(rb"X-Toxiproxy-Request-Id: [^\r\n]+\r\n", b"", answer)


def test_http_layer_answers_the_same(pair: tuple[_Server, _Server]) -> None:
    """Keep-alive and close, HTTP/1.0, bare LF lines, a missing Host, a malformed
    request line, mux's path cleaning and 405s, the browser check only on matched
    routes, chunked bodies, ``Expect: 100-continue`` and pipelining: the same
    bytes (``Date`` and toxiproxy's random request id aside)."""
    real, embedded = pair
    for request in _RAW_REQUESTS:
        want = _raw_exchange(real.lease.port, request)
        have = _raw_exchange(embedded.lease.port, request)
        assert have == want, f"{request!r}\nreal:     {want!r}\nembedded: {have!r}"


# -- traffic probes -----------------------------------------------------------------


@dataclass(frozen=True)
class _Outcome:
    """What a client saw: bytes received, then how the wait ended."""

    received: int
    end: str  # "open" (nothing more within the wait), "eof" or "reset"


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), _IO_TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _watch(sock: socket.socket, wait_s: float, until: int | None = None) -> _Outcome:
    """Read until EOF, a reset, ``until`` bytes, or ``wait_s`` of silence."""
    got = 0
    sock.settimeout(wait_s)
    while until is None or got < until:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            return _Outcome(got, "open")
        except ConnectionResetError:
            return _Outcome(got, "reset")
        if not data:
            return _Outcome(got, "eof")
        got += len(data)
    return _Outcome(got, "open")


def _timed(sock: socket.socket, size: int) -> tuple[list[int], float]:
    """Reads until ``size`` bytes came; their sizes and the time taken."""
    reads: list[int] = []
    start = time.monotonic()
    sock.settimeout(_IO_TIMEOUT_S)
    while sum(reads) < size:
        data = sock.recv(65536)
        assert data, f"EOF after {sum(reads)} of {size} bytes"
        reads.append(len(data))
    return reads, time.monotonic() - start


Probe = Callable[[_Server, str, str], object]
"""A probe gets a server, a fresh proxy's name on it and that proxy's port as text."""


def _both(pair: tuple[_Server, _Server], echo: _Echo, probe: Probe) -> dict[str, object]:
    results: dict[str, object] = {}
    for server in pair:
        name = f"probe{len(results)}"
        port = server.proxy(name, echo.address)
        try:
            results[server.label] = probe(server, name, str(port))
        finally:
            server.call("DELETE", f"/proxies/{name}")
    return results


def _same(pair: tuple[_Server, _Server], echo: _Echo, probe: Probe) -> object:
    results = _both(pair, echo, probe)
    assert results["embedded"] == results["real"], results
    return results["real"]


def _blackhole(server: _Server, name: str, port: str) -> object:
    server.toxic(name, '{"name":"t","type":"timeout","attributes":{"timeout":0}}')
    with _connect(int(port)) as sock:
        sock.sendall(b"x" * 100)
        held = _watch(sock, 0.3)
        server.call("DELETE", f"/proxies/{name}/toxics/t")
        healed = _watch(sock, 1.0)
    return held, healed


def _blackhole_lets_the_close_through(server: _Server, name: str, port: str) -> object:
    """The echo closes behind a timeout toxic: the close crosses, on both servers."""
    server.toxic(name, '{"name":"t","type":"timeout","attributes":{"timeout":0}}')
    with _connect(int(port)) as sock:
        sock.sendall(_CLOSE)
        return _watch(sock, 0.4)


def _timeout_closes(server: _Server, name: str, port: str) -> object:
    server.toxic(name, '{"type":"timeout","attributes":{"timeout":150}}')
    with _connect(int(port)) as sock:
        sock.sendall(b"x" * 100)
        return _watch(sock, 1.0)


def _reset_peer(server: _Server, name: str, port: str) -> object:
    server.toxic(name, '{"type":"reset_peer","attributes":{"timeout":0}}')
    with _connect(int(port)) as sock:
        sock.sendall(b"x" * 100)
        return _watch(sock, 1.0)


def _reset_peer_on_an_older_connection(server: _Server, name: str, port: str) -> object:
    with _connect(int(port)) as sock:
        sock.sendall(b"x" * 10)
        before = _watch(sock, 1.0, until=10)
        server.toxic(name, '{"type":"reset_peer","attributes":{"timeout":0}}')
        sock.sendall(b"y" * 10)
        return before, _watch(sock, 1.0)


def _limit_data(server: _Server, name: str, port: str) -> object:
    server.toxic(name, '{"type":"limit_data","attributes":{"bytes":1000}}')
    with _connect(int(port)) as sock:
        sock.sendall(os.urandom(3000))
        return _watch(sock, 1.0)


def _limit_data_upstream(server: _Server, name: str, port: str) -> object:
    """What the upstream receives (the echo's answer races the close in toxiproxy)."""
    server.toxic(name, '{"type":"limit_data","stream":"upstream","attributes":{"bytes":700}}')
    with _Sink() as sink:
        server.call("POST", f"/proxies/{name}", f'{{"upstream":"{sink.address}"}}'.encode())
        port = server.call("GET", f"/proxies/{name}").json()["listen"].rpartition(":")[2]
        with _connect(int(port)) as sock:
            sock.sendall(os.urandom(300))
            sock.sendall(os.urandom(3000))
            client = _watch(sock, 1.0)
        return client, sink.received(_IO_TIMEOUT_S)


def _latency_held_data_outlives_the_other_sides_close(
    server: _Server, name: str, port: str
) -> object:
    """The client half-closes while its echo is held by a downstream latency toxic."""
    server.toxic(name, '{"type":"latency","attributes":{"latency":300}}')
    with _connect(int(port)) as sock:
        sock.sendall(b"x" * 100)
        time.sleep(0.1)  # the echo is in the latency toxic now
        sock.shutdown(socket.SHUT_WR)
        return _watch(sock, 1.0)


def _removing_latency_releases_what_it_holds(server: _Server, name: str, port: str) -> object:
    server.toxic(name, '{"name":"slow","type":"latency","attributes":{"latency":2000}}')
    with _connect(int(port)) as sock:
        sock.sendall(b"x" * 100)
        time.sleep(0.1)
        server.call("DELETE", f"/proxies/{name}/toxics/slow")
        return _watch(sock, 1.0, until=100)


class _Sink:
    """A TCP listener that counts what its one connection receives until EOF."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._count = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self._listener.settimeout(_IO_TIMEOUT_S)
        try:
            conn, _ = self._listener.accept()
        except OSError:
            return
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(65536):
                self._count += len(data)
        self._done.set()

    def received(self, wait_s: float) -> tuple[int, bool]:
        """Bytes received, and whether the connection had ended within ``wait_s``.

        The count is read after the wait: the client may see its end before
        this thread has read what the proxy wrote to the sink just before
        closing (read first, the count was 0 or 300 of 700 on both servers in
        about one probe in ten under load).
        """
        ended = self._done.wait(wait_s)
        return self._count, ended

    def __enter__(self) -> _Sink:
        return self

    def __exit__(self, *exc: object) -> None:
        self._listener.close()
        self._thread.join(_IO_TIMEOUT_S)


def _disabled(server: _Server, name: str, port: str) -> object:
    with _connect(int(port)) as sock:
        sock.sendall(b"x" * 10)
        before = _watch(sock, 1.0, until=10)
        resp = server.call("POST", f"/proxies/{name}", b'{"enabled":false}')
        assert resp.status_code == 200
        live = _watch(sock, 1.0)
    try:
        _connect(int(port)).close()
        refused = "accepted"
    except OSError as exc:
        refused = errno.errorcode.get(exc.errno or 0, str(exc))
    server.call("POST", f"/proxies/{name}", b'{"enabled":true}')
    with _connect(int(port)) as sock:
        sock.sendall(b"z" * 10)
        after = _watch(sock, 1.0, until=10)
    return before, live, refused, after


def _toxicity_zero(server: _Server, name: str, port: str) -> object:
    server.toxic(name, '{"type":"timeout","attributes":{"timeout":0},"toxicity":0}')
    with _connect(int(port)) as sock:
        sock.sendall(b"x" * 100)
        return _watch(sock, 1.0, until=100)


def _slicer_pieces(server: _Server, name: str, port: str) -> object:
    server.toxic(
        name,
        '{"type":"slicer","attributes":{"average_size":32,"size_variation":0,"delay":20000}}',
    )
    with _connect(int(port)) as sock:
        sock.sendall(os.urandom(100))
        return _timed(sock, 100)[0]


@pytest.mark.parametrize(
    "probe",
    [
        _blackhole, _blackhole_lets_the_close_through, _timeout_closes, _reset_peer,
        _reset_peer_on_an_older_connection, _limit_data, _limit_data_upstream, _disabled,
        _toxicity_zero, _slicer_pieces, _latency_held_data_outlives_the_other_sides_close,
        _removing_latency_releases_what_it_holds,
    ],
    ids=lambda probe: probe.__name__.strip("_"),
)
def test_toxic_behaviour_is_the_same(
    pair: tuple[_Server, _Server], echo_server: _Echo, probe: Probe
) -> None:
    _same(pair, echo_server, probe)


# -- timing -------------------------------------------------------------------------


def _medians(
    pair: tuple[_Server, _Server], echo: _Echo, probe: Callable[[_Server, str, str], float]
) -> dict[str, float]:
    """Median of ``_TRIALS`` interleaved runs per server (load hits both alike)."""
    samples: dict[str, list[float]] = {s.label: [] for s in pair}
    for _ in range(_TRIALS):
        for label, value in _both(pair, echo, probe).items():
            assert isinstance(value, float)
            samples[label].append(value)
    return {label: statistics.median(values) for label, values in samples.items()}


def _close_enough(medians: dict[str, float], floor_s: float, record: Callable[..., None]) -> None:
    for label, value in medians.items():
        record(f"{label}_ms", round(value * 1000, 1))
        assert value >= floor_s, (label, value, floor_s)
    real, embedded = medians["real"], medians["embedded"]
    assert abs(embedded - real) <= _TIMING_TOLERANCE * real, medians


def _bandwidth_timing(server: _Server, name: str, port: str) -> float:
    server.toxic(name, '{"type":"bandwidth","attributes":{"rate":200}}')
    with _connect(int(port)) as sock:
        sock.sendall(os.urandom(60_000))
        return _timed(sock, 60_000)[1]


def _slow_close_timing(server: _Server, name: str, port: str) -> float:
    server.toxic(name, '{"type":"slow_close","attributes":{"delay":250}}')
    with _connect(int(port)) as sock:
        sock.sendall(b"x")
        _timed(sock, 1)
        start = time.monotonic()
        sock.sendall(_CLOSE)
        assert _watch(sock, 2.0) == _Outcome(0, "eof")
        return time.monotonic() - start


def _timeout_timing(server: _Server, name: str, port: str) -> float:
    server.toxic(name, '{"type":"timeout","attributes":{"timeout":200}}')
    with _connect(int(port)) as sock:
        start = time.monotonic()
        sock.sendall(b"x")
        assert _watch(sock, 2.0) == _Outcome(0, "eof")
        return time.monotonic() - start


@pytest.mark.parametrize(
    ("probe", "floor_s"),
    [
        (_bandwidth_timing, 60_000 / 200_000 * 0.9),
        (_slow_close_timing, 0.250),
        (_timeout_timing, 0.200),
    ],
    ids=lambda v: v.__name__.strip("_") if callable(v) else None,
)
def test_timing_is_within_twenty_percent(
    pair: tuple[_Server, _Server],
    echo_server: _Echo,
    probe: Callable[[_Server, str, str], float],
    floor_s: float,
    record_property: Callable[..., None],
) -> None:
    _close_enough(_medians(pair, echo_server, probe), floor_s, record_property)



def _sliced_read_times(server: _Server, name: str, port: str) -> list[float]:
    server.toxic(
        name,
        '{"type":"slicer","attributes":{"average_size":32,"size_variation":24,"delay":100}}',
    )
    stamps: list[float] = []
    with _connect(int(port)) as sock:
        sock.sendall(os.urandom(25_000))
        got = 0
        sock.settimeout(_IO_TIMEOUT_S)
        start = time.monotonic()
        while got < 25_000:
            data = sock.recv(65536)
            assert data, f"EOF after {got} bytes"
            got += len(data)
            stamps.append(time.monotonic())
    return [start, *stamps]


def test_slicer_timing_is_within_twenty_percent(
    pair: tuple[_Server, _Server], echo_server: _Echo, record_property: Callable[..., None]
) -> None:
    """HB-6's slicer (32 +- 24 bytes, 100 us): the time from one slice to the next.

    The median interval is the slicer's own cost, a real timer per slice
    (about 1.1-1.2 ms on both: epoll waits whole milliseconds). The totals are
    recorded, not compared: on an oversubscribed machine a single-threaded
    asyncio server is stalled more often than Go's goroutines, which other
    threads keep running (load 15 on 2 cores: 90th percentile interval 3.6 ms
    embedded vs 1.2 ms real, totals about 1.05 s vs 0.8 s; on a machine that is
    not oversubscribed the totals match too).
    """
    gaps: dict[str, list[float]] = {s.label: [] for s in pair}
    totals: dict[str, list[float]] = {s.label: [] for s in pair}
    for _ in range(_TRIALS):
        for label, value in _both(pair, echo_server, _sliced_read_times).items():
            assert isinstance(value, list)
            gaps[label] += [b - a for a, b in itertools.pairwise(value[1:])]
            totals[label].append(value[-1] - value[0])
    medians = {label: statistics.median(values) for label, values in gaps.items()}
    for label in medians:
        record_property(f"{label}_slice_interval_ms", round(medians[label] * 1000, 3))
        record_property(f"{label}_total_ms", round(statistics.median(totals[label]) * 1000))
        assert min(totals[label]) >= 25_000 / 56 * 0.6e-3, (label, totals[label])
    real, embedded = medians["real"], medians["embedded"]
    assert real >= 0.0006 and abs(embedded - real) <= _TIMING_TOLERANCE * real, medians


def test_latency_with_jitter_is_within_twenty_percent(
    pair: tuple[_Server, _Server], echo_server: _Echo, record_property: Callable[..., None]
) -> None:
    """``latency(100, jitter 20)`` downstream: round trips on both servers, taken
    in turns so load hits both alike; every one in [80, 120) ms plus slack, and
    their means within 20 %. (Jitter is uniform: the mean of 16 has a spread
    of about 3 ms, far inside the 20 ms allowed.)"""
    socks: dict[str, socket.socket] = {}
    rounds: dict[str, list[float]] = {s.label: [] for s in pair}
    try:
        for server in pair:
            name = f"lat_{server.label}"
            port = server.proxy(name, echo_server.address)
            server.toxic(name, '{"type":"latency","attributes":{"latency":100,"jitter":20}}')
            socks[server.label] = _connect(port)
        for _ in range(16):
            for label, sock in socks.items():
                start = time.monotonic()
                sock.sendall(b"p" * 64)
                _timed(sock, 64)
                rounds[label].append(time.monotonic() - start)
    finally:
        for sock in socks.values():
            sock.close()
    means = {label: statistics.fmean(values) for label, values in rounds.items()}
    for label, values in rounds.items():
        record_property(f"{label}_mean_ms", round(means[label] * 1000, 1))
        assert all(0.080 <= r < 0.120 + 1.0 for r in values), (label, values)
    real, embedded = means["real"], means["embedded"]
    assert abs(embedded - real) <= _TIMING_TOLERANCE * real, means
