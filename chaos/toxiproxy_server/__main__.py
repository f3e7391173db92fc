"""Command line: ``python -m chaos.toxiproxy_server [--host H] [--port N] ...``.

Mirrors ``toxiproxy-server``'s ``-host``/``-port``/``-config`` flags (single
or double dash). ``--port 0`` binds a free port; the bound address is
printed as the first stdout line, ``listening on HOST:PORT``, and, with
``--port-file PATH``, the port number is written to PATH atomically
(before the stdout line) once the API accepts requests (nothing else is ever written to stdout, so a
parent may leave the pipe unread). ``--parent-pid PID`` makes the server
exit when that process is gone, so a crashed test run leaves no orphan.
SIGTERM and SIGINT stop it cleanly: listeners and every proxied connection
are closed before exit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from pathlib import Path

from chaos.toxiproxy_server.errors import ApiError
from chaos.toxiproxy_server.server import EmbeddedServer
from conformance.supervision import lifeline

_log = logging.getLogger("chaos.toxiproxy_server")

_PARENT_POLL_S = 0.25


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m chaos.toxiproxy_server",
        description="Embedded toxiproxy-compatible server (HTTP API + TCP fault proxy).",
    )
    parser.add_argument("-host", "--host", default="localhost", help="API host (localhost)")
    parser.add_argument("-port", "--port", type=int, default=8474, help="API port; 0 = any")
    parser.add_argument("-config", "--config", help="JSON file of proxies to populate at start")
    parser.add_argument("--port-file", help="write the bound API port here once ready")
    parser.add_argument("--parent-pid", type=int, help="exit when this process is gone")
    parser.add_argument(
        "--log-level",
        default=os.environ.get("LOG_LEVEL", "warning"),
        help="debug, info, warning (default), error",
    )
    return parser.parse_args(argv)


def _write_port_file(path: str, port: int) -> None:
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(f"{port}\n", encoding="ascii")
    tmp.replace(target)


def _parent_alive(pid: int, *, direct: bool) -> bool:
    if direct and os.getppid() != pid:  # reparented: our parent died
        return False
    return lifeline.process_alive(pid)


async def _watch_parent(pid: int, stop: asyncio.Event) -> None:
    direct = os.getppid() == pid
    while _parent_alive(pid, direct=direct):
        await asyncio.sleep(_PARENT_POLL_S)
    _log.warning("parent process %d is gone; stopping", pid)
    stop.set()


async def _populate_from(server: EmbeddedServer, path: str) -> None:
    entries = json.loads(Path(path).read_text(encoding="utf-8"))
    for entry in entries:
        await server.collection.add_or_replace(
            entry["name"],
            entry.get("listen", ""),
            entry["upstream"],
            enabled=entry.get("enabled", True),
        )


async def _run(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = EmbeddedServer(args.host, args.port)
    try:
        await server.start()
    except OSError as exc:
        print(f"cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    try:
        if args.config:
            try:
                await _populate_from(server, args.config)
            except (OSError, ValueError, KeyError, ApiError) as exc:
                print(f"cannot populate from {args.config}: {exc}", file=sys.stderr)
                return 2
        if args.port_file:
            _write_port_file(args.port_file, server.port)
        print(f"listening on {server.host}:{server.port}", flush=True)
        watcher = None
        if args.parent_pid:
            watcher = loop.create_task(_watch_parent(args.parent_pid, stop))
        await stop.wait()
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
    finally:
        await server.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(
        level=str(args.log_level).upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return asyncio.run(_run(args))


if __name__ == "__main__":
    sys.exit(main())
