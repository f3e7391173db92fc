"""Start-up CPU of the main job (docs/gate-time.md, "CPU"): what each process pays once.

The CLI only parses arguments and supervises its pytest child, so it must not
import pytest or Hypothesis (about 0.5 s of CPU); the xdist controller builds
Hypothesis' Unicode table before the workers start, so a fresh checkout
computes it once, not once per worker.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import configuration
from hypothesis.internal import charmap

from conformance.config import profiles


def test_the_cli_imports_neither_pytest_nor_hypothesis() -> None:
    code = ("import sys, conformance.cli; "
            "print(sorted(m for m in ('pytest', 'hypothesis') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


@pytest.fixture
def fresh_storage(tmp_path: Path) -> Iterator[Path]:
    before = configuration.storage_directory()
    configuration.set_hypothesis_home_dir(str(tmp_path))
    profiles._unicode_tables_warm = False
    try:
        yield tmp_path
    finally:
        configuration.set_hypothesis_home_dir(str(before))
        profiles._unicode_tables_warm = False


def test_the_unicode_table_is_built_once_where_hypothesis_reads_it(fresh_storage: Path) -> None:
    table = charmap.charmap_file("codec-v2-utf-8")
    assert fresh_storage in table.parents and not table.exists()
    profiles.warm_unicode_tables()
    assert table.exists()
    stamp = table.stat().st_mtime_ns
    profiles._unicode_tables_warm = False
    profiles.warm_unicode_tables()  # present: not built again
    assert table.stat().st_mtime_ns == stamp
