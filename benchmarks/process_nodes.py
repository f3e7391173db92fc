"""Process nodes: what they cost, and how precisely a paused node is detected.

Two measurements:

- **Cost.** Wall time of ``zmq-conformance run`` (the ``ci`` profile,
  serial, p2p clauses) with in-process nodes and with ``--nodes process``.
  Every call into a process node is a round trip over an execnet channel,
  and every node a process (reused once its transport closed cleanly).
- **Pause-detection precision.** Each trial builds an in-process observer
  ``a`` and a process node ``b``, establishes a connection both ways, stops
  ``b`` (SIGSTOP) at a drawn moment of the heartbeat cycle (0 to two intervals
  after the handshake) and measures, from the moment the kernel reports ``b``
  stopped, how long until ``a``'s connection reports ``alive == False``, as a
  ratio to the heartbeat timeout. Targets: median in [1.0, 1.2], max <= 1.3.
  A second series pauses ``b`` for a drawn time shorter than ``timeout -
  interval`` and counts deaths on either side while both keep polling for a
  further timeout: the target is none.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks._stats import Spread
from conformance.contracts.p2p.spec import SUITE_HEARTBEAT_IVL_MS as INTERVAL_MS
from conformance.contracts.p2p.spec import SUITE_HEARTBEAT_TIMEOUT_MS as TIMEOUT_MS

#: Detection / timeout targets for a pause.
TARGET_MEDIAN = (1.0, 1.2)
TARGET_MAX = 1.3


def _suite_wall(extra: list[str]) -> float:
    cmd = [sys.executable, "-m", "conformance.cli", "run", "-q", *extra]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}")
    return wall


def _pair(cluster: Any) -> tuple[Any, Any, Any, Any]:
    from conformance.contracts.p2p.harness import handshake, receive

    a, b = cluster.add_node("a"), cluster.add_target("b")
    a_out, b_in = handshake(a, b, hello={"hello": "a"})
    b_in.send({"hello": "b"})
    receive(a_out, 1, nodes=[b], what="b's answer")
    return a, b, a_out, b_in


def _detection_trial(spec: Any, phase_ms: float) -> float | None:
    from conformance.contracts.p2p.chaos_suite._support import watch_deaths
    from conformance.contracts.p2p.process_faults import ProcessCluster

    with ProcessCluster(spec) as cluster:
        a, b, a_out, _ = _pair(cluster)
        # A real pause strikes at any moment of the heartbeat cycle; right after the
        # handshake it would always strike just after a PING (the cycle starts with
        # the connection), which biases detection towards timeout + interval.
        cluster.drive_until(time.monotonic() + phase_ms / 1000, nodes=[a, b])
        fault = cluster.faults.pause(b)
        deaths = watch_deaths({"a": a_out}, nodes=[a],
                              until=fault.in_place_at + 4 * TIMEOUT_MS / 1000)
        return deaths.after(fault.in_place_at).get("a")


def _short_pause_trial(spec: Any, pause_ms: float) -> list[str]:
    from conformance.contracts.p2p.chaos_suite._support import watch_deaths
    from conformance.contracts.p2p.process_faults import ProcessCluster

    with ProcessCluster(spec) as cluster:
        a, b, a_out, b_in = _pair(cluster)
        cluster.faults.pause_for(b, pause_ms, drive=[a])
        deaths = watch_deaths({"a": a_out, "b": b_in}, nodes=[a, b],
                              until=time.monotonic() + (TIMEOUT_MS + INTERVAL_MS) / 1000,
                              stop_when_all_dead=False)
        return sorted(deaths.at)


def run(trials: int = 30, repeats: int = 1,
        progress: Callable[[str], None] = print) -> dict[str, Any]:
    from conformance.contracts.p2p.spec import spec_from_path

    spec = spec_from_path("reference_impl:ZmqTransport")
    walls: dict[str, list[float]] = {"inprocess": [], "process": []}
    for _ in range(repeats):
        for mode in walls:
            wall = _suite_wall(["--nodes", mode])
            walls[mode].append(wall)
            progress(f"suite with {mode} nodes: {wall:.1f} s")

    samples: list[float] = []
    undetected = 0
    phases = random.Random("benchmarks.process_nodes pause phase")
    for n in range(trials):
        ms = _detection_trial(spec, phases.uniform(0, 2 * INTERVAL_MS))
        if ms is None:
            undetected += 1
        else:
            samples.append(ms)
        progress(f"pause trial {n + 1}: " + (f"{ms:.0f} ms" if ms is not None else "undetected"))

    rng = random.Random("benchmarks.process_nodes short pauses")
    below_ms = TIMEOUT_MS - INTERVAL_MS
    pauses: list[float] = []
    false_deaths = 0
    for n in range(trials):
        pause_ms = rng.uniform(0.2 * below_ms, 0.8 * below_ms)
        died = _short_pause_trial(spec, pause_ms)
        pauses.append(pause_ms)
        false_deaths += bool(died)
        progress(f"short pause {n + 1}: {pause_ms:.0f} ms, deaths: {died or 'none'}")

    ratios = [ms / TIMEOUT_MS for ms in samples]
    inproc = Spread.of(walls["inprocess"])
    proc = Spread.of(walls["process"])
    return {
        "interval_ms": INTERVAL_MS,
        "timeout_ms": TIMEOUT_MS,
        "suite_wall_s": {"inprocess": inproc.as_dict(), "process": proc.as_dict()},
        "process_vs_inprocess": round(proc.median / inproc.median, 2),
        "pause_detection_ms": [round(ms, 1) for ms in samples],
        "pause_undetected": undetected,
        "ratio": Spread.of(ratios).as_dict() if ratios else None,
        "target_median_ratio": list(TARGET_MEDIAN),
        "target_max_ratio": TARGET_MAX,
        "short_pause_ms": Spread.of(pauses).as_dict(),
        "short_pause_below_ms": below_ms,
        "short_pause_trials": trials,
        "short_pause_false_deaths": false_deaths,
    }


def markdown(d: dict[str, Any]) -> list[str]:
    """The section's Markdown lines (used by :mod:`benchmarks.render`)."""
    walls = d["suite_wall_s"]
    ratio = d["ratio"]
    lo, hi = d["target_median_ratio"]
    lines = [
        "## Process nodes: cost and pause detection (reference transport)",
        "",
        "| suite (ci profile, serial) | wall s, median (min-max) |",
        "| --- | ---: |",
    ]
    for mode in ("inprocess", "process"):
        w = walls[mode]
        lines.append(f"| --nodes {mode} | {w['median']:.1f} ({w['min']:.1f}-{w['max']:.1f}) |")
    lines += [
        "",
        f"Process nodes cost {d['process_vs_inprocess']:.2f}x the in-process wall time.",
        "",
        f"Pause (SIGSTOP) detection, interval {d['interval_ms']} ms, timeout "
        f"{d['timeout_ms']} ms; target median in [{lo:.1f}, {hi:.1f}], max <= "
        f"{d['target_max_ratio']:.1f}; {d['pause_undetected']} undetected.",
        "",
        "| measure | n | min | median | max |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    if ratio:
        lines.append(f"| detection / timeout | {ratio['n']} | {ratio['min']:.2f} | "
                     f"{ratio['median']:.2f} | {ratio['max']:.2f} |")
    sp = d["short_pause_ms"]
    lines += [
        "",
        f"Pauses shorter than timeout - interval ({d['short_pause_below_ms']} ms; drawn "
        f"{sp['min']:.0f}-{sp['max']:.0f} ms): {d['short_pause_false_deaths']} of "
        f"{d['short_pause_trials']} trials caused a death (target 0).",
        "",
    ]
    return lines
