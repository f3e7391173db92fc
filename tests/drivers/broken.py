"""A deliberately broken p2p driver, one failure per mode (``broken.py MODE``).

Modes: ``hang`` (answers the hello and the constructor, then never answers
a ``connect``), ``die`` (writes a last words line on stderr and kills itself
with SIGSEGV on ``connect``), ``junk`` (prints a log line on stdout before
the hello), ``junk-later`` (prints it instead of answering ``connect``),
``version`` (answers the hello with protocol version 2), ``exit`` (exits
with status 3 before the hello, explaining on stderr), ``fork-hang`` (like
``hang``, after starting a grandchild that sleeps: the suite must end it
too).

Written against docs/drivers.md only: the framing is done by hand.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import msgspec

MODE = sys.argv[1]


def read() -> dict:  # type: ignore[type-arg]
    header = sys.stdin.buffer.read(4)
    if len(header) < 4:
        sys.exit(0)
    body: dict = msgspec.msgpack.decode(sys.stdin.buffer.read(int.from_bytes(header, "big")))  # type: ignore[type-arg]
    return body


def write(body: dict) -> None:  # type: ignore[type-arg]
    payload = msgspec.msgpack.encode(body)
    sys.stdout.buffer.write(len(payload).to_bytes(4, "big") + payload)
    sys.stdout.buffer.flush()


if MODE == "exit":
    print("broken driver: cannot load libimpl.so", file=sys.stderr)
    sys.exit(3)
if MODE == "junk":
    print("Starting the driver...", flush=True)
hello = read()
write({"type": "hello", "protocol": 2 if MODE == "version" else 1,
       "contract": hello["contract"]})
if MODE == "fork-hang":
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
while True:
    request = read()
    if request["call"] == "transport":
        write({"id": request["id"], "result": {"handle": 1}})
    elif request["call"] == "connect":
        if MODE in ("hang", "fork-hang"):
            time.sleep(600)
        if MODE == "die":
            print("broken driver: about to crash in connect()", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGSEGV)
        if MODE == "junk-later":
            print("connecting...", flush=True)
            continue
        write({"id": request["id"], "result": {"handle": 2, "peer_id": request["args"]["peer_id"]}})
    else:
        write({"id": request["id"], "result": None})
