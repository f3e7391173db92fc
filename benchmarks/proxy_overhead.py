"""What the fault proxy costs when it injects nothing, and what a slicer costs.

A plain TCP echo server and a sink run in a child process; the same
client measures 64-byte round trips and bulk throughput directly, through
the embedded toxiproxy-compatible server, and through a real toxiproxy when
one is configured (``TOXIPROXY_URL``, ``TOXIPROXY_SERVER`` or
``toxiproxy-server`` on PATH).

Through each proxy it also times a 25,000-byte echo whose way back crosses
``slicer(average_size=32, size_variation=24, delay=100)`` (delay in us): the
work of the chaos suite's HB-6 slicer case. Its cost is per slice, and the
embedded server should take what the real one takes (reference, toxiproxy
2.12.0: 1,160 ms for HB-6's 25 KB exchange; 113 us vs 74 us added round
trip). Run alone with ``python -m benchmarks.proxy_overhead``.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from benchmarks._stats import Spread, percentile
from chaos.launcher import requested

ROUND_TRIPS = 2000
BULK_BYTES = 64 * 1024 * 1024
_CHUNK = 64 * 1024
SLICED_BYTES = 25_000
SLICER = {"average_size": 32, "size_variation": 24, "delay": 100}


def _serve(handler: Callable[[socket.socket], None]) -> tuple[socket.socket, int]:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)

    def accept_loop() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=handler, args=(conn,), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True).start()
    return listener, int(listener.getsockname()[1])


def _echo(conn: socket.socket) -> None:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)


def _sink(conn: socket.socket) -> None:
    with conn:
        total = 0
        while data := conn.recv(1 << 20):
            total += len(data)
        with contextlib.suppress(OSError):
            conn.sendall(b"k")


def _rtts(port: int) -> list[float]:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ping = b"\x01" * 64
        out: list[float] = []
        for _ in range(ROUND_TRIPS):
            started = time.perf_counter()
            sock.sendall(ping)
            got = 0
            while got < len(ping):
                got += len(sock.recv(64 - got))
            out.append(time.perf_counter() - started)
        return sorted(out[ROUND_TRIPS // 10 :])


def _bulk_mb_per_s(port: int) -> float:
    chunk = b"\x02" * _CHUNK
    with socket.create_connection(("127.0.0.1", port)) as sock:
        started = time.perf_counter()
        for _ in range(BULK_BYTES // _CHUNK):
            sock.sendall(chunk)
        sock.shutdown(socket.SHUT_WR)
        sock.recv(1)  # the sink acknowledges after reading everything
        return BULK_BYTES / (time.perf_counter() - started) / 1e6


def _sliced_ms(port: int) -> float:
    """Milliseconds for ``SLICED_BYTES`` to come back through a sliced proxy."""
    payload = b"\x03" * SLICED_BYTES
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        started = time.perf_counter()
        sock.sendall(payload)
        got = 0
        while got < SLICED_BYTES:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError(f"EOF after {got} of {SLICED_BYTES} sliced bytes")
            got += len(data)
        return (time.perf_counter() - started) * 1000


def _measure(echo_port: int, sink_port: int, repeats: int) -> dict[str, Any]:
    p50, thr = [], []
    for _ in range(repeats):
        p50.append(percentile(_rtts(echo_port), 50) * 1e6)
        thr.append(_bulk_mb_per_s(sink_port))
    return {"rtt_us": Spread.of(p50).as_dict(), "mb_per_s": Spread.of(thr).as_dict()}


def _measure_slicer(proxy: Any, repeats: int) -> dict[str, Any]:
    proxy.add_toxic("slicer", name="bench_slicer", stream="downstream", **SLICER)
    try:
        return Spread.of([_sliced_ms(proxy.listen_port) for _ in range(repeats)]).as_dict()
    finally:
        proxy.remove_toxic("bench_slicer")


@contextlib.contextmanager
def _proxied(prefer: str, echo_port: int, sink_port: int) -> Iterator[tuple[Any, int, str]]:
    from chaos.proxy import Toxiproxy

    server = Toxiproxy.start(prefer)  # type: ignore[arg-type]
    try:
        echo = server.create_proxy("bench_echo", f"127.0.0.1:{echo_port}")
        sink = server.create_proxy("bench_sink", f"127.0.0.1:{sink_port}")
        yield echo, sink.listen_port, server.kind
    finally:
        server.stop()


def _servers(ports: Any, stop: Any) -> None:
    """Child process body: echo and sink servers until ``stop`` is set."""
    echo_listener, echo_port = _serve(_echo)
    sink_listener, sink_port = _serve(_sink)
    ports.put((echo_port, sink_port))
    stop.wait()
    echo_listener.close()
    sink_listener.close()


def run(repeats: int = 5, progress: Callable[[str], None] = print) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    ports, stop = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=_servers, args=(ports, stop), daemon=True)
    child.start()
    echo_port, sink_port = ports.get(timeout=30)
    paths: dict[str, Any] = {}
    try:
        paths["direct TCP"] = _measure(echo_port, sink_port, repeats)
        progress(f"direct: {paths['direct TCP']['rtt_us']['median']:.0f} us")
        with _proxied("embedded", echo_port, sink_port) as (echo, ps, _):
            paths["embedded proxy"] = _measure(echo.listen_port, ps, repeats)
            paths["embedded proxy"]["slicer_ms"] = _measure_slicer(echo, repeats)
        progress(f"embedded: {paths['embedded proxy']['rtt_us']['median']:.0f} us")
        if requested() or shutil.which("toxiproxy-server"):
            with _proxied("auto", echo_port, sink_port) as (echo, ps, kind):
                row = _measure(echo.listen_port, ps, repeats)
                row["slicer_ms"] = _measure_slicer(echo, repeats)
                paths[f"real toxiproxy ({kind})"] = row
    finally:
        stop.set()
        child.join(10)
    direct = paths["direct TCP"]
    for row in paths.values():
        row["rtt_added_us"] = row["rtt_us"]["median"] - direct["rtt_us"]["median"]
        row["throughput_ratio"] = row["mb_per_s"]["median"] / direct["mb_per_s"]["median"]
    return {"paths": paths}


def main() -> None:
    """Print the figures as a table (``python -m benchmarks.proxy_overhead``)."""
    result = run(repeats=int(os.environ.get("REPEATS", "5")))
    print("| path | round trip us (p50) | added us | MB/s | vs direct | 25 KB slicer ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for label, row in result["paths"].items():
        sliced = row.get("slicer_ms")
        print(
            f"| {label} | {row['rtt_us']['median']:.0f} | +{row['rtt_added_us']:.0f} | "
            f"{row['mb_per_s']['median']:.0f} | {row['throughput_ratio']:.2f} | "
            f"{'-' if sliced is None else format(sliced['median'], '.0f')} |"
        )


if __name__ == "__main__":
    main()
