"""``zmq-conformance``: the suite's command-line face.

``zmq-conformance run`` validates its options, then runs pytest (in a child
interpreter, from the current directory, supervised by
:mod:`conformance.supervisor`) with the plugin
(``--zmq-conformance-only`` and the matching ``--zmq-*`` options), so the
CLI and ``pytest --zmq-conformance`` share one core. The
verdicts come back through the JSON report, which the CLI always asks for
(a temporary file when ``--json`` is not given).

The suite runs in pytest-xdist workers (``-n``, default
:data:`DEFAULT_WORKERS`) even when one would do: a worker that hangs beyond
the stall limit or dies of a signal is replaced and its test reported
``blocked`` or ``crashed``, so every clause still gets its verdict. The
number of worker restarts is bounded generously (:data:`MAX_WORKER_RESTARTS`),
enough for a transport that kills its worker in every test.

Exit status:

* 0: every clause passed, failed as expected (xfail file) or was skipped;
* 1: a clause failed, was flaky (failed only in some of its re-runs), was
  blocked (a call or the test hung), crashed (the process running it died) or
  unexpectedly passed;
* 2: usage or configuration error (bad ``--transport``, a ``--driver`` that
  cannot start, exits at start, writes junk or speaks another protocol
  version, unknown profile,
  bad capability, unreadable xfail file, ``-k`` selecting nothing);
* 3: the suite could not run (collection error, internal error, interrupt:
  SIGINT/SIGTERM stop the child and its workers and the reports of what ran
  are still written).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import random
import signal
import sys
import tempfile
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from conformance import contracts, postmortem, profiles, selection, supervisor, xfail
from conformance.clauses import CLAUSES
from conformance.errors import ConfigError
from conformance.process_nodes import NODE_MODES
from conformance.spec import ENV_TRANSPORT, contract_spec_from_path
from conformance.verdicts import ClauseVerdict, RunReport, exit_status

PROG = "zmq-conformance"
_PLUGIN_MODULE = "conformance.plugin"
_SELF_CHECK = "self-check"
#: Workers of a run: two keep a 2-core machine busy, and a crash costs one
#: worker while the other goes on.
DEFAULT_WORKERS: Final = "2"
#: Crashed workers replaced before xdist gives up (it then skips what is left).
MAX_WORKER_RESTARTS: Final = 300


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Conformance suite for the ZeroMQ channels of LLM serving, one contract "
        f"per channel ({', '.join(contracts.CONTRACTS)}).",
        epilog="Exit status: 0 all clauses pass (or xfail/skip), 1 a clause failed, was "
        "flaky, blocked, crashed or xpassed, 2 usage/configuration error, 3 the suite could "
        "not run (or was interrupted).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="run the suite against a transport",
                              description="Run the suite. Arguments after '--' go to pytest.")
    run.add_argument("--contract", metavar="NAME", default=None,
                     help=f"the contract to check: {', '.join(contracts.CONTRACTS)} (default "
                          f"{contracts.DEFAULT_CONTRACT})")
    run.add_argument("--transport", metavar="MODULE:ATTR",
                     help=f"factory of the implementation under test, shaped as the contract "
                          f"needs (default: ${ENV_TRANSPORT}, then the pytest ini option "
                          "zmq_transport, then the contract's reference)")
    run.add_argument("--driver", metavar="CMD", default=None,
                     help="a driver command to test instead of MODULE:ATTR, for an "
                     "implementation in any language (docs/drivers.md)")
    run.add_argument("--profile", default=None, choices=None, metavar="NAME",
                     help=f"depth profile: {', '.join(profiles.PROFILES)} "
                          f"(default {profiles.DEFAULT_PROFILE})")
    run.add_argument("--capability", action="append", default=[], metavar="NAME=VALUE",
                     help="declare a capability of the transport (repeatable)")
    run.add_argument("--json", metavar="PATH", help="write per-clause verdicts as JSON")
    run.add_argument("--junitxml", metavar="PATH", help="write per-clause JUnit XML")
    run.add_argument("--markdown", metavar="PATH", help="write a Markdown report")
    run.add_argument("--xfail-file", metavar="PATH",
                     help="expected failures ('CLAUSE-ID: reason' or 'test-id: reason' lines)")
    run.add_argument("-k", dest="keyword", metavar="EXPR", help="only tests matching EXPR")
    run.add_argument("-n", dest="numprocesses", metavar="N", default=DEFAULT_WORKERS,
                     help="run in N worker processes (pytest-xdist; 'auto' for one per CPU; "
                          f"default {DEFAULT_WORKERS}); 0 runs in one process, where a crash "
                          "or hang ends the run without a report")
    run.add_argument("--stall-limit", metavar="SECONDS", type=float, default=None,
                     help="a test that starts no call into the transport for this long is "
                          "hung: its worker is ended and the test reported blocked "
                          f"(default {postmortem.DEFAULT_STALL_LIMIT_S:.0f})")
    run.add_argument("--hypothesis-seed", metavar="SEED",
                     help="seed for Hypothesis (default: a fresh random seed, reported)")
    run.add_argument("--reruns", type=int, default=None, metavar="N",
                     help="re-run a failing test up to N times, to report a failure that "
                          "does not always reproduce as 'flaky' (default 4; 0: never)")
    run.add_argument("--chaos", action="store_true",
                     help="also run the chaos clauses (heartbeats under injected faults)")
    run.add_argument("--nodes", choices=NODE_MODES, default=None,
                     help="where nodes run: inprocess (default) or process (each node in "
                          "its own OS process, driven through execnet)")
    run.add_argument("--suite", action="append", default=[], metavar="PATH",
                     help="run PATH instead of the built-in suite (suite development)")
    run.add_argument("-q", "--quiet", action="store_true", help="less pytest output")
    run.add_argument("pytest_args", nargs=argparse.REMAINDER,
                     help="after '--': extra pytest arguments")

    lister = commands.add_parser("list", help="list every clause with its requirement, "
                                             "grouped by contract")
    lister.add_argument("--json", action="store_true", help="print the clauses as JSON")
    lister.add_argument("--contract", metavar="NAME", default=None,
                        help="only this contract's clauses")
    commands.add_parser(
        _SELF_CHECK, add_help=False,
        help="run the suite against the mutant catalog (see 'self-check --help')",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:
        # The reader went away (``zmq-conformance list | head``): not an error
        # worth a traceback. Point stdout at /dev/null so the interpreter's
        # final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def _main(argv: list[str]) -> int:
    if argv[:1] == [_SELF_CHECK]:
        from conformance.selfcheck.runner import main as self_check

        return self_check(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "list":
        try:
            chosen = [contracts.get(args.contract)] if args.contract else None
        except ConfigError as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 2
        return _list(as_json=args.json, chosen=chosen)
    try:
        pytest_args, json_path, cleanup = _pytest_args(args)
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    try:
        return _run(pytest_args, json_path)
    finally:
        if cleanup is not None:
            cleanup.cleanup()


def _list(*, as_json: bool, chosen: Sequence[contracts.Contract] | None = None) -> int:
    """Print the clauses, contract by contract (JSON: flat by ID, each naming its contract)."""
    shown = list(chosen or contracts.CONTRACTS.values())
    if as_json:
        data = {
            cid: {"title": c.title, "requirement": c.requirement, "chaos": c.chaos,
                  "contract": contract.name}
            for contract in shown
            for cid, c in contract.clauses.items()
        }
        print(json.dumps(data, indent=2))
        return 0
    for index, contract in enumerate(shown):
        if index:
            print()
        print(f"== {contract.name}: {contract.title}")
        print(f"   reference {contract.default_factory}; factory {contract.factory_shape}")
        for clause in contract.clauses.values():
            marker = "  [chaos]" if clause.chaos else ""
            print(f"{clause.id:7} {clause.title}{marker}")
            for line in textwrap.wrap(clause.requirement, width=88):
                print(f"        {line}")
    return 0


def _pytest_args(
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
        xfail.load(args.xfail_file, option="--xfail-file")
        out += ["--zmq-xfail-file", args.xfail_file]
    for path in args.suite:
        if not Path(path).exists():
            raise ConfigError(f"--suite={path!r}: no such file or directory")
        out += ["--zmq-suite", path]
    workers = str(args.numprocesses)
    if workers != "auto" and not workers.isdigit():
        raise ConfigError(f"-n {workers!r}: expected a number of workers or 'auto'")
    if workers != "0":
        if importlib.util.find_spec("xdist") is None:
            raise ConfigError("-n: pytest-xdist is not installed (pip install pytest-xdist)")
        out += ["-n", workers, f"--max-worker-restart={MAX_WORKER_RESTARTS}"]
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
    cleanup: tempfile.TemporaryDirectory[str] | None = None
    if args.json:
        json_path = Path(args.json).resolve()
    else:
        cleanup = tempfile.TemporaryDirectory(prefix="zmq-conformance-")
        json_path = Path(cleanup.name) / "verdicts.json"
    out += ["--zmq-report-json", str(json_path)]
    if args.junitxml:
        out += ["--zmq-report-junit", str(Path(args.junitxml).resolve())]
    if args.markdown:
        out += ["--zmq-report-markdown", str(Path(args.markdown).resolve())]
    extra = list(args.pytest_args)
    if extra and extra[0] == "--":
        extra = extra[1:]
    if not _plugin_autoloaded():
        out = ["-p", _PLUGIN_MODULE, *out]
    return out + extra, json_path, cleanup


def _plugin_autoloaded() -> bool:
    """True when pytest will load the plugin through its ``pytest11`` entry point."""
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return False
    try:
        points = importlib.metadata.entry_points(group="pytest11")
    except Exception:  # broken metadata: be explicit rather than fail
        return False
    return any(ep.value.split(":")[0] == _PLUGIN_MODULE for ep in points)


def _run(pytest_args: list[str], json_path: Path) -> int:
    """Run pytest in a child interpreter (a clean import state for assertion rewriting
    and the user's transport), then derive the exit status from the verdicts."""
    command = [sys.executable, "-m", "pytest", *pytest_args]
    outcome = supervisor.run(command, report=json_path)
    status = outcome.returncode
    report = _read_report(json_path)
    if outcome.interrupted_by is not None:
        name = signal.Signals(outcome.interrupted_by).name
        print(f"{PROG}: interrupted by {name}; stopped the suite", file=sys.stderr)
        return 3
    for warning in report.warnings if report is not None else ():
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    code = exit_status(report, status)
    if status == 5:
        print(f"{PROG}: error: no test selected (check -k / --suite)", file=sys.stderr)
    return code


def _read_report(path: Path) -> RunReport | None:
    """The verdicts the plugin wrote, reduced to what the exit status needs."""
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    verdicts = {
        cid: ClauseVerdict(CLAUSES[cid], str(entry.get("verdict", "skipped")))
        for cid, entry in data.get("clauses", {}).items()
        if cid in CLAUSES
    }
    return RunReport(
        transport=str(data.get("transport")), profile=str(data.get("profile")),
        seed=data.get("seed"), clauses=verdicts,
        warnings=[str(w) for w in data.get("warnings", [])],
        contract=str(data.get("contract", contracts.DEFAULT_CONTRACT)),
    )


if __name__ == "__main__":
    sys.exit(main())
