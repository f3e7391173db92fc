"""Hypothesis's one-time set-up, done before the first test rather than inside it.

The first text strategy a process draws from makes Hypothesis build a
Unicode table, which it then caches under the storage directory
(``HYPOTHESIS_STORAGE_DIRECTORY``, default ``.hypothesis``) in
``unicode_data/``; a process that finds the file loads it in a fraction of a
second. Built inside a test, that time is the suite's, yet it runs under the
stall deadline (:mod:`conformance.supervision.postmortem`) and, on a busy
machine, was reported as the implementation's hang (``blocked``).

The suite's strings need only the table of general categories (0.24 s of
CPU to build on 2 cores): they are drawn by category
(:func:`conformance.testing.values.text`), never from Hypothesis's default
alphabet, whose UTF-8 codec table took 3.2 s and was, in a fresh checkout,
the longest single step of a run's start.

:func:`warm` builds the table unless the storage directory has it. The
plugin calls it when the session opts in: in the xdist controller first,
before any worker starts, so the workers (whose own call finds the file)
only load what the controller wrote. :func:`build_into` and :func:`seed_tables`
let the self-check build the table once and hand a copy to each run's own
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
#: The table's file (Hypothesis 6's name) under ``unicode_data/<unicode version>/``:
#: the general category of every code point. The suite's strings are named by
#: category (:func:`conformance.testing.values.text`), so no codec table is needed.
_TABLE_FILES: Final = ("charmap.json.gz",)
#: Building the tables takes seconds; a child that takes this long is stuck.
_BUILD_LIMIT_S: Final = 120.0


def warm() -> None:
    """Make sure the storage directory holds the Unicode table the suite's text
    strategies need, building it if it does not (0.24 s of CPU); cheap when it
    does (one file looked up: the process loads it at its first text draw).

    Validating a strategy is Hypothesis's public way to make it compute what
    it needs: the suite's own string strategy
    (:func:`conformance.testing.values.text`, drawn by category, so the
    category table; the suite never uses Hypothesis's default ``text()``
    alphabet, whose UTF-8 codec table took 3.2 s to build). Hypothesis warns
    about storage access while plugins initialise (it should not slow the
    start of every session); here the time is spent on purpose, once, before
    any test, so that warning is silenced for this call only. Should a
    Hypothesis release name its files otherwise, every call validates (about
    0.25 s with the files present): slower, never wrong.
    """
    from hypothesis.errors import HypothesisSideeffectWarning
    from hypothesis.internal import charmap

    from conformance.testing import values

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HypothesisSideeffectWarning)
        where = charmap.charmap_file().parent
        if all((where / name).is_file() for name in _TABLE_FILES):
            return
        values.text().validate()


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
