"""The driver examples in C and Rust (``examples/drivers/``) through the driver bridge.

Each example runs its contract the way an engineer of another language runs
it, ``zmq-conformance run --contract NAME --driver BINARY``: a normal build
passes every clause (skipping only what it declares it does not do), and the
deliberately broken build of each (a compile-time flag, a cargo feature)
fails the very clause its defect breaks, so the examples also prove that the
suite catches a defect in a driver as it does in Python.

The binaries come from ``examples/drivers/build.sh`` (CI runs it before the
tests). Where they are not built, every test here is skipped naming the
script: building them needs Debian packages, which a developer may not have.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "drivers"

#: Clauses an example is skipped on by its own declaration: none implements CURVE
#: (EVS-10, EVT-10), and the C publisher serves one data-parallel rank (EVT-8).
MAY_SKIP = {"kv-events-subscriber": {"EVS-10"}, "kv-events-publisher": {"EVT-8", "EVT-10"}}
#: Known defects of the examples, left out of the pass requirement until fixed (none:
#: both subscribers now rebuild their SUB after a handshake that failed, EVS-11).
KNOWN_GAPS: dict[str, set[str]] = {"kv-events-subscriber": set(), "kv-events-publisher": set()}
#: Each example is under this many lines (``wc -l``), a C driver with the header it includes.
MAX_LINES = 500
SOURCES = {"c-subscriber": ("c/subscriber.c", "c/kvdriver.h"),
           "c-publisher": ("c/publisher.c", "c/kvdriver.h"),
           "rust-subscriber": ("rust/src/main.rs",)}


@dataclass(frozen=True)
class Example:
    """One built driver and what the suite must say about it."""

    name: str
    contract: str
    binary: str  # relative to examples/drivers
    #: For a broken build: the clause its defect breaks, and a -k expression for the
    #: tests of that clause (a short run; the other clauses are not its point).
    breaks: str | None = None
    tests: str | None = None

    @property
    def path(self) -> Path:
        return EXAMPLES / self.binary


NORMAL = (
    Example("c-subscriber", "kv-events-subscriber", "c/build/kv-subscriber"),
    Example("c-publisher", "kv-events-publisher", "c/build/kv-publisher"),
    Example("rust-subscriber", "kv-events-subscriber", "rust/target/release/kv-subscriber"),
)
BROKEN = (
    Example("c-subscriber-broken-dedup", "kv-events-subscriber",
            "c/build/kv-subscriber-broken-dedup", "EVS-1", "test_every_batch_once_in_order"),
    Example("c-publisher-broken-replay", "kv-events-publisher",
            "c/build/kv-publisher-broken-replay", "EVT-4",
            "test_replay_from_start_then_end_marker or test_replay_older_than_retention"),
    Example("rust-subscriber-broken-end-marker", "kv-events-subscriber",
            "rust/target/broken/kv-subscriber", "EVS-2",
            "test_end_marker_is_signed_minus_one"),
)


def _built(example: Example) -> Path:
    if not example.path.is_file():
        pytest.skip(f"{example.name}: {example.path.relative_to(EXAMPLES.parents[1])} is not "
                    "built; run examples/drivers/build.sh (it installs Debian's libzmq3-dev, "
                    "libmsgpack-dev, librust-zmq-dev and librust-rmp-serde-dev)")
    return example.path


def _verdicts(example: Example, tmp_path: Path) -> dict[str, str]:
    """Run the example's contract through ``--driver``; the verdict of every clause."""
    report = tmp_path / "verdicts.json"
    command = [sys.executable, "-m", "conformance.cli", "run", "--contract", example.contract,
               "--driver", shlex.quote(str(_built(example))), "--json", str(report), "-q",
               "--hypothesis-seed", "1", "--reruns", "0", "-n", "0"]
    if example.tests:
        command += ["-k", example.tests]
    elif example.contract == "kv-events-subscriber":
        command.append("--chaos")  # EVS-7, the silent partition, is a clause too
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    data = json.loads(report.read_text()) if report.exists() else {}
    assert data, f"{example.name}: no report\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}"
    assert data["contract"] == example.contract
    verdicts = {cid: entry["verdict"] for cid, entry in data["clauses"].items()}
    verdicts["_output"] = proc.stdout[-3000:]
    return verdicts


@pytest.mark.parametrize("example", NORMAL, ids=lambda e: e.name)
def test_example_passes_its_contract(example: Example, tmp_path: Path) -> None:
    verdicts = _verdicts(example, tmp_path)
    output = verdicts.pop("_output")
    allowed = MAY_SKIP[example.contract]
    gaps = KNOWN_GAPS[example.contract]
    judged = {cid: v for cid, v in verdicts.items() if cid not in gaps}
    wrong = {cid: v for cid, v in judged.items()
             if v != "passed" and not (v == "skipped" and cid in allowed)}
    assert not wrong, f"{example.name}: {wrong}\n{output}"
    assert sum(v == "passed" for v in judged.values()) >= len(judged) - len(allowed), verdicts


@pytest.mark.parametrize("example", BROKEN, ids=lambda e: e.name)
def test_broken_build_fails_its_clause(example: Example, tmp_path: Path) -> None:
    verdicts = _verdicts(example, tmp_path)
    output = verdicts.pop("_output")
    assert example.breaks is not None
    assert verdicts.get(example.breaks) == "failed", (
        f"{example.name}: {example.breaks} is {verdicts.get(example.breaks)!r}, expected "
        f"failed (its defect breaks that clause)\n{output}")


@pytest.mark.parametrize("example", sorted(SOURCES))
def test_example_stays_under_500_lines(example: str) -> None:
    """Issue 20 asks for examples an engineer reads in one sitting: each under 500 lines,
    counted as ``wc -l`` counts them (comments and blank lines included)."""
    lines = sum(len((EXAMPLES / path).read_bytes().splitlines()) for path in SOURCES[example])
    assert lines < MAX_LINES, f"{example}: {lines} lines in {SOURCES[example]}"
