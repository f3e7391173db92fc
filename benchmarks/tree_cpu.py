"""CPU of a command's whole process tree, per process kind (docs/gate-time.md, "CPU").

``python -m benchmarks.tree_cpu -- zmq-conformance run --chaos --hypothesis-seed 1``
runs the command and samples ``/proc`` every 20 ms: every process whose
parent is already in the tree joins it, and its last user + system time
seen is its CPU (a process that lives less than one period may be missed;
the total of ``os.times()`` over the reaped tree is printed beside the sum,
and is the figure to quote). Kinds: the command itself, the pytest run's
process, xdist workers, process nodes (execnet or forked), the embedded
toxiproxy servers, other. Linux only.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time
from dataclasses import dataclass

_TICK = os.sysconf("SC_CLK_TCK")
_PERIOD_S = 0.02


@dataclass
class _Proc:
    ppid: int
    start: int
    cmd: str
    ticks: int = 0
    first: float = 0.0


def proc_stat(pid: int) -> tuple[int, int, int] | None:
    """``(ppid, utime + stime, starttime)`` of ``pid``, or ``None`` once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[19])


def proc_cmdline(pid: int) -> str:
    """``pid``'s command line, arguments joined by spaces (``""`` once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def is_pytest_run(cmd: str) -> bool:
    """True for the run's pytest process (the CLI starts it as
    ``-m conformance.supervision.pytest_process``; a plain ``-m pytest`` too)."""
    return " -m pytest" in cmd or " -m conformance.supervision.pytest_process" in cmd


def _kind(pid: int, root: int, tree: dict[int, _Proc]) -> str:
    cmd = tree[pid].cmd
    depth, up = 0, pid
    while up in tree and up != root:
        up, depth = tree[up].ppid, depth + 1
    if pid == root:
        return "command"
    if "toxiproxy_server" in cmd:
        return "toxiproxy server"
    if is_pytest_run(cmd):
        return "pytest run"
    if "_node_forks" in cmd:
        return "process node (forked) or fork server"
    if "exec(eval(" in cmd:
        return "xdist worker" if depth == 2 else "process node (execnet)"
    return "other"


def measure(command: list[str]) -> int:
    started = time.monotonic()
    child = subprocess.Popen(command)
    first = proc_stat(child.pid)
    tree = {child.pid: _Proc(os.getpid(), first[2] if first else 0, " ".join(command))}
    seen: set[int] = set()
    while child.poll() is None:
        now = time.monotonic() - started
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            proc = tree.get(pid)
            if proc is not None:
                stat = proc_stat(pid)
                if stat is not None and stat[2] == proc.start:
                    proc.ticks = stat[1]
                    if now - proc.first < 1.0:  # after a fork, exec changes the name
                        proc.cmd = proc_cmdline(pid) or proc.cmd
            elif pid not in seen:
                seen.add(pid)
                stat = proc_stat(pid)
                if stat is not None and stat[0] in tree:
                    tree[pid] = _Proc(stat[0], stat[2], proc_cmdline(pid), stat[1], now)
        time.sleep(_PERIOD_S)
    wall = time.monotonic() - started
    reaped = os.times()
    kinds: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for pid, proc in tree.items():
        entry = kinds[_kind(pid, child.pid, tree)]
        entry[0] += 1
        entry[1] += proc.ticks / _TICK
    total = reaped.children_user + reaped.children_system
    print(f"wall {wall:.1f} s; CPU of the tree {total:.1f} s "
          f"(user {reaped.children_user:.1f} + sys {reaped.children_system:.1f}); "
          f"sampled {sum(e[1] for e in kinds.values()):.1f} s", file=sys.stderr)
    for kind, (count, cpu) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
        print(f"  {kind:40} {int(count):4d} processes {cpu:6.1f} s CPU", file=sys.stderr)
    return child.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tree_cpu",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="after '--': the command")
    args = parser.parse_args(argv)
    command = [a for a in args.command if a != "--"] if args.command[:1] == ["--"] else \
        list(args.command)
    if not command:
        parser.error("a command to run is required after '--'")
    return measure(command)


if __name__ == "__main__":
    sys.exit(main())
