"""A timeline of one run: when each test starts and ends on each worker, and why.

``python -m benchmarks.timeline -- zmq-conformance run --chaos --hypothesis-seed 1``
runs the command with this module loaded as a pytest plugin in the run's
process and in every xdist worker (``PYTEST_PLUGINS``, which the CLI's lean
plugin mode keeps), watches the process tree from outside, and prints:

* start-up: the CLI, the pytest run's process (configure, session start),
  each worker (process start, configure, session start, collection), the
  first test;
* per worker: every test's start and end (wall, from the CLI's start), its
  CPU in the worker (all threads) and in the worker's descendants (process
  nodes, the fault proxy server, the host-stall meter), and the time its
  main thread slept in ``time.sleep``, by the two innermost callers (the
  suite's poll loops and fixed windows all pause there);
* the critical path (the worker that ends last) and the teardown: last test,
  each worker's session end and exit, the run's process's exit, the CLI's.

Measuring costs CPU: two scans of ``/proc`` per test, a frame look-up per
sleep, and the runner's scan for exits every 0.1 s: on the shared box the
tree's CPU was 52 s without the timeline, 63 s with it (70 s with the scan
every 20 ms); quote CPU from a run without it. Nothing here is imported by the package; the
findings are in docs/gate-time.md ("Timeline"). Linux only.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Generator, Iterable
from pathlib import Path
from typing import Any

from benchmarks.tree_cpu import is_pytest_run, proc_cmdline, proc_stat

_DIR_ENV = "ZMQ_CONFORMANCE_TIMELINE_DIR"
_TICK = os.sysconf("SC_CLK_TCK")
#: How often the runner scans ``/proc`` for exits: each scan reads every process's
#: ``stat`` (tens of ms of CPU on a busy shared box), so not more often.
_PERIOD_S = 0.1


def _boot_time() -> float:
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime"):
                return float(line.split()[1])
    return 0.0


def _started_at(pid: int) -> float:
    """The wall-clock start of ``pid`` (``time.time()`` scale, clock-tick resolution)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return _boot_time() + int(fields[19]) / _TICK


def _process_table() -> dict[int, tuple[int, int, int]]:
    """Every live process's :func:`benchmarks.tree_cpu.proc_stat`, by pid."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := proc_stat(int(name))) is not None:
            table[int(name)] = stat
    return table


def _descendants(root: int, table: dict[int, tuple[int, int, int]]) -> list[int]:
    """``root``'s live descendants in ``table`` (``root`` itself not included)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for pid, (ppid, _, _) in table.items():
        children[ppid].append(pid)
    found, stack = [], list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, ()))
    return found


def _descendant_ticks(root: int) -> int:
    """User + system clock ticks of the live descendants of ``root``."""
    table = _process_table()
    return sum(table[pid][1] for pid in _descendants(root, table))


# -- the plugin (loaded in the run's process and in every worker) --------------------


class _Recorder:
    """Writes one JSON line per event to ``<dir>/<worker>-<pid>.jsonl``."""

    def __init__(self, directory: Path) -> None:
        self.worker = os.environ.get("PYTEST_XDIST_WORKER", "run")
        path = directory / f"{self.worker}-{os.getpid()}.jsonl"
        self._out = path.open("a", buffering=1, encoding="utf-8")
        self._lock = threading.Lock()
        self.slept = 0.0
        self.by_caller: dict[str, float] = collections.defaultdict(float)
        self.in_test: dict[str, float] = collections.defaultdict(float)

    def event(self, kind: str, **fields: Any) -> None:
        record = {"w": self.worker, "pid": os.getpid(), "t": time.time(), "ev": kind,
                  "cpu": time.process_time(), **fields}
        with self._lock:
            self._out.write(json.dumps(record) + "\n")

    def wrap_sleep(self, sleep: Callable[[float], None]) -> Callable[[float], None]:
        """``time.sleep`` that adds the main thread's sleeps up, by caller."""
        main = threading.main_thread()

        def timed_sleep(seconds: float) -> None:
            began = time.monotonic()
            try:
                sleep(seconds)
            finally:
                if threading.current_thread() is main:
                    spent = time.monotonic() - began
                    self.slept += spent
                    key = _callers(sys._getframe(1))
                    self.by_caller[key] += spent
                    self.in_test[key] += spent

        return timed_sleep


