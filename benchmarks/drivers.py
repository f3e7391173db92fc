"""What a driver costs: time added per call, each contract's suite through the Python driver.

Two parts:

- **Per call.** The same call on the reference in this process and
  through the Python driver (``python -m conformance.drivers.python``):
  median microseconds over many calls, and the difference, which is what the
  protocol adds (a round trip over two pipes, MessagePack both ways, the
  driver's dispatch). Also what starting a driver costs, and what reusing an
  idle one costs.
- **Per contract.** ``zmq-conformance run --contract C`` on the reference,
  in-process and through the Python driver, with the same Hypothesis seed
  and alternating, so a loaded machine slows both alike. It records the
  wall times, their ratio (issue 20 asks for at most 1.5) and whether the two
  JSON reports give every clause the same verdict.

Run with ``python -m benchmarks.drivers [--repeats N] [--only p2p control ...]``. It
prints Markdown and writes ``benchmarks/results/drivers.json``. The load
average at the start and the end is recorded with the figures, because on a
shared machine the scheduling delay of each round trip dominates the cost.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._stats import Spread

CONTRACTS = {
    "p2p": "reference_impl:ZmqTransport",
    "kv-events-publisher": "reference_impl.kv_events.publisher:KVEventPublisher",
    "kv-events-subscriber": "reference_impl.kv_events.subscriber:KVEventSubscriber",
    "control": "reference_impl.control:REFERENCE",
    "engine-pipeline": "reference_impl.engine_pipeline:REFERENCE",
}
CALLS = 2000
RESULTS = Path(__file__).parent / "results" / "drivers.json"


def python_driver(target: str) -> str:
    return f"{sys.executable} -m conformance.drivers.python {target}"


def _median_us(action: Callable[[], object], calls: int = CALLS) -> float:
    """Median microseconds of ``action``; the mean goes to :data:`_MEANS` (the tail of
    scheduling delays on a loaded machine is what a suite's wall time feels)."""
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        action()
        samples.append(time.perf_counter() - started)
    _MEANS.append(statistics.fmean(samples) * 1e6)
    return statistics.median(samples) * 1e6


_MEANS: list[float] = []


def per_call(progress: Callable[[str], None]) -> dict[str, Any]:
    """Median microseconds per call, in-process and through the Python driver."""
    from conformance import contracts
    from conformance.drivers import driver_spec, shutdown
    from conformance.testing.net import free_port
    from reference_impl import ZmqTransport

    out: dict[str, Any] = {}
    try:
        started = time.perf_counter()
        spec = driver_spec(contracts.get("p2p"), python_driver(CONTRACTS["p2p"]))
        out["driver start (hello), ms"] = (time.perf_counter() - started) * 1e3
        def node(factory: Callable[[str, str, int], Any]) -> Any:
            for attempt in range(8):  # another process may take a free port first
                port = free_port()
                try:
                    return factory(f"127.0.0.1:{port}", "127.0.0.1", port)
                except Exception as exc:
                    if attempt == 7 or "in use" not in str(exc).lower():
                        raise
            raise AssertionError("unreachable")

        started = time.perf_counter()
        driven = [node(spec.build) for _ in range(2)]
        out["first transport (reuses the probed driver + starts one), ms"] = (
            time.perf_counter() - started) * 1e3
        local = [node(ZmqTransport) for _ in range(2)]
        for name, (a, b) in (("in-process", local), ("driver", driven)):
            conn = a.connect(b.local_id)
            conn.send({"warm": 1})
            deadline = time.monotonic() + 5
            inbound: list[Any] = []
            while not inbound and time.monotonic() < deadline:
                inbound = list(b.poll())
            progress(f"per call: p2p {name}")
            message = {"n": 1, "pad": "x" * 48}
            out[f"p2p poll() idle, {name}"] = _median_us(a.poll)
            out[f"p2p alive, {name}"] = _median_us(lambda c=conn: c.alive)  # type: ignore[misc]
            out[f"p2p send(64 B), {name}"] = _median_us(  # below the peer's 1000-message HWM
                lambda c=conn, m=message: c.send(m), calls=500)  # type: ignore[misc]
            out[f"p2p recv() empty, {name}"] = _median_us(
                lambda c=conn: c.recv())  # type: ignore[misc]
        means = dict(zip(("in-process", "driver"), (_MEANS[:4], _MEANS[4:8]), strict=True))
        for index, name in enumerate(("poll() idle", "alive", "send(64 B)", "recv() empty")):
            out[f"p2p {name}, added by the driver"] = (
                out[f"p2p {name}, driver"] - out[f"p2p {name}, in-process"])
            out[f"p2p {name}, added by the driver (mean)"] = (
                means["driver"][index] - means["in-process"][index])
        for transport in (*local, *driven):
            transport.close()
        started = time.perf_counter()
        again = node(spec.build)
        out["transport on a reused driver, ms"] = (time.perf_counter() - started) * 1e3
        again.close()
    finally:
        shutdown()
    return out


def _children_cpu() -> float:
    """CPU seconds (user + system) of every descendant reaped so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run_suite(contract: str, *, driver: bool,
               seed: int) -> tuple[float, float, dict[str, str], dict[str, float],
                                   dict[str, str]]:
    """Wall seconds, CPU seconds, verdicts, each test's seconds and the reason of each
    clause that did not pass (its first failing test's, for a verdict that differs) of one
    suite run.

    The CPU time is the whole tree's: the CLI, its pytest workers, and every
    driver process and engine they started (each is reaped before the run ends,
    so its time is in ``RUSAGE_CHILDREN``)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        which = (["--driver", python_driver(CONTRACTS[contract])] if driver
                 else ["--transport", CONTRACTS[contract]])
        cmd = [sys.executable, "-m", "conformance.cli", "run", "-q", "--contract", contract,
               *which, "--hypothesis-seed", str(seed), "--json", str(report)]
        started, cpu_before = time.monotonic(), _children_cpu()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wall, cpu = time.monotonic() - started, _children_cpu() - cpu_before
        if not report.exists():
            raise RuntimeError(f"{' '.join(cmd)} wrote no report (exit {proc.returncode}):\n"
                               f"{proc.stderr[-2000:]}")
        data = json.loads(report.read_text())
        verdicts = {cid: str(entry["verdict"]) for cid, entry in data["clauses"].items()}
        tests = {str(test["nodeid"]).split("::")[-1]: float(test.get("duration_s") or 0.0)
                 for entry in data["clauses"].values() for test in entry.get("tests", ())}
        reasons = {cid: _reason(entry) for cid, entry in data["clauses"].items()
                   if entry["verdict"] not in ("passed", "skipped")}
        return wall, cpu, verdicts, tests, reasons


def _reason(entry: dict[str, Any]) -> str:
    """Why a clause did not pass: its own reason, else its first test's that has one."""
    found = [str(entry.get("reason") or "")]
    found += [f"{test['nodeid']}: {test['reason']}" for test in entry.get("tests", ())
              if test.get("reason")]
    return next((r for r in found if r), "")[:2000]


def per_contract(contracts: list[str], repeats: int,
                 progress: Callable[[str], None]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for contract in contracts:
        walls: dict[str, list[float]] = {"in-process": [], "driver": []}
        cpus: dict[str, list[float]] = {"in-process": [], "driver": []}
        loads: list[float] = []
        differences: list[str] = []
        tests: dict[str, dict[str, list[float]]] = {"in-process": {}, "driver": {}}
        for trial in range(repeats):
            seed = 1000 + trial
            verdicts: dict[str, dict[str, str]] = {}
            reasons: dict[str, dict[str, str]] = {}
            for mode in ("in-process", "driver"):
                progress(f"{contract}: {mode}, trial {trial + 1}/{repeats}")
                wall, cpu, verdicts[mode], seconds, reasons[mode] = _run_suite(
                    contract, driver=mode == "driver", seed=seed)
                for test, took in seconds.items():
                    tests[mode].setdefault(test, []).append(took)
                walls[mode].append(wall)
                cpus[mode].append(cpu)
                loads.append(os.getloadavg()[0])
            for cid in sorted(set(verdicts["in-process"]) | set(verdicts["driver"])):
                if verdicts["in-process"].get(cid) == verdicts["driver"].get(cid):
                    continue
                why = "; ".join(f"{mode}: {reasons[mode][cid]}" for mode in reasons
                                if reasons[mode].get(cid))
                differences.append(
                    f"seed {seed}: {cid} {verdicts['in-process'].get(cid)} in-process, "
                    f"{verdicts['driver'].get(cid)} through the driver"
                    + (f" ({why})" if why else ""))
        inproc, driven = Spread.of(walls["in-process"]), Spread.of(walls["driver"])
        out[contract] = {
            "in-process wall s": walls["in-process"],
            "driver wall s": walls["driver"],
            "ratio (medians)": driven.median / inproc.median,
            "per-trial wall ratios": [d / i for i, d in zip(walls["in-process"],
                                                            walls["driver"], strict=True)],
            "in-process CPU s": cpus["in-process"],
            "driver CPU s": cpus["driver"],
            "CPU ratio (medians)": (statistics.median(cpus["driver"])
                                    / statistics.median(cpus["in-process"])),
            "load average (1 min) after each run": [round(x, 2) for x in loads],
            "same verdicts": not differences,
            "differences": differences,
            # The tests that cost the driver most: their median seconds in each mode.
            "slowest tests through the driver (median s: in-process, driver)": {
                test: [round(statistics.median(tests["in-process"].get(test, [0.0])), 2),
                       round(statistics.median(times), 2)]
                for test, times in sorted(
                    tests["driver"].items(),
                    key=lambda item: (statistics.median(tests["in-process"].get(item[0], [0.0]))
                                      - statistics.median(item[1])))[:8]},
        }
    return out


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.drivers", description=__doc__)
    parser.add_argument("--repeats", type=int, default=1, help="suite runs per mode (default 1)")
    parser.add_argument("--only", nargs="+", choices=[*CONTRACTS, "calls"],
                        default=[*CONTRACTS, "calls"])
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help=f"where the JSON goes (default {RESULTS.name} in benchmarks/results)")
    args = parser.parse_args(argv)

    def progress(line: str) -> None:
        print(f"  .. {line}", file=sys.stderr, flush=True)

    result: dict[str, Any] = {"load average at start": _load()}
    if "calls" in args.only:
        result["per call (median us, unless ms)"] = per_call(progress)
    chosen = [c for c in CONTRACTS if c in args.only]
    if chosen:
        result["per contract"] = per_contract(chosen, args.repeats, progress)
    result["load average at end"] = _load()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(_markdown(result))
    return 0


def _markdown(result: dict[str, Any]) -> str:
    lines = ["## Drivers: what the protocol costs", "",
             f"Load average at start {result['load average at start']}, at end "
             f"{result['load average at end']} (2 cores).", ""]
    calls = result.get("per call (median us, unless ms)")
    if calls:
        lines += ["| call | median |", "| --- | --- |"]
        lines += [f"| {name} | {value:.1f} |" for name, value in calls.items()]
        lines.append("")
    contracts = result.get("per contract")
    if contracts:
        lines += ["| contract | in-process s | driver s | wall ratio | per trial | "
                  "CPU s in-process | CPU s driver | CPU ratio | load | same verdicts |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]

        def series(values: list[float], form: str = ".0f") -> str:
            return ", ".join(format(v, form) for v in values)

        for name, row in contracts.items():
            lines.append(
                f"| {name} | {series(row['in-process wall s'])} | "
                f"{series(row['driver wall s'])} | {row['ratio (medians)']:.2f} | "
                f"{series(row['per-trial wall ratios'], '.2f')} | "
                f"{series(row['in-process CPU s'])} | {series(row['driver CPU s'])} | "
                f"{row['CPU ratio (medians)']:.2f} | "
                f"{series(row['load average (1 min) after each run'], '.1f')} | "
                f"{'yes' if row['same verdicts'] else 'NO'} |")
        for name, row in contracts.items():
            for difference in row["differences"]:
                lines.append(f"- {name}: {difference}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
