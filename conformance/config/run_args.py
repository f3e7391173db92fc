r"""The options of ``zmq-conformance run`` and the pytest arguments they become.

Both the CLI (``zmq-conformance run``) and self-check (a targeted run per
mutant) translate a run's options with :func:`pytest_args`, so a mutant is
checked with exactly the arguments a user's run would get. Validation errors
are one-line :class:`ConfigError`\ s naming the option.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import os
import random
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from conformance import contracts
from conformance.config import profiles, selection
from conformance.config.loading import ENV_TRANSPORT, contract_spec_from_path
from conformance.contracts import NODE_MODES
from conformance.errors import ConfigError
from conformance.supervision import postmortem

__all__ = [
    "MAX_WORKER_RESTARTS", "PLUGIN_MODULE", "add_run_options",
    "lean_plugins", "output_args", "parse_run", "plugin_autoloaded", "pytest_args",
]

#: The plugin, named for ``-p`` when its entry point is not loaded.
PLUGIN_MODULE: Final = "conformance.plugin"
#: Crashed workers replaced before xdist gives up (it then skips what is left).
MAX_WORKER_RESTARTS: Final = 300


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``zmq-conformance run`` to ``parser``."""
    parser.add_argument("--contract", metavar="NAME", default=None,
                        help=f"the contract to check: {', '.join(contracts.CONTRACTS)} (default "
                             f"{contracts.DEFAULT_CONTRACT})")
    parser.add_argument("--driver", metavar="CMD", default=None,
                        help="a driver command to test instead of MODULE:ATTR, for an "
                             "implementation in any language (docs/drivers.md)")
    parser.add_argument("--transport", metavar="MODULE:ATTR",
                        help=f"factory of the implementation under test, shaped as the contract "
                             f"needs (default: ${ENV_TRANSPORT}, then the pytest ini option "
                             "zmq_transport, then the contract's reference)")
    parser.add_argument("--profile", default=None, choices=None, metavar="NAME",
                        help=f"depth profile: {', '.join(profiles.PROFILES)} "
                             f"(default {profiles.DEFAULT_PROFILE})")
    parser.add_argument("--capability", action="append", default=[], metavar="NAME=VALUE",
                        help="declare a capability of the implementation (repeatable)")
    parser.add_argument("--json", metavar="PATH", help="write per-clause verdicts as JSON")
    parser.add_argument("--junitxml", metavar="PATH", help="write per-clause JUnit XML")
    parser.add_argument("--markdown", metavar="PATH", help="write a Markdown report")
    parser.add_argument("--xfail-file", metavar="PATH",
                        help="expected failures ('CLAUSE-ID: reason' or 'test-id: reason' lines)")
    parser.add_argument("-k", dest="keyword", metavar="EXPR", help="only tests matching EXPR")
    parser.add_argument("-n", dest="numprocesses", metavar="N", default=None,
                        help="run in N worker processes (pytest-xdist; 'auto' for one per CPU; "
                             "default: 2.5 per CPU for p2p, whose tests mostly wait (2 "
                             "through a driver), one per CPU for the others, at least 2 and "
                             "at most 8); 0 runs in one "
                             "process, where a crash or hang ends the run without a report")
    parser.add_argument("--stall-limit", metavar="SECONDS", type=float, default=None,
                        help="a test that starts no call into the implementation for this long is "
                             "hung: its worker is ended and the test reported blocked "
                             f"(default {postmortem.DEFAULT_STALL_LIMIT_S:.0f})")
    parser.add_argument("--hypothesis-seed", metavar="SEED",
                        help="seed for Hypothesis (default: a fresh random seed, reported)")
    parser.add_argument("--reruns", type=int, default=None, metavar="N",
                        help="re-run a failing test up to N times, to report a failure that "
                             "does not always reproduce as 'flaky', and a test voided by a "
                             "measured host stall until it judges (default 4; 0: never)")
    parser.add_argument("--chaos", action="store_true",
                        help="also run the tests under injected faults (fault proxy, paused or "
                             "killed processes): the chaos clauses and each contract's chaos "
                             "suite")
    parser.add_argument("--nodes", choices=NODE_MODES, default=None,
                        help="where nodes run, for the contracts that have nodes (p2p): inprocess "
                             "(default) or process (each node in its own OS process, driven "
                             "through execnet)")
    parser.add_argument("--suite", action="append", default=[], metavar="PATH",
                        help="run PATH instead of the built-in suite (suite development)")
    parser.add_argument("-q", "--quiet", action="store_true", help="less pytest output")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="pytest's own output (session header, one line per test) "
                             "instead of the per-clause progress")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER,
                        help="after '--': extra pytest arguments")