def _callers(frame: Any) -> str:
    names = []
    for _ in range(2):
        if frame is None:
            break
        code = frame.f_code
        names.append(f"{Path(code.co_filename).name}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    return " <- ".join(names)


_RECORDER: _Recorder | None = None
if os.environ.get(_DIR_ENV):
    _RECORDER = _Recorder(Path(os.environ[_DIR_ENV]))
    time.sleep = _RECORDER.wrap_sleep(time.sleep)  # type: ignore[assignment]
    _RECORDER.event("import", started=_started_at(os.getpid()), parent=os.getppid(),
                    parent_started=_started_at(os.getppid()))


def _event(kind: str, **fields: Any) -> None:
    if _RECORDER is not None:
        _RECORDER.event(kind, **fields)


def pytest_configure(config: Any) -> None:
    _event("configure")


def pytest_sessionstart(session: Any) -> None:
    _event("sessionstart")


def pytest_collection_finish(session: Any) -> None:
    _event("collected", tests=len(session.items))


def pytest_testnodedown(node: Any, error: Any) -> None:
    _event("workerdown", node=str(node.gateway.id))


try:  # pytest is there whenever pytest loads this module as a plugin
    import pytest
except ImportError:  # pragma: no cover - the runner side needs no pytest
    pytest = None  # type: ignore[assignment]

if pytest is not None:
    pytest_testnodedown = pytest.hookimpl(optionalhook=True)(pytest_testnodedown)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_protocol(item: Any, nextitem: Any) -> Generator[None, object, object]:
        recorder = _RECORDER
        if recorder is None:
            return (yield)
        recorder.in_test.clear()
        slept, reaped = recorder.slept, _reaped_s()
        ticks = _descendant_ticks(os.getpid())
        began, cpu = time.time(), time.process_time()
        try:
            return (yield)
        finally:
            ended, cpu_end = time.time(), time.process_time()
            descendants = (_descendant_ticks(os.getpid()) - ticks) / _TICK + _reaped_s() - reaped
            recorder.event("test", id=item.nodeid, start=began, end=ended, own_cpu=cpu_end - cpu,
                           desc_cpu=max(descendants, 0.0), sleep=recorder.slept - slept,
                           waits=_top(recorder.in_test, 3))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(session: Any) -> Generator[None, object, object]:
        _event("sessionfinish")
        try:
            return (yield)
        finally:
            if _RECORDER is not None:
                _event("sessionfinished", sleeps=_top(_RECORDER.by_caller, 25))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_unconfigure(config: Any) -> Generator[None, object, object]:
        _event("unconfigure")
        try:
            return (yield)
        finally:
            _event("unconfigured")


def _top(spent: dict[str, float], count: int) -> list[tuple[str, float]]:
    return sorted(spent.items(), key=lambda kv: -kv[1])[:count]


def _reaped_s() -> float:
    times = os.times()
    return times.children_user + times.children_system


# -- the runner and the report ----------------------------------------------------


def _watch(child: subprocess.Popen[bytes]) -> list[dict[str, Any]]:
    """Births and deaths of the child's process tree, polled every :data:`_PERIOD_S`."""
    events: list[dict[str, Any]] = []
    alive: dict[int, str] = {}
    while True:
        tree = {child.pid, *_descendants(child.pid, _process_table())}
        now = time.time()
        for pid in tree - alive.keys():
            alive[pid] = proc_cmdline(pid)[:80]
            events.append({"ev": "born", "pid": pid, "t": now, "cmd": alive[pid]})
        for pid in alive.keys() - tree:
            events.append({"ev": "died", "pid": pid, "t": now, "cmd": alive.pop(pid)})
        if child.poll() is not None:
            return events
        time.sleep(_PERIOD_S)


def _load(directory: Path) -> list[dict[str, Any]]:
    events = []
    for path in sorted(directory.glob("*.jsonl")):
        events += [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return events


def report(events: list[dict[str, Any]], procs: Iterable[dict[str, Any]], started: float,
           ended: float, *, shown_s: float) -> str:
    """The timeline as text (seconds from the command's start)."""
    lines: list[str] = []

    def at(t: float) -> str:
        return f"{t - started:7.2f}"

    lines.append("start-up and teardown (s from the command's start; cpu: that process's)")
    exits = [{"t": p["t"], "ev": "exit", "w": "", "what": "pytest run" if is_pytest_run(p["cmd"])
              else "a worker" if "exec(eval(" in p["cmd"] else "fault proxy" if "toxiproxy"
              in p["cmd"] else "other process", "pid": p["pid"]}
             for p in procs if p["ev"] == "died"]
    for e in sorted([*events, *exits], key=lambda e: e["t"]):
        if e["ev"] == "test":
            continue
        if e["ev"] == "exit":
            if e["what"] != "other process":
                lines.append(f"  {at(e['t'])} {'':5} exit of {e['what']} (pid {e['pid']})")
            continue
        extra = f" (process started at {at(e['started'])})" if e["ev"] == "import" else ""
        lines.append(f"  {at(e['t'])} {e['w']:5} {e['ev']:15} cpu {e['cpu']:5.2f}{extra}")
    lines.append(f"  {at(ended)} {'':5} exit of the command")
    tests = [e for e in events if e["ev"] == "test"]
    by_worker: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for e in tests:
        by_worker[e["w"]].append(e)
    last_end = max((e["end"] for e in tests), default=started)
    for worker in sorted(by_worker):
        run = sorted(by_worker[worker], key=lambda e: e["start"])
        busy = sum(e["end"] - e["start"] for e in run)
        gaps = sum(b["start"] - a["end"] for a, b in itertools.pairwise(run))
        critical = " (critical path)" if run[-1]["end"] == last_end else ""
        lines.append(
            f"\n{worker}{critical}: {len(run)} tests from {at(run[0]['start'])} to "
            f"{at(run[-1]['end'])}; busy {busy:.1f} s, between tests {gaps:.1f} s; CPU in "
            f"the worker {sum(e['own_cpu'] for e in run):.1f} s, in its descendants "
            f"{sum(e['desc_cpu'] for e in run):.1f} s; main thread asleep "
            f"{sum(e['sleep'] for e in run):.1f} s")
        for e in run:
            if e["end"] - e["start"] < shown_s:
                continue
            waits = "; ".join(f"{s:.2f} {k.split(' <- ')[0]}" for k, s in e["waits"][:2])
            lines.append(
                f"  {at(e['start'])}-{at(e['end'])} {e['end'] - e['start']:6.2f} s  cpu "
                f"{e['own_cpu']:5.2f} + {e['desc_cpu']:5.2f}  asleep {e['sleep']:5.2f}  "
                f"{e['id'].split('::')[-1][:60]}  [{waits}]")
    sleeps: dict[str, float] = collections.defaultdict(float)
    for e in events:
        if e["ev"] == "sessionfinished":
            for key, spent in e["sleeps"]:
                sleeps[key] += spent
    if sleeps:
        lines.append("\nmain-thread sleep by caller, all workers (s)")
        lines += [f"  {spent:6.2f}  {key}" for key, spent in _top(sleeps, 15)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.timeline",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--keep", metavar="DIR", default=None,
                        help="write the raw events to DIR (default: a temporary directory)")
    parser.add_argument("--shown", type=float, default=0.5, metavar="SECONDS",
                        help="list tests at least this long (default 0.5)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="after '--': the command")
    args = parser.parse_args(argv)
    command = list(args.command[1:] if args.command[:1] == ["--"] else args.command)
    if not command:
        parser.error("a command to run is required after '--'")
    with tempfile.TemporaryDirectory(prefix="timeline-") as scratch:
        directory = Path(args.keep or scratch)
        directory.mkdir(parents=True, exist_ok=True)
        root = str(Path(__file__).resolve().parent.parent)
        # The command is a run of its own: a worker name inherited from an enclosing
        # xdist run (this tool's own test) would label its main process as that worker.
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
        env = {**inherited, _DIR_ENV: str(directory),
               "PYTEST_PLUGINS": ",".join(p for p in (os.environ.get("PYTEST_PLUGINS"),
                                                      "benchmarks.timeline") if p),
               "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH"))
                                             if p)}
        started = time.time()
        child = subprocess.Popen(command, env=env)
        procs = _watch(child)
        ended = time.time()
        if args.keep:
            (directory / "processes.json").write_text(json.dumps(procs), encoding="utf-8")
        print(report(_load(directory), procs, started, ended, shown_s=args.shown),
              file=sys.stderr)
    return child.returncode or 0


if __name__ == "__main__":
    sys.exit(main())
