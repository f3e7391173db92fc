"""What the embedded fault proxy costs in CPU: its start, each API call, each relayed chunk.

Wall times of the fault proxy are in :mod:`benchmarks.proxy_overhead`; this
module counts CPU seconds, which is what a CPU-bound chaos run (more xdist
workers than cores, one fault proxy per worker) pays. Figures, each the
median of ``repeats`` trials:

- ``start``: the server process's own CPU (``/proc``) from spawn to its first
  ``GET /version`` answer, and the launcher's wall time for it;
- ``api``: per call, client CPU (this process: toxiproxy-python over the
  handle's session) and server CPU, for the chaos machine's calls: create a
  proxy, add a toxic, remove it, delete the proxy;
- ``relay``: server CPU per 64-byte round trip (two chunks) through a proxy
  with no toxic, and with a 1 ms latency toxic on both streams.

Run with ``python -m benchmarks.proxy_cpu``; ``PYTHONPATH=OTHER_TREE``
measures another checkout's server the same way (the launcher starts the
server from the tree ``chaos`` is imported from).
"""

from __future__ import annotations

import os
import socket
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

_TICKS = os.sysconf("SC_CLK_TCK")
API_ROUNDS = 100
ROUND_TRIPS = 2000


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _echo_server() -> tuple[socket.socket, int]:
    listener = socket.create_server(("127.0.0.1", 0))

    def serve(conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener, int(listener.getsockname()[1])


def _start() -> dict[str, float]:
    from chaos.launcher import launch

    began = time.monotonic()
    lease = launch("embedded")
    wall = time.monotonic() - began
    assert lease.process is not None
    cpu = _cpu_s(lease.process.pid)
    lease.stop()
    return {"server_cpu_ms": cpu * 1000, "wall_ms": wall * 1000}


def _api(handle: Any, pid: int, upstream: str) -> dict[str, float]:
    """Client and server CPU per call, over API_ROUNDS rounds of the four calls."""
    client0, server0 = time.process_time(), _cpu_s(pid)
    for _ in range(API_ROUNDS):
        proxy = handle.create_proxy(handle.unique_name("bench"), upstream=upstream)
        proxy.add_toxic("latency", latency=10, jitter=1)
        proxy.remove_toxic("latency_downstream")
        proxy.destroy()
    calls = 4 * API_ROUNDS
    return {
        "client_cpu_us_per_call": (time.process_time() - client0) / calls * 1e6,
        "server_cpu_us_per_call": (_cpu_s(pid) - server0) / calls * 1e6,
    }


def _relay(handle: Any, pid: int, upstream: str, latency_ms: int) -> float:
    """Server CPU (us) per 64-byte round trip through a fresh proxy."""
    proxy = handle.create_proxy(handle.unique_name("relay"), upstream=upstream)
    try:
        if latency_ms:
            for stream in ("upstream", "downstream"):
                proxy.add_toxic("latency", stream=stream, name=f"lat_{stream}",
                                latency=latency_ms)
        with socket.create_connection((proxy.listen_host, proxy.listen_port), 5.0) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            payload = b"x" * 64
            sock.sendall(payload)  # the connection is up before counting
            sock.recv(64)
            before = _cpu_s(pid)
            for _ in range(ROUND_TRIPS):
                sock.sendall(payload)
                got = 0
                while got < len(payload):
                    got += len(sock.recv(65536))
            return (_cpu_s(pid) - before) / ROUND_TRIPS * 1e6
    finally:
        proxy.destroy()


def run(repeats: int = 5, progress: Callable[[str], None] = print) -> dict[str, Any]:
    from chaos.proxy import Toxiproxy

    listener, port = _echo_server()
    upstream = f"127.0.0.1:{port}"
    trials: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        trials.setdefault(key, []).append(value)

    try:
        for trial in range(repeats):
            for key, value in _start().items():
                add(f"start_{key}", value)
            with Toxiproxy.start("embedded") as handle:
                assert handle.lease is not None and handle.lease.process is not None
                pid = handle.lease.process.pid
                for key, value in _api(handle, pid, upstream).items():
                    add(f"api_{key}", value)
                add("relay_no_toxic_server_cpu_us_per_round_trip",
                    _relay(handle, pid, upstream, 0))
                add("relay_latency_1ms_server_cpu_us_per_round_trip",
                    _relay(handle, pid, upstream, 1))
            progress(f"proxy_cpu: trial {trial + 1}/{repeats} done")
    finally:
        listener.close()
    return {
        "median": {key: round(statistics.median(values), 1) for key, values in trials.items()},
        "trials": {key: [round(v, 1) for v in values] for key, values in trials.items()},
        "repeats": repeats,
        "load_1min": os.getloadavg()[0],
    }


def main() -> None:
    import json
    import sys

    print(json.dumps(run(progress=lambda line: print(line, file=sys.stderr)), indent=2))


if __name__ == "__main__":
    main()
