"""Turn benchmark results into Markdown tables and (optionally) PNG plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _spread(d: dict[str, Any], unit: str = "", digits: int = 0) -> str:
    return f"{d['median']:,.{digits}f}{unit} ({d['min']:,.{digits}f}-{d['max']:,.{digits}f})"


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    out = [
        "# Benchmark results",
        "",
        f"Python {m['python']} on {m['platform']}, {m['cpus']} CPUs; started {results['started']}; "
        f"{results['repeats']} trials per figure; cells are median (min-max).",
        "",
    ]
    if "transport" in results:
        out += _transport(results["transport"])
    if "suite" in results:
        out += _suite(results["suite"])
    if "detection" in results:
        out += _detection(results["detection"])
    if "proxy" in results:
        out += _proxy(results["proxy"])
    if "kv_events" in results:
        out += _kv_events(results["kv_events"])
    if "engine_pipeline" in results:
        from benchmarks import engine_pipeline

        out += engine_pipeline.markdown(results["engine_pipeline"])
    if "curve" in results:
        from benchmarks import curve_cost

        out += curve_cost.markdown(results["curve"])
    if "process" in results:
        from benchmarks import process_nodes

        out += process_nodes.markdown(results["process"])
    return "\n".join(out) + "\n"


def _transport(t: dict[str, Any]) -> list[str]:
    out = [
        "## Reference transport vs raw pyzmq + msgspec baseline",
        "",
        "| payload | reference msg/s | baseline msg/s | reference MB/s | baseline MB/s | ratio |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, row in t["throughput"].items():
        ref, base = row["reference"], row["baseline"]
        out.append(
            f"| {label} | {_spread(ref['msgs_per_s'])} | {_spread(base['msgs_per_s'])} | "
            f"{_spread(ref['mb_per_s'], digits=1)} | {_spread(base['mb_per_s'], digits=1)} | "
            f"{row['ratio']:.2f} |"
        )
    fan = t["fan_in"]
    out.append(
        f"| 64 B, 8 peers fan-in | {_spread(fan['reference']['msgs_per_s'])} | "
        f"{_spread(fan['baseline']['msgs_per_s'])} | | | {fan['ratio']:.2f} |"
    )
    for label, row in t.get("burst", {}).items():
        out.append(
            f"| {label}, burst of 500 then poll (one process) | "
            f"{_spread(row['reference']['msgs_per_s'])} | "
            f"{_spread(row['baseline']['msgs_per_s'])} | | | {row['ratio']:.2f} |"
        )
    lat = t["latency"]
    out += [
        "",
        "| round trip (64 B) | reference | baseline | ratio |",
        "| --- | ---: | ---: | ---: |",
        *(
            f"| {q} µs | {_spread(lat['reference'][f'{q}_us'])} | "
            f"{_spread(lat['baseline'][f'{q}_us'])} | {lat[f'ratio_{q}']:.2f} |"
            for q in ("p50", "p99")
        ),
        "",
    ]
    return out


def _suite(s: dict[str, Any]) -> list[str]:
    out = ["## The suite's own cost (ci profile, reference transport)", ""]
    out += ["| run | wall time s |", "| --- | ---: |"]
    for label, run in s["runs"].items():
        out.append(f"| {label} | {_spread(run['wall_s'], digits=1)} |")
    families = s.get("families_serial_s", {})
    if families:
        out += [
            "",
            "| suite module (clause family) | serial s (sum of test durations) |",
            "| --- | ---: |",
        ]
        out += [f"| {fam} | {secs:.1f} |" for fam, secs in sorted(families.items())]
    if "machines" in s:
        out += [
            "",
            "| stateful machine | examples | seconds | examples/s |",
            "| --- | ---: | ---: | ---: |",
        ]
        for name, row in s["machines"].items():
            out.append(
                f"| {name} | {row['examples']} | {row['seconds']:.1f} | "
                f"{row['examples_per_s']:.1f} |"
            )
    return [*out, ""]


def _detection(d: dict[str, Any]) -> list[str]:
    lo, hi = d["target_ratio"]
    return [
        "## Heartbeat detection of a blackhole partition (reference transport)",
        "",
        f"Interval {d['interval_ms']} ms, timeout {d['timeout_ms']} ms; "
        f"{d['ratio']['n']} trials; target median ratio in [{lo:.2f}, {hi:.2f}].",
        "",
        "| measure | min | median | max |",
        "| --- | ---: | ---: | ---: |",
        f"| detection / timeout | {d['ratio']['min']:.2f} | {d['ratio']['median']:.2f} | "
        f"{d['ratio']['max']:.2f} |",
        "",
    ]


def _proxy(p: dict[str, Any]) -> list[str]:
    out = [
        "## The fault proxy with no toxics vs direct TCP",
        "",
        "| path | round trip µs (p50) | added µs | throughput MB/s | vs direct |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for label, row in p["paths"].items():
        out.append(
            f"| {label} | {_spread(row['rtt_us'])} | +{row['rtt_added_us']:.0f} | "
            f"{_spread(row['mb_per_s'], digits=1)} | {row['throughput_ratio']:.2f} |"
        )
    return [*out, ""]


def _kv_events(k: dict[str, Any]) -> list[str]:
    out = [
        "## KV-event stream: reference publisher and subscriber vs raw pyzmq + msgspec loops",
        "",
        "| side | batch | reference batches/s | baseline batches/s | ratio |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for side in ("publisher", "subscriber"):
        for label, row in k[side].items():
            out.append(
                f"| {side} | {label} | {_spread(row['reference']['batches_per_s'])} | "
                f"{_spread(row['baseline']['batches_per_s'])} | {row['ratio']:.2f} |"
            )
    replay = k["replay"]
    out += [
        "",
        f"Replay of {replay['batches']:,} retained {replay['size']} B batches to one reader "
        f"(request to end marker): {_spread(replay['seconds'], digits=3)} s.",
        "",
    ]
    return out


def plots(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """PNG plots when matplotlib is installed (``pip install matplotlib``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written: list[Path] = []
    if "transport" in results:
        rows = results["transport"]["throughput"]
        labels = list(rows)
        fig, ax = plt.subplots(figsize=(6, 3.5))
        width = 0.38
        for i, kind in enumerate(("reference", "baseline")):
            values = [rows[label][kind]["mb_per_s"]["median"] for label in labels]
            ax.bar([x + i * width for x in range(len(labels))], values, width, label=kind)
        ax.set_xticks([x + width / 2 for x in range(len(labels))], labels)
        ax.set_yscale("log")
        ax.set_ylabel("MB/s (median, log scale)")
        ax.set_title("One-way throughput by payload size")
        ax.legend()
        fig.tight_layout()
        path = out_dir / "throughput.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    if "detection" in results:
        d = results["detection"]
        fig, ax = plt.subplots(figsize=(6, 3.5))
        samples = d["samples_ms"]
        ax.plot(range(1, len(samples) + 1), samples, "o", label="detection")
        timeout, ivl = d["timeout_ms"], d["interval_ms"]
        ax.axhline(timeout, color="k", linestyle="--", label="timeout")
        ax.axhspan(timeout - ivl, timeout + ivl, color="g", alpha=0.15, label="timeout ± interval")
        ax.set_xlabel("trial")
        ax.set_ylabel("ms from fault to alive=False")
        ax.set_title("Blackhole partition detection")
        ax.legend()
        fig.tight_layout()
        path = out_dir / "detection.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written
