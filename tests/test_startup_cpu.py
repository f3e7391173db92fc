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
