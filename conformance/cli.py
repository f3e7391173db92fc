"""``zmq-conformance``: the suite's command-line face.

``zmq-conformance run`` validates its options, then runs pytest (in a child
interpreter, from the current directory, supervised by
:mod:`conformance.supervision.supervisor`) with the plugin
(``--zmq-conformance-only`` and the matching ``--zmq-*`` options), so the
CLI and ``pytest --zmq-conformance`` share one core. The
verdicts come back through the JSON report, which the CLI always asks for
(a temporary file when ``--json`` is not given).

The suite runs in pytest-xdist workers (``-n``, default
:meth:`conformance.contract.Contract.default_workers`) even when one would
do: a worker that hangs beyond the stall limit or dies of a signal is
replaced and its test reported ``blocked`` or ``crashed``, so every clause
still gets its verdict. The
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
import json
import os
import signal
import sys
import tempfile
import textwrap
from collections.abc import Sequence
from pathlib import Path

from conformance import contracts
from conformance.config import run_args
from conformance.errors import ConfigError
from conformance.reporting.reports import read_report
from conformance.reporting.verdicts import exit_status
from conformance.supervision import supervisor

PROG = "zmq-conformance"
#: pytest's exit status for a usage error (``pytest.ExitCode.USAGE_ERROR``).
_USAGE_ERROR = 4
_SELF_CHECK = "self-check"


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

    run = commands.add_parser("run", help="run a contract's suite against an implementation",
                              description="Run the suite. Arguments after '--' go to pytest.")
    run_args.add_run_options(run)

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
        pytest_args, json_path, cleanup = run_args.pytest_args(args)
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    try:
        return _run(run_args.output_args(args) + pytest_args, json_path,
                    lean=run_args.lean_plugins(args, pytest_args))
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


def _run(pytest_args: list[str], json_path: Path, *, lean: list[str] | None = None) -> int:
    """Run pytest in a child interpreter (a clean import state for assertion rewriting
    and the user's transport; :mod:`conformance.supervision.pytest_process`), then
    derive the exit status from the verdicts.

    With ``lean`` (:func:`run_args.lean_plugins`), the child loads only those
    plugins; if it then stops on a usage error that is not the suite's own (the
    caller's ini may name another plugin's options) it runs again with every
    plugin.
    """
    command = [sys.executable, "-m", "conformance.supervision.pytest_process", *pytest_args]
    if lean is not None:
        handle, name = tempfile.mkstemp(prefix="zmq-conformance-", suffix=".usage-error")
        os.close(handle)
        own_error = Path(name)
        own_error.unlink()
        outcome = supervisor.run([*command[:3], *lean, *pytest_args], report=json_path,
                                 env=run_args.lean_env(own_error))
        # The suite's own refusal (a profile mismatch, ...) is final; any other usage
        # error may be an ini option of a plugin the lean run did not load.
        ours = own_error.exists()
        own_error.unlink(missing_ok=True)
        if outcome.returncode == _USAGE_ERROR and outcome.interrupted_by is None and not ours:
            outcome = supervisor.run(command, report=json_path)
    else:
        outcome = supervisor.run(command, report=json_path)
    status = outcome.returncode
    report = read_report(json_path)
    if outcome.interrupted_by is not None:
        name = signal.Signals(outcome.interrupted_by).name
        print(f"{PROG}: interrupted by {name}; stopped the suite", file=sys.stderr)
        return 3
    for warning in report.warnings if report is not None else ():
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    for error in report.run_errors if report is not None else ():
        print(f"{PROG}: run error: {error}", file=sys.stderr)
    code = exit_status(report, status)
    if status == 5:
        print(f"{PROG}: error: no test selected (check -k / --suite)", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