def parse_run(argv: Sequence[str]) -> argparse.Namespace:
    """Parse the options of ``zmq-conformance run`` (``argv`` without ``run``)."""
    parser = argparse.ArgumentParser(prog="zmq-conformance run",
                                     description="Run the suite. Arguments after '--' go to "
                                     "pytest.")
    add_run_options(parser)
    return parser.parse_args(list(argv))


def _usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def pytest_args(
    args: argparse.Namespace,
) -> tuple[list[str], Path, tempfile.TemporaryDirectory[str] | None]:
    """Validate the options and translate them into the plugin's; ConfigError on bad input."""
    out = ["--zmq-conformance-only"]
    contract = contracts.get(args.contract or contracts.DEFAULT_CONTRACT)
    if args.contract is not None:
        out += ["--zmq-contract", contract.name]
    if args.profile is not None:
        if args.profile not in profiles.PROFILES:
            raise ConfigError(
                f"--profile={args.profile!r}: unknown profile; choose one of "
                f"{', '.join(profiles.PROFILES)}"
            )
        out += ["--zmq-profile", args.profile]
    overrides = selection.parse_capabilities([], args.capability,
                                             kind=contract.capability_type())
    for item in args.capability:
        out += ["--zmq-capability", item]
    if args.driver is not None and args.transport is not None:
        raise ConfigError("--driver and --transport both name the implementation under test; "
                          "give one of them")
    if args.driver is not None:
        from conformance.drivers import driver_spec, shutdown

        try:
            driver_spec(contract, args.driver, overrides=overrides, option="--driver")
        finally:
            shutdown()
        out += ["--zmq-driver", args.driver]
    elif args.transport is not None:
        contract_spec_from_path(contract, args.transport, overrides=overrides,
                                option="--transport")
        out += ["--zmq-transport", args.transport]
    elif os.environ.get(ENV_TRANSPORT):
        contract_spec_from_path(contract, os.environ[ENV_TRANSPORT], overrides=overrides,
                                option=ENV_TRANSPORT)
    if args.xfail_file:
        from conformance.reporting import xfail  # pytest's: imported only when asked

        xfail.load(args.xfail_file, option="--xfail-file")
        out += ["--zmq-xfail-file", args.xfail_file]
    for path in args.suite:
        if not Path(path).exists():
            raise ConfigError(f"--suite={path!r}: no such file or directory")
        out += ["--zmq-suite", path]
    workers = (str(contract.default_workers(_usable_cpus(), driver=args.driver is not None))
               if args.numprocesses is None else str(args.numprocesses))
    if workers != "auto" and not workers.isdigit():
        raise ConfigError(f"-n {workers!r}: expected a number of workers or 'auto'")
    if workers != "0":
        if importlib.util.find_spec("xdist") is None:
            raise ConfigError("-n: pytest-xdist is not installed (pip install pytest-xdist)")
        # One test per hand-out: with the long tests collected first
        # (collection.longest_first), no worker queues two of them while
        # another runs short tests and then idles.
        out += ["-n", workers, f"--max-worker-restart={MAX_WORKER_RESTARTS}",
                "--maxschedchunk=1"]
    if args.stall_limit is not None:
        if not args.stall_limit > 0:
            raise ConfigError(f"--stall-limit={args.stall_limit!r}: expected a positive number")
        out += ["--zmq-stall-limit", str(args.stall_limit)]
    seed = args.hypothesis_seed
    if seed is None:
        seed = str(random.SystemRandom().randrange(2**32))
    elif not seed.isdigit():
        raise ConfigError(f"--hypothesis-seed={seed!r}: expected a non-negative integer")
    out.append(f"--hypothesis-seed={seed}")
    if args.reruns is not None:
        if args.reruns < 0:
            raise ConfigError(f"--reruns={args.reruns}: expected a non-negative integer")
        out += ["--zmq-reruns", str(args.reruns)]
    if args.keyword:
        out += ["-k", args.keyword]
    if args.chaos:
        out.append("--zmq-chaos")
    if args.nodes is not None:
        out += ["--zmq-nodes", args.nodes]
    if args.quiet:
        out.append("-q")
    if args.verbose:
        out.append("-v")
    cleanup: tempfile.TemporaryDirectory[str] | None = None
    if args.json:
        json_path = Path(args.json).resolve()
        out += ["--zmq-report-json", str(json_path)]
    else:  # the verdicts still come back, through a file nobody asked to see
        cleanup = tempfile.TemporaryDirectory(prefix="zmq-conformance-")
        json_path = Path(cleanup.name) / "verdicts.json"
        out += ["--zmq-verdicts", str(json_path)]
    if args.junitxml:
        out += ["--zmq-report-junit", str(Path(args.junitxml).resolve())]
    if args.markdown:
        out += ["--zmq-report-markdown", str(Path(args.markdown).resolve())]
    extra = list(args.pytest_args)
    if extra and extra[0] == "--":
        extra = extra[1:]
    if not plugin_autoloaded():
        out = ["-p", PLUGIN_MODULE, *out]
    return out + extra, json_path, cleanup


