"""Hypothesis's one-time set-up, done before the first test rather than inside it.

The first text strategy a process draws from makes Hypothesis build its
Unicode tables (the general category of every code point, and which ones
UTF-8 encodes): seconds of CPU (about 2.8 s on a loaded 2-core machine),
which it then caches under the storage directory
(``HYPOTHESIS_STORAGE_DIRECTORY``, default ``.hypothesis``) in
``unicode_data/``; a process that finds the files loads them in a fraction of
a second. Built inside a test, that time is the suite's, yet it runs under
the stall deadline (:mod:`conformance.supervision.postmortem`) and, on a busy
machine, was reported as the implementation's hang (``blocked``).

:func:`warm` builds (or loads) the tables in this process. The plugin calls
it when the session opts in: in the xdist controller first, before any
worker starts, so the workers load the file the controller wrote, then in
each worker before its first test. :func:`build_into` and :func:`seed_tables`
let the self-check build the tables once and hand a copy to each run's own
storage directory, whose example database stays the run's own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Final

__all__ = ["TABLES_DIR", "build_into", "reset_storage", "seed_tables", "warm"]

#: The part of a Hypothesis storage directory that holds the Unicode tables.
TABLES_DIR: Final = "unicode_data"
_STORAGE_ENV: Final = "HYPOTHESIS_STORAGE_DIRECTORY"
#: Building the tables takes seconds; a child that takes this long is stuck.
_BUILD_LIMIT_S: Final = 120.0


def warm() -> None:
    """Build, or load from the storage directory, the Unicode tables the suite's text
    strategies need; later calls in the process cost nothing.

    Validating a strategy is Hypothesis's public way to make it compute what
    it needs: the default ``text()`` alphabet (the UTF-8 codec's table) and a
    category-filtered ``characters()`` (the category table). Hypothesis warns
    about storage access while plugins initialise (it should not slow the
    start of every session); here the time is spent on purpose, once, before
    any test, so that warning is silenced for this call only.
    """
    from hypothesis import strategies as st
    from hypothesis.errors import HypothesisSideeffectWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HypothesisSideeffectWarning)
        st.text().validate()
        st.characters(exclude_categories=["Cs"]).validate()


def build_into(storage: Path) -> None:
    """Build the tables into the storage directory ``storage`` (in a child process:
    Hypothesis reads its storage directory once per process)."""
    env = dict(os.environ)
    env[_STORAGE_ENV] = str(storage)
    subprocess.run([sys.executable, "-c", f"import {__name__} as m; m.warm()"],
                   env=env, check=True, timeout=_BUILD_LIMIT_S,
                   stdout=subprocess.DEVNULL)


def seed_tables(storage: Path, source: Path | None) -> None:
    """Copy the tables of the storage directory ``source`` into ``storage`` (only the
    tables: an example database is never shared). Nothing to copy (``source`` is
    ``None`` or has none): the run builds its own, as Hypothesis always does."""
    if source is None or not (source / TABLES_DIR).is_dir():
        return
    shutil.copytree(source / TABLES_DIR, storage / TABLES_DIR, dirs_exist_ok=True)


def reset_storage(storage: Path) -> None:
    """Empty the storage directory ``storage`` (its example database, above all) but
    keep its Unicode tables, for the next run in the same directory."""
    if not storage.is_dir():
        return
    for entry in storage.iterdir():
        if entry.name == TABLES_DIR:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
