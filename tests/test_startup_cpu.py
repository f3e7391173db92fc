"""Start-up CPU of the main job (docs/gate-time.md, "CPU"): what each process pays once.

The CLI only parses arguments and supervises its pytest child, so it must not
import pytest or Hypothesis (about 0.5 s of CPU); the xdist controller builds
Hypothesis' Unicode table before the workers start, so a fresh checkout
computes it once, not once per worker.
"""

from __future__ import annotations

import subprocess
import sys


def test_the_cli_imports_neither_pytest_nor_hypothesis() -> None:
    code = ("import sys, conformance.cli; "
            "print(sorted(m for m in ('pytest', 'hypothesis') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_the_python_driver_imports_none_of_the_bridge() -> None:
    """The suite starts a driver process for every node, so the Python driver's start is
    paid many times a run: it loads the protocol, its contract's service and the
    implementation, never the suite's side of the bridge (subprocesses, the watchdog,
    the proxies) nor pytest or Hypothesis (docs/drivers.md, section 11)."""
    from conformance import contracts

    banned = ("pytest", "hypothesis", "subprocess", "conformance.drivers.process",
              "conformance.drivers.remote", "conformance.supervision.watchdog")
    for contract in contracts.CONTRACTS.values():
        code = ("import sys; import conformance.drivers.python as d; "
                f"d._service({contract.name!r}, d._load({contract.default_factory!r})); "
                f"print(sorted(m for m in {banned!r} if m in sys.modules))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True).stdout
        assert out.strip() == "[]", f"{contract.name}: the Python driver imported {out.strip()}"
