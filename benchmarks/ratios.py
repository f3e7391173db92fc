"""The three reference-vs-raw ratios of issue 23 alone, in interleaved trials.

``python -m benchmarks ratios [--trials N] [--seconds S]``: p2p burst-and-poll
at 64 B, control round trips (and raw DEALER/ROUTER with the reference's
framing, to separate what the framing costs from what the reference adds),
the KV subscriber at 64 B and 4 KiB, and the engine pipeline's 1,000-request
throughput (issue 19) against the plain and the tuned raw PUSH/PULL + msgspec
loops (:mod:`benchmarks.engine_pipeline`; ``--only engine``). Each trial runs both, the
reference first in odd trials and raw first in even ones, so both see the
same load and neither always runs first; the table gives the median of
each and the ratio of the medians, with every trial's own ratio for the
spread; the load average before and after closes the table. The p2p, control
and engine figures come twice: per second of wall time
(the issue's figure) and per second of the process's CPU time (every
thread of both sides), the one a loaded machine moves least. It reuses
the sections' functions (:mod:`benchmarks.transport`, :mod:`.control`,
:mod:`.kv_events`, :mod:`.engine_pipeline`), so the figures are the sections' figures, minutes
sooner than ``python -m benchmarks``.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable

from benchmarks import control, engine_pipeline, kv_events, transport

Trial = Callable[[], float]


def _figures(seconds: float) -> dict[str, tuple[Trial, Trial]]:
    return {
        "p2p burst-and-poll 64 B (msg/s)": (
            lambda: transport.burst_and_poll("reference", 64, seconds),
            lambda: transport.burst_and_poll("baseline", 64, seconds),
        ),
        "control round trips vs REQ/REP (1/s)": (
            lambda: control._reference_round_trips(seconds),
            lambda: control._raw_round_trips(seconds),
        ),
        "p2p burst-and-poll 64 B (msg per CPU-s)": (
            lambda: transport.burst_and_poll("reference", 64, seconds, per_cpu_second=True),
            lambda: transport.burst_and_poll("baseline", 64, seconds, per_cpu_second=True),
        ),
        "control round trips per CPU-s vs REQ/REP": (
            lambda: control._reference_round_trips(seconds, per_cpu_second=True),
            lambda: control._raw_round_trips(seconds, per_cpu_second=True),
        ),
        "control round trips vs raw DEALER/ROUTER (1/s)": (
            lambda: control._reference_round_trips(seconds),
            lambda: control._raw_router_round_trips(seconds),
        ),
        "engine pipeline 1000 x 16 tokens vs raw PUSH/PULL (tokens/s)": (
            lambda: engine_pipeline.throughput("reference"),
            lambda: engine_pipeline.throughput("raw"),
        ),
        "engine pipeline tokens per CPU-s vs raw PUSH/PULL": (
            lambda: engine_pipeline.throughput("reference", per_cpu_second=True),
            lambda: engine_pipeline.throughput("raw", per_cpu_second=True),
        ),
        "engine pipeline 1000 x 16 tokens vs tuned raw (tokens/s)": (
            lambda: engine_pipeline.throughput("reference"),
            lambda: engine_pipeline.throughput("tuned"),
        ),
        "engine pipeline tokens per CPU-s vs tuned raw": (
            lambda: engine_pipeline.throughput("reference", per_cpu_second=True),
            lambda: engine_pipeline.throughput("tuned", per_cpu_second=True),
        ),
        "KV subscriber 64 B (batches/s)": (
            lambda: kv_events.subscriber_throughput("reference", 64),
            lambda: kv_events.subscriber_throughput("baseline", 64),
        ),
        "KV subscriber 4 KiB (batches/s)": (
            lambda: kv_events.subscriber_throughput("reference", 4096),
            lambda: kv_events.subscriber_throughput("baseline", 4096),
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks ratios", description=__doc__)
    parser.add_argument("--trials", type=int, default=5, help="interleaved trials (default 5)")
    parser.add_argument("--seconds", type=float, default=2.0,
                        help="length of one timed trial where a figure has one (default 2)")
    parser.add_argument("--only", nargs="+", metavar="WORD", default=[],
                        help="only the figures whose name contains one of these words "
                             "(e.g. p2p control KV)")
    args = parser.parse_args(argv)
    if args.trials < 1 or not args.seconds > 0:
        parser.error("--trials must be at least 1 and --seconds positive")
    load_before = os.getloadavg()
    print("| figure | reference | raw | ratio of medians | per-trial ratios |")
    print("| --- | ---: | ---: | ---: | --- |")
    for name, (reference, raw) in _figures(args.seconds).items():
        if args.only and not any(word in name for word in args.only):
            continue
        ours: list[float] = []
        theirs: list[float] = []
        for trial in range(args.trials):
            if trial % 2:
                theirs.append(raw())
                ours.append(reference())
            else:
                ours.append(reference())
                theirs.append(raw())
        per_trial = ", ".join(f"{a / b:.2f}" for a, b in zip(ours, theirs, strict=True))
        mine, base = statistics.median(ours), statistics.median(theirs)
        print(f"| {name} | {mine:,.0f} | {base:,.0f} | {mine / base:.2f} | {per_trial} |",
              flush=True)
    load_after = os.getloadavg()
    print(f"\nload average (1, 5, 15 min): before {_load(load_before)}, after {_load(load_after)}")
    return 0


def _load(load: tuple[float, float, float]) -> str:
    return " ".join(f"{x:.1f}" for x in load)


if __name__ == "__main__":
    raise SystemExit(main())
