"""``python -m benchmarks``: run every section, print Markdown, write JSON (+ PNG).

Sections: ``transport`` (reference vs raw baseline), ``suite`` (the suite's
own cost), ``detection`` (heartbeat detection vs the timeout), ``proxy``
(the embedded fault proxy vs direct TCP), ``kv_events`` (the KV-event publisher
and subscriber vs raw loops, replay time), ``process`` (process nodes: suite cost and
pause-detection precision), ``engine_pipeline`` (the engine-pipeline reference vs a raw
PUSH/PULL loop), ``curve`` (every family's reference with CURVE on vs off, same-run
ratios; also ``python -m benchmarks.curve_cost``). Pick some with ``--only``.

``python -m benchmarks ratios`` is the issue-23 reference-vs-raw ratios alone, in
interleaved trials (:mod:`benchmarks.ratios`).
``python -m benchmarks stability ...`` is separate (it takes minutes per run):
consecutive main jobs on the reference, or one test many times; see
:mod:`benchmarks.stability`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import render

#: Section name -> (module, keyword arguments of its ``run`` given ``repeats``).
_SECTIONS: dict[str, tuple[str, Callable[[int], dict[str, int]]]] = {
    "transport": ("benchmarks.transport", lambda r: {"repeats": r}),
    "suite": ("benchmarks.suite_cost", lambda r: {"repeats": max(1, r - 2)}),
    "detection": ("benchmarks.detection", lambda r: {"trials": max(5, r * 3)}),
    "proxy": ("benchmarks.proxy_overhead", lambda r: {"repeats": r}),
    "kv_events": ("benchmarks.kv_events", lambda r: {"repeats": max(1, r - 2)}),
    "control": ("benchmarks.control", lambda r: {"repeats": r}),
    "engine_pipeline": ("benchmarks.engine_pipeline", lambda r: {"repeats": r}),
    "curve": ("benchmarks.curve_cost", lambda r: {"repeats": r}),
    "process": ("benchmarks.process_nodes", lambda r: {"repeats": max(1, r // 2), "trials": 30}),
}
SECTIONS = tuple(_SECTIONS)


def _run_section(name: str, repeats: int) -> dict[str, Any]:
    module_name, kwargs = _SECTIONS[name]
    module = importlib.import_module(module_name)
    result: dict[str, Any] = module.run(progress=_progress, **kwargs(repeats))
    return result


def _progress(line: str) -> None:
    print(f"  .. {line}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["stability"]:
        from benchmarks import stability

        return stability.main(args_in[1:])
    if args_in[:1] == ["ratios"]:
        from benchmarks import ratios

        return ratios.main(args_in[1:])
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--repeats", type=int, default=5, help="trials per figure (default 5)")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("benchmarks/results"),
        help="directory for results.json, results.md and plots",
    )
    args = parser.parse_args(args_in)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    results: dict[str, Any] = {
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": _cpus(),
        },
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "repeats": args.repeats,
    }
    for name in args.only:
        print(f"== {name}", file=sys.stderr, flush=True)
        started = time.monotonic()
        results[name] = _run_section(name, args.repeats)
        results[name]["section_seconds"] = round(time.monotonic() - started, 1)

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    markdown = render.markdown(results)
    (args.out / "results.md").write_text(markdown)
    plots = render.plots(results, args.out)
    print(markdown)
    for plot in plots:
        print(f"plot: {plot}")
    print(f"json: {args.out / 'results.json'}")
    return 0


def _cpus() -> int:
    import os

    return (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )


if __name__ == "__main__":
    raise SystemExit(main())
