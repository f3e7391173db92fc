"""How the project's own tests are spread over ``pytest -n auto``.

Most of the time of the slow tests here is spent waiting: on child
processes that run a suite against a mutant, and on the deadlines those
suites prove (a heartbeat window, a replay timeout, a watchdog limit).
Measured on 2 cores with 2 workers, the CPUs were busy 57% of the run. So
``-n auto`` starts one and a half workers per core, and the slowest files
are handed out first, so that no worker is left with a long test while the
others have finished (longest first is the classic rule for packing jobs
onto machines). Children the tests start share one bytecode cache
(:data:`PYCACHE`): with ``PYTHONDONTWRITEBYTECODE`` set, every
pytest child would otherwise compile and assertion-rewrite Hypothesis anew.
"""

from __future__ import annotations

import getpass
import os
import tempfile
from pathlib import Path

import pytest

#: Compiled bytecode of the child processes the project's tests start, shared by all
#: of them (and kept between sessions; Python checks each entry against its source).
#: Each child is a pytest process, often with xdist workers, that imports and
#: assertion-rewrites the same modules (all of Hypothesis: pytest rewrites the
#: modules of every plugin's distribution); without a cache, as when
#: PYTHONDONTWRITEBYTECODE is set, each redoes that: about half a second apiece.
PYCACHE = Path(tempfile.gettempdir()) / f"zmq-conformance-tests-pycache-{getpass.getuser()}"

#: Files whose tests take seconds each (children and deadlines), slowest first.
_SLOW_FILES = (
    "test_kv_subscriber_contract.py",
    "test_selfcheck.py",
    "test_machines_find_defects.py",
    "test_trust.py",
    "test_kv_publisher_contract.py",
    "test_driver_examples.py",
    "test_control_contract.py",
    "test_reruns.py",
    "test_cli.py",
    "test_process_nodes.py",
)


@pytest.hookimpl(optionalhook=True)  # xdist may be absent (-p no:xdist)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: three workers per two cores (at least two workers)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(2, (3 * cores + 1) // 2)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Move the tests of :data:`_SLOW_FILES` to the front, in that order (stable)."""
    rank = {name: index for index, name in enumerate(_SLOW_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_configure(config: pytest.Config) -> None:
    """Every process started from here on (xdist workers, suite children) uses the cache.

    Not in the gate's own run (``zmq-conformance run`` from this checkout, a
    ``--zmq-conformance-only`` session, which loads this file because pytest
    loads the conftests of ``testpaths``): there the cache would only be a
    second, empty copy of the bytecode pip and the checkout already hold, so
    a fresh clone's first main job compiled pytest, Hypothesis, pyzmq and the
    suite anew in every worker (about 3 s of CPU). The suite's children that
    the project's tests start still inherit it from the test session.
    """
    if config.getoption("zmq_conformance_only", default=False):
        return
    os.environ["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