def output_args(args: argparse.Namespace) -> list[str]:
    """The pytest arguments of the CLI's own output (not self-check's runs).

    Unless ``-v``: no session header, and per-clause progress (a live line on
    a terminal, a line per finished clause in a CI log) in place of pytest's
    letters and percentages.
    """
    if args.verbose:
        return []
    quiet = [] if args.quiet else ["-q"]  # no "test session starts" line
    return [*quiet, "--no-header", "--zmq-progress", "auto",
            "-o", "console_output_style=classic"]


#: The environment variable that stops pytest loading every installed plugin.
_NO_AUTOLOAD = "PYTEST_DISABLE_PLUGIN_AUTOLOAD"


def lean_plugins(args: argparse.Namespace, pytest_args: Sequence[str]) -> list[str] | None:
    """The ``-p`` arguments of a run that loads only the plugins the suite needs, or
    ``None`` when the run must load every installed plugin as pytest would.

    Why: pytest rewrites the assertions of every module of every plugin's
    distribution at each start, and where bytecode is not written
    (``PYTHONDONTWRITEBYTECODE``, common in CI images) it does so again in
    the run's process and in each xdist worker: about 1.5 s of CPU per
    process, most of it Hypothesis' modules. With autoload off
    (``PYTEST_DISABLE_PLUGIN_AUTOLOAD``, set by the caller in the child's
    environment) the suite loads its plugin, xdist and Hypothesis by name.
    Only the clause tests and their conftests are rewritten (pytest rewrites
    test files whatever loads them); the suite's other modules state their
    assertion messages, and rewriting the whole ``conformance`` package again
    cost each process about 0.35 s of CPU (four workers: about 0.9 s of a
    run's wall time on 2 cores).

    ``None`` (every plugin, as usual) when the caller passed pytest
    arguments after ``--`` or ``PYTEST_ADDOPTS``, which may name another
    plugin's options, or already disabled autoload themselves.
    """
    if args.pytest_args or os.environ.get("PYTEST_ADDOPTS") or os.environ.get(_NO_AUTOLOAD):
        return None
    plugins = [PLUGIN_MODULE, "_hypothesis_pytestplugin"]
    if "-n" in pytest_args:
        plugins.append("xdist.plugin")
    if any(importlib.util.find_spec(name.split(".")[0]) is None for name in plugins):
        return None
    out: list[str] = []
    for name in plugins:
        out += ["-p", name]
    return out


#: Where the plugin notes that it refused the configuration itself (a preflight
#: mismatch, a bad option value): a lean run's usage error that is the suite's own is
#: final, not a reason to run again with every plugin.
OWN_USAGE_ERROR_ENV: Final = "ZMQ_CONFORMANCE_OWN_USAGE_ERROR"


def lean_env(own_usage_error: Path) -> dict[str, str]:
    """This process's environment with plugin autoload off (see :func:`lean_plugins`), and
    ``own_usage_error`` as the file the plugin writes when it refuses the configuration."""
    return {**os.environ, _NO_AUTOLOAD: "1", OWN_USAGE_ERROR_ENV: os.fspath(own_usage_error)}


def note_own_usage_error(message: str) -> None:
    """The plugin refused the configuration: say so to a CLI waiting on a lean run."""
    path = os.environ.get(OWN_USAGE_ERROR_ENV)
    if path:
        with contextlib.suppress(OSError):
            Path(path).write_text(message)


def plugin_autoloaded() -> bool:
    """True when pytest will load the plugin through its ``pytest11`` entry point."""
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return False
    try:
        points = importlib.metadata.entry_points(group="pytest11")
    except Exception:  # broken metadata: be explicit rather than fail
        return False
    return any(ep.value.split(":")[0] == PLUGIN_MODULE for ep in points)
