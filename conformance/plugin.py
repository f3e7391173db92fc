"""pytest plugin: the suite's face inside pytest (auto-loaded via ``pytest11``).

The hooks here are thin: they read options, call the plain modules
(:mod:`conformance.config.selection`, :mod:`conformance.reporting.xfail`,
:mod:`conformance.reporting.verdicts`, :mod:`conformance.reporting.reports`) and carry data
between pytest's phases. The CLI runs pytest with this plugin, so both faces
share one core.

Opt-in: the suite runs only when the session asks for it, with
``--zmq-conformance`` (suite in addition to the session's own tests),
``--zmq-conformance-only`` (the suite alone), ``--zmq-transport`` on the
command line (implies ``--zmq-conformance``), or the ini option
``zmq_conformance = true``. ``--zmq-contract NAME`` (ini ``zmq_contract``)
picks the contract (:mod:`conformance.contracts`; default ``p2p``) and with
it the suite. The plugin then appends the suite's directory
to the collection arguments, unless the arguments already cover it, so the
suite never runs twice. ``--zmq-chaos`` adds the contract's chaos suite
(``conformance.contracts.p2p.chaos_suite`` for ``p2p``) and
registers the ``chaos.fixtures`` plugin (the ``toxiproxy`` fixture).

Data crosses from the process running a test (an xdist worker, or the same
process) to the one writing reports through ``report.user_properties``:
``zmq_clauses``, ``zmq_k`` (a ``-k`` expression for replay), ``zmq_chaos``,
``zmq_xfail`` (set at collection), ``zmq_transport`` (set by the fixture when
a user override is in use), ``zmq_blocked``, ``zmq_xpassed`` and
``zmq_counterexample`` (set when the report is made), ``zmq_reruns`` and
``zmq_rerun_s`` (the re-run tally, set before the reports are logged),
``zmq_crashed`` (set by the controller on the report xdist makes for a test
whose worker died).

A failing clause test is re-run (``--zmq-reruns N``, see
:mod:`conformance.supervision.reruns`) inside the process that ran it, before its
reports are logged, so under xdist the tally travels with the reports.

Hangs and crashes the watchdog cannot turn into a verdict are handled by
:mod:`conformance.supervision.postmortem`: every process running suite tests keeps a
sentinel (stall deadline, fatal-signal traces, a journal of the test in
progress) in a directory the xdist controller hands its workers; when a
worker dies, the controller reads what it left and reports the test
``blocked`` or ``crashed``. Workers also end when their parent dies
(:mod:`conformance.supervision.lifeline`).
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import shutil
import tempfile
import warnings
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conformance import contracts
from conformance.config import profiles, selection
from conformance.config.fixtures import zmq_transport_factory, zmq_transport_spec
from conformance.contracts import CLAUSES
from conformance.errors import ConfigError
from conformance.reporting import xfail
from conformance.reporting.reports import write_reports
from conformance.reporting.verdicts import (
    CHAOS_REASON,
    FAILING,
    NO_TEST_REASON,
    ReplayContext,
    RunReport,
    TestResult,
    aggregate,
    blamed_clauses,
    counterexample,
    find_blocked,
    phase_outcome,
)
from conformance.supervision import cleanup, lifeline, postmortem, reruns, watchdog

__all__ = ["ZmqConformanceWarning", "zmq_transport_factory", "zmq_transport_spec"]


class ZmqConformanceWarning(pytest.PytestWarning):
    """A configuration smell that does not stop the run (e.g. an unmatched xfail entry)."""


@dataclass
class _State:
    """Per-session state of the plugin (in ``config.stash``)."""

    opted_in: bool = False
    only: bool = False
    rerun_count: int = reruns.DEFAULT_RERUNS
    chaos: bool = False
    profile: str = profiles.DEFAULT_PROFILE
    contract: str = contracts.DEFAULT_CONTRACT
    transport: str | None = None
    suite_dirs: list[Path] = field(default_factory=list)
    xfail_entries: list[xfail.XfailEntry] = field(default_factory=list)
    xfail_origin: str = ""
    results: dict[str, TestResult] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    fixture_transport: str | None = None
    report: RunReport | None = None
    written: list[Path] = field(default_factory=list)
    stall_limit: float = postmortem.DEFAULT_STALL_LIMIT_S
    #: Where workers leave their journals and traces (created by the process
    #: that owns it: the controller, or a run without xdist).
    postmortem_dir: Path | None = None
    owns_postmortem_dir: bool = False
    sentinel: postmortem.Sentinel | None = None


_STATE = pytest.StashKey[_State]()
_CLAUSES = pytest.StashKey[tuple[str, ...]]()
_XFAIL = pytest.StashKey[str]()
_RECORDER = "zmq-conformance-recorder"
_WORKER_DIR_KEY = "zmq_postmortem_dir"
_WORKER_STALL_KEY = "zmq_stall_limit"
#: After its session finished, a worker gets this long to exit (finalizers of
#: a misbehaving transport run at exit) before it is ended.
_EXIT_GRACE_S = 10.0


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("zmq-conformance", "ZeroMQ transport conformance suite")
    group.addoption("--zmq-conformance", action="store_true", default=False,
                    help="also collect and run the conformance suite in this session")
    group.addoption("--zmq-conformance-only", action="store_true", default=False,
                    help="run only the conformance suite (other collection arguments are "
                         "dropped unless they point into the suite)")
    group.addoption("--zmq-contract", metavar="NAME", default=None,
                    help=f"the contract to check: {', '.join(contracts.CONTRACTS)} (default: "
                         f"ini zmq_contract or {contracts.DEFAULT_CONTRACT})")
    group.addoption("--zmq-transport", metavar="MODULE:ATTR", default=None,
                    help="factory of the implementation under test, shaped as the contract "
                         "needs (implies --zmq-conformance); default: ini zmq_transport, "
                         "$ZMQ_CONFORMANCE_TRANSPORT, the contract's reference")
    group.addoption("--zmq-capability", metavar="NAME=VALUE", action="append", default=[],
                    help="declare a capability of the transport (repeatable), e.g. "
                         "heartbeat_ivl_ms=1000")
    group.addoption("--zmq-profile", metavar="NAME", default=None,
                    help=f"depth profile: {', '.join(profiles.PROFILES)} (default: ini "
                         f"zmq_profile or {profiles.DEFAULT_PROFILE})")
    group.addoption("--zmq-xfail-file", metavar="PATH", default=None,
                    help="expected failures: lines 'CLAUSE-ID: reason' or 'test-id: reason'")
    group.addoption("--zmq-chaos", action="store_true", default=False,
                    help="also run the chaos clauses (fault injection through toxiproxy)")
    group.addoption("--zmq-nodes", metavar="MODE", default=None, choices=contracts.NODE_MODES,
                    help="where nodes run: inprocess (default) or process (each node in its "
                         "own OS process, driven through execnet; needed by PROC-1..3 only)")
    group.addoption("--zmq-suite", metavar="PATH", action="append", default=[],
                    help="collect PATH as the suite instead of the built-in one (advanced: "
                         "suite development, vendored copies)")
    group.addoption("--zmq-stall-limit", metavar="SECONDS", type=float, default=None,
                    help="a suite test that starts no call into the transport for this long "
                         "is hung: its process is ended and the test reported blocked "
                         f"(default {postmortem.DEFAULT_STALL_LIMIT_S:.0f})")
    group.addoption("--zmq-reruns", metavar="N", type=_reruns_count, default=None,
                    help="re-run a failing clause test up to N times to tell a flaky "
                         f"failure from a reproducible one (default {reruns.DEFAULT_RERUNS}; "
                         "0: never)")
    group.addoption("--zmq-report-json", metavar="PATH", default=None,
                    help="write per-clause verdicts as JSON")
    group.addoption("--zmq-report-junit", metavar="PATH", default=None,
                    help="write per-clause verdicts as JUnit XML (one testcase per clause)")
    group.addoption("--zmq-report-markdown", metavar="PATH", default=None,
                    help="write per-clause verdicts as a Markdown report")
    parser.addini("zmq_conformance", "run the conformance suite in every session",
                  type="bool", default=False)
    parser.addini("zmq_contract", "the contract to check (default p2p)", default="")
    parser.addini("zmq_transport", "MODULE:ATTR of the implementation under test", default="")
    parser.addini("zmq_capabilities", "capabilities of the transport, one NAME=VALUE per line",
                  type="linelist", default=[])
    parser.addini("zmq_profile", "depth profile of the suite (ci, dev, thorough)", default="")
    parser.addini("zmq_xfail_file", "expected-failure file (relative to the ini file)",
                  default="")


def _reruns_count(text: str) -> int:
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(
            f"--zmq-reruns={text!r}: expected a non-negative integer"
        )
    return int(text)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "clause(*ids): the contract clauses (DESIGN.md IDs) this test checks"
    )
    config.addinivalue_line(
        "markers", "chaos: needs fault injection; runs only with --zmq-chaos / --chaos"
    )
    try:
        state = _configure(config)
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[_STATE] = state
    config.pluginmanager.register(_Recorder(config, state), _RECORDER)
    if state.opted_in:
        _start_postmortem(config, state)


def pytest_unconfigure(config: pytest.Config) -> None:
    cleanup.session_ended()
    recorder = config.pluginmanager.get_plugin(_RECORDER)
    if recorder is not None:
        config.pluginmanager.unregister(recorder)
    state = config.stash.get(_STATE, None)
    if state is not None and state.owns_postmortem_dir and state.postmortem_dir is not None:
        watchdog.set_progress_hook(None)
        shutil.rmtree(state.postmortem_dir, ignore_errors=True)


def _start_postmortem(config: pytest.Config, state: _State) -> None:
    """Set up the sentinel (process running tests) or the directory (xdist controller)."""
    limit = config.getoption("zmq_stall_limit")
    worker = getattr(config, "workerinput", None)
    if worker is not None:
        lifeline.bind_to_parent()
        state.stall_limit = float(worker.get(_WORKER_STALL_KEY, state.stall_limit))
        directory = worker.get(_WORKER_DIR_KEY)
        if directory is None:
            return
        state.postmortem_dir = Path(directory)
        state.sentinel = postmortem.Sentinel(
            state.postmortem_dir, str(worker["workerid"]), state.stall_limit
        )
        watchdog.set_progress_hook(state.sentinel.progress)
        return
    if limit is not None:
        if not limit > 0:
            raise pytest.UsageError(f"--zmq-stall-limit={limit!r}: expected a positive number")
        state.stall_limit = float(limit)
    state.postmortem_dir = Path(tempfile.mkdtemp(prefix="zmq-conformance-postmortem-"))
    state.owns_postmortem_dir = True
    if config.getoption("dist", "no") == "no":
        # No workers: this process runs the tests. A hang still ends the run
        # (with the stacks on stderr), though no report can be written then.
        state.sentinel = postmortem.Sentinel(state.postmortem_dir, "main", state.stall_limit)
        watchdog.set_progress_hook(state.sentinel.progress)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: hand each worker the postmortem directory and the stall limit."""
    state = node.config.stash.get(_STATE, None)
    if state is not None and state.postmortem_dir is not None:
        node.workerinput[_WORKER_DIR_KEY] = str(state.postmortem_dir)
        node.workerinput[_WORKER_STALL_KEY] = state.stall_limit


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[
    None, object, object
]:
    """Around each suite test: whole watchdog limits, capped shrinking once a call
    blocked, and (where a sentinel runs) the journal, the stall deadline and
    the release of what the test's transports left open."""
    state = item.config.stash.get(_STATE, None)
    clauses = item.stash.get(_CLAUSES, None)
    watchdog.new_test()  # every test: a call that blocked in one never shortens the next's
    if clauses is None:
        return (yield)
    watchdog.set_block_hook(_cap_shrinking)
    try:
        return (yield from _supervised(item, clauses, state))
    finally:
        watchdog.set_block_hook(None)
        _restore_shrinking()


def _supervised(
    item: pytest.Item, clauses: tuple[str, ...], state: _State | None
) -> Generator[None, object, object]:
    sentinel = state.sentinel if state is not None else None
    if sentinel is None:
        return (yield)
    props = {str(k): str(v) for k, v in item.user_properties}
    sentinel.begin(item.nodeid, clauses, props)
    try:
        return (yield)
    finally:
        # What the test's implementations left open goes before the next test
        # starts (the test has measured it): the families' cleanups.
        cleanup.test_ended()
        sentinel.end()


#: Hypothesis's shrinking budget for a test whose call blocked: every shrink
#: step re-runs an example that blocks again, and the verdict does not change.
_BLOCKED_SHRINK_S = 20
_saved_shrink_s: list[int] = []


def _cap_shrinking() -> None:
    """A call blocked: cap Hypothesis's shrinking of this test (a private constant)."""
    from hypothesis.internal.conjecture import engine

    current = getattr(engine, "MAX_SHRINKING_SECONDS", None)
    if isinstance(current, int) and not _saved_shrink_s:
        _saved_shrink_s.append(current)
        engine.MAX_SHRINKING_SECONDS = min(current, _BLOCKED_SHRINK_S)


def _restore_shrinking() -> None:
    if _saved_shrink_s:
        from hypothesis.internal.conjecture import engine

        engine.MAX_SHRINKING_SECONDS = _saved_shrink_s.pop()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Bound the teardown of a worker that ran suite tests: its reports are out.

    Not in a run without workers: what follows there (the terminal summary,
    other plugins' reports) is not ours to cut short.
    """
    state = session.config.stash.get(_STATE, None)
    if state is not None and state.sentinel is not None:
        watchdog.set_progress_hook(None)
        if hasattr(session.config, "workerinput"):
            state.sentinel.finish(_EXIT_GRACE_S)
        else:
            state.sentinel.end()


def _configure(config: pytest.Config) -> _State:
    """Activate the profile, decide the opt-in, validate the transport, extend the args."""
    state = _State()
    profile = config.getoption("zmq_profile") or str(config.getini("zmq_profile") or "")
    state.profile = profiles.activate(profile.strip() or profiles.DEFAULT_PROFILE).name
    state.only = bool(config.getoption("zmq_conformance_only"))
    state.opted_in = state.only or bool(
        config.getoption("zmq_conformance")
        or config.getoption("zmq_transport")
        or config.getini("zmq_conformance")
    )
    state.chaos = bool(config.getoption("zmq_chaos"))
    state.contract = selection.configured_contract(config).name
    count = config.getoption("zmq_reruns")
    state.rerun_count = reruns.DEFAULT_RERUNS if count is None else count
    state.xfail_entries, state.xfail_origin = _load_xfail(config)
    if state.opted_in:
        spec = selection.spec_from_config(config)
        state.transport = spec.name
        explicit = config.getoption("zmq_suite") or []
        state.suite_dirs = selection.suite_paths(
            chaos=state.chaos, explicit=explicit, base=config.invocation_params.dir,
            contract=state.contract,
        )
        if not state.suite_dirs:
            raise ConfigError(
                f"--zmq-conformance: the suite of contract {state.contract!r} is missing"
            )
        if state.chaos:
            _load_plugin(config, selection.CHAOS_FIXTURES, "--zmq-chaos")
        _extend_args(config, state)
    return state


def _load_plugin(config: pytest.Config, module: str, option: str) -> None:
    try:
        config.pluginmanager.import_plugin(module)
    except Exception as exc:  # missing extras, broken install: one line naming the option
        raise ConfigError(
            f"{option}: cannot load {module} ({type(exc).__name__}: {exc}); "
            "install the chaos extras: pip install 'zmq-conformance[chaos]'"
        ) from None


def _load_xfail(config: pytest.Config) -> tuple[list[xfail.XfailEntry], str]:
    path: str | None = config.getoption("zmq_xfail_file")
    option = "--zmq-xfail-file"
    if not path:
        ini_value = str(config.getini("zmq_xfail_file") or "").strip()
        if not ini_value:
            return [], ""
        base = config.inipath.parent if config.inipath else config.rootpath
        path, option = str(base / ini_value), "ini zmq_xfail_file"
    return xfail.load(path, option=option), path


def _extend_args(config: pytest.Config, state: _State) -> None:
    """Point the collection at the suite (see the module docstring for the rules)."""
    invocation = config.invocation_params.dir
    explicit = config.args_source == pytest.Config.ArgsSource.ARGS
    args = list(config.args)
    inside = [a for a in args if _arg_inside(invocation, a, state.suite_dirs)]
    if state.only:
        config.args[:] = inside if (explicit and inside) else _suite_args(state.suite_dirs)
        return
    if inside or any(_arg_covers(invocation, a, state.suite_dirs) for a in args):
        return
    config.args.extend(_suite_args(state.suite_dirs))


def _arg_path(invocation: Path, arg: str) -> Path:
    return (invocation / arg.split("::", 1)[0]).resolve()


def _arg_inside(invocation: Path, arg: str, dirs: Sequence[Path]) -> bool:
    path = _arg_path(invocation, arg)
    return any(path == d or path.is_relative_to(d) for d in dirs)


def _arg_covers(invocation: Path, arg: str, dirs: Sequence[Path]) -> bool:
    """True when pytest's own recursion from ``arg`` would reach a suite directory.

    Recursion stops at hidden directories, virtualenvs and ``site-packages``,
    so an installed suite is never "covered" by a project's ``.``.
    """
    path = _arg_path(invocation, arg)
    for suite_dir in dirs:
        if not suite_dir.is_relative_to(path) or suite_dir == path:
            continue
        between = suite_dir.relative_to(path).parts
        probe = path
        blocked = False
        for part in between:
            probe = probe / part
            if part.startswith(".") or part == "site-packages" or (probe / "pyvenv.cfg").exists():
                blocked = True
                break
        if not blocked:
            return True
    return False


def _suite_args(dirs: Sequence[Path]) -> list[str]:
    """The collection arguments for the suite: its directories.

    Directories, not files: pytest names tests outside the rootdir relative
    to the argument, so files would lose their module in the node ID.
    """
    return [str(d) for d in dirs]


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    """Collect the suite's ``test_*.py`` even where the user's ``python_files`` would not."""
    state = parent.config.stash.get(_STATE, None)
    if state is None or not state.suite_dirs or file_path.suffix != ".py":
        return None
    if not file_path.name.startswith("test_") or parent.session.isinitpath(file_path):
        return None
    if not any(file_path.is_relative_to(d) for d in state.suite_dirs if d.is_dir()):
        return None
    patterns = [str(p) for p in parent.config.getini("python_files")]
    if any(fnmatch.fnmatch(file_path.name, p) for p in patterns):
        return None  # pytest's own Python collector takes it
    return pytest.Module.from_parent(parent, path=file_path)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Tag clause tests, apply the xfail file, hold back chaos tests without ``--zmq-chaos``.

    Chaos tests inside the suite's directories are deselected unless
    ``--zmq-chaos`` is given or their file was named on the command line.

    Runs first, so the xfail file matches every collected test before ``-k``
    or ``-m`` deselect some.
    """
    state = config.stash.get(_STATE, None)
    if state is None:
        return
    tagged: list[tuple[pytest.Item, tuple[str, ...]]] = []
    for item in items:
        ids = _clause_ids(item)
        if ids is None:
            continue
        item.stash[_CLAUSES] = ids
        chaos = item.get_closest_marker("chaos") is not None or all(
            CLAUSES[c].chaos for c in ids
        )
        item.extra_keyword_matches.update(ids)  # so that -k HB-1 or -k CONN selects
        item.user_properties.append(("zmq_clauses", " ".join(ids)))
        item.user_properties.append(("zmq_k", _k_expr(item)))
        if chaos:
            item.user_properties.append(("zmq_chaos", "1"))
        tagged.append((item, ids))
    _apply_xfail(config, state, tagged)
    suite_dirs = state.suite_dirs or _builtin_suite_dirs(state.contract)
    if not state.chaos and suite_dirs:
        held = [
            item for item, _ in tagged
            if ("zmq_chaos", "1") in item.user_properties
            and any(item.path.is_relative_to(d) or item.path == d for d in suite_dirs)
            and not session.isinitpath(item.path)
        ]
        if held:
            held_ids = {id(i) for i in held}
            items[:] = [i for i in items if id(i) not in held_ids]
            config.hook.pytest_deselected(items=held)


def _builtin_suite_dirs(contract: str) -> list[Path]:
    try:
        return selection.suite_paths(chaos=False, contract=contract)
    except ConfigError:
        return []


def _clause_ids(item: pytest.Item) -> tuple[str, ...] | None:
    ids: list[str] = []
    for marker in item.iter_markers("clause"):
        for value in marker.args:
            if not isinstance(value, str) or value not in CLAUSES:
                raise pytest.UsageError(
                    f"{item.nodeid}: @pytest.mark.clause({value!r}) names no known clause; "
                    f"known: {', '.join(CLAUSES)}"
                )
            if value not in ids:
                ids.append(value)
    return tuple(ids) if ids else None


def _k_expr(item: pytest.Item) -> str:
    parts = [item.path.stem]
    cls = getattr(item, "cls", None)
    if cls is not None:
        parts.append(cls.__name__)
    parts.append(getattr(item, "originalname", None) or item.name)
    return " and ".join(dict.fromkeys(parts))


def _apply_xfail(
    config: pytest.Config, state: _State, tagged: Sequence[tuple[pytest.Item, tuple[str, ...]]]
) -> None:
    if not state.xfail_entries:
        return
    reasons, unmatched = xfail.match(
        state.xfail_entries, [(item.nodeid, ids) for item, ids in tagged]
    )
    for item, _ in tagged:
        reason = reasons.get(item.nodeid)
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
            item.stash[_XFAIL] = reason
            item.user_properties.append(("zmq_xfail", reason))
    messages: list[str] = []
    for entry in unmatched:
        what = "unknown clause" if xfail.unknown_clauses([entry]) else "no test"
        messages.append(
            f"{entry.describe(state.xfail_origin)} matches {what}; remove or fix the entry"
        )
    state.warnings = messages
    worker = getattr(config, "workerinput", None)
    if worker is not None:
        # xdist: the controller collects nothing; it learns these at pytest_testnodedown.
        config.workeroutput["zmq_conformance_warnings"] = messages  # type: ignore[attr-defined]
        if worker.get("workerid") != "gw0":
            return  # one warning per run, not one per worker
    for entry, message in zip(unmatched, messages, strict=True):
        warnings.warn_explicit(
            ZmqConformanceWarning(message), ZmqConformanceWarning,
            state.xfail_origin, entry.line,
        )


@pytest.hookimpl(tryfirst=True, specname="pytest_runtest_protocol")
def pytest_runtest_protocol_reruns(
    item: pytest.Item, nextitem: pytest.Item | None
) -> bool | None:
    """Run a clause test, re-run it if it failed, then log the first run's reports.

    Other tests, and every test with ``--zmq-reruns 0``, run as pytest runs them.
    Inside the supervising wrapper above, so re-runs keep the stall deadline.
    """
    state = item.config.stash.get(_STATE, None)
    if state is None or state.rerun_count <= 0 or item.stash.get(_CLAUSES, None) is None:
        return None
    ihook = item.ihook
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for report in reruns.run_with_reruns(item, nextitem, state.rerun_count):
        ihook.pytest_runtest_logreport(report=report)
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Record, where the exception still exists, whether it blocked and its counterexample."""
    report = yield
    if item.stash.get(_CLAUSES, None) is None:
        return report
    exc = call.excinfo.value if call.excinfo is not None else None
    if report.failed and exc is not None:
        blocked = find_blocked(exc)
        if blocked is not None:
            report.user_properties.append(("zmq_blocked", str(blocked)))
        report.user_properties.append(("zmq_counterexample", counterexample(exc)))
        blamed = blamed_clauses(exc)
        if blamed:
            report.user_properties.append(("zmq_blamed", " ".join(blamed)))
    elif report.failed and call.when == "call" and item.stash.get(_XFAIL, None) is not None:
        report.user_properties.append(("zmq_xpassed", "1"))
    return report


class _Recorder:
    """Collects the reports of one session and writes the per-clause verdicts.

    Registered by :func:`pytest_configure` for each session (so its hooks see
    the session's state); in an xdist run only the controller writes reports.
    """

    def __init__(self, config: pytest.Config, state: _State) -> None:
        self.config = config
        self.state = state

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Fold each phase report of a clause test into its :class:`TestResult`."""
        props = {str(k): str(v) for k, v in report.user_properties}
        clauses = props.get("zmq_clauses")
        if clauses is None:
            return
        state = self.state
        if "zmq_transport" in props:
            state.fixture_transport = props["zmq_transport"]
        result = state.results.get(report.nodeid)
        if result is None:
            result = TestResult(
                report.nodeid, tuple(clauses.split()), k_expr=props.get("zmq_k"),
                chaos=props.get("zmq_chaos") == "1",
            )
            state.results[report.nodeid] = result
        wasxfail = getattr(report, "wasxfail", None)
        tally = reruns.Tally.decode(props.get(reruns.PROPERTY, ""))
        outcome = phase_outcome(
            when=report.when or "", outcome=report.outcome, wasxfail=wasxfail is not None,
            blocked="zmq_blocked" in props, xpassed="zmq_xpassed" in props,
            crashed="zmq_crashed" in props,
            flaky=tally is not None and tally.flaky,
        )
        if tally is not None:
            result.reruns = tally
        reason: str | None = None
        if outcome == "skipped":
            reason = _skip_reason(report)
        elif outcome in ("xfailed", "xpassed"):
            reason = wasxfail or props.get("zmq_xfail")
        elif outcome == "blocked":
            reason = props.get("zmq_blocked")
        elif outcome == "crashed":
            reason = props.get("zmq_crashed")
        rerun_s = props.get(reruns.SECONDS_PROPERTY)
        result.add_phase(
            outcome, report.duration + (float(rerun_s) if rerun_s else 0.0), reason=reason,
            counterexample=props.get("zmq_counterexample"),
        )
        if "zmq_blamed" in props:
            result.blamed = tuple(props["zmq_blamed"].split())
        result.measurements.update(
            (key, value) for key, value in props.items() if not key.startswith("zmq_")
        )

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport,
                               sched: Any) -> None:
        """xdist controller: turn "worker crashed" into blocked/crashed with the stack."""
        directory = self.state.postmortem_dir
        node = getattr(report, "node", None)
        worker = getattr(getattr(node, "gateway", None), "id", None)
        if directory is None or worker is None:
            return
        crash = postmortem.examine(directory, str(worker), crashitem)
        known = self.state.results.get(crashitem)
        clauses = crash.clauses or (known.clauses if known is not None else ())
        if not clauses:
            return
        props = dict(crash.properties)
        props["zmq_clauses"] = " ".join(clauses)
        key = "zmq_blocked" if crash.verdict == "blocked" else "zmq_crashed"
        props[key] = crash.reason
        props["zmq_counterexample"] = f"{crash.reason}\n\n{crash.trace}".strip()
        report.user_properties[:] = list(props.items())
        report.longrepr = f"{report.longrepr}\n{crash.reason}\n\n{crash.trace}"

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """xdist controller: take the xfail warnings the workers computed at collection."""
        output = getattr(node, "workeroutput", None) or {}
        self.state.warnings.extend(output.get("zmq_conformance_warnings", ()))

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        config, state = self.config, self.state
        if hasattr(config, "workerinput") or config.option.collectonly:
            return
        paths = {
            "json_path": config.getoption("zmq_report_json"),
            "junit_path": config.getoption("zmq_report_junit"),
            "markdown_path": config.getoption("zmq_report_markdown"),
        }
        if not (state.results or state.opted_in or any(paths.values())):
            return
        state.report = build_report(config, state)
        base = config.invocation_params.dir
        state.written = write_reports(
            state.report, **{k: (base / v if v else None) for k, v in paths.items()}
        )

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        state = self.state
        if state.report is None or not (state.results or state.opted_in):
            return
        _summary(terminalreporter, state.report, state.written)


def _skip_reason(report: pytest.TestReport) -> str | None:
    longrepr: Any = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return None


def build_report(config: pytest.Config, state: _State) -> RunReport:
    """The per-clause :class:`RunReport` of this session."""
    transport = state.fixture_transport or state.transport
    if transport is None:
        try:
            transport = selection.configured_transport(config)[0]
        except ConfigError:
            transport = "?"
    seed: Any = config.getoption("hypothesis_seed", None)
    if isinstance(seed, str) and seed.isdigit():
        seed = int(seed)
    context = ReplayContext(None if state.fixture_transport else transport, state.profile, seed,
                            contract=state.contract)
    narrowed = [
        f"{flag} {expr!r}"
        for flag, expr in (("-k", config.option.keyword), ("-m", config.option.markexpr))
        if expr
    ]
    no_test = f"no test selected ({', '.join(narrowed)})" if narrowed else NO_TEST_REASON
    verdicts = aggregate(
        state.results.values(), context=context, chaos_enabled=state.chaos,
        clauses=contracts.CONTRACTS[state.contract].clauses, no_test_reason=no_test,
    )
    return RunReport(
        transport=transport, profile=state.profile, seed=seed, clauses=verdicts,
        contract=state.contract,
        warnings=_xfail_warnings(config, state),
    )


def _xfail_warnings(config: pytest.Config, state: _State) -> list[str]:
    return list(dict.fromkeys(state.warnings))


def _summary(tr: Any, report: RunReport, written: Sequence[Path]) -> None:
    """A short per-clause block at the end of the terminal output."""
    seed = "random" if report.seed is None else report.seed
    tr.section(f"zmq-conformance: contract {report.contract}, {report.transport} "
               f"(profile {report.profile}, seed {seed})")
    chaos_skipped = 0
    untested: dict[str, list[str]] = {}  # reason -> clause IDs
    for verdict in report.ordered():
        if verdict.verdict == "skipped" and not verdict.tests:
            if verdict.reason == CHAOS_REASON:
                chaos_skipped += 1
            else:
                untested.setdefault(verdict.reason or NO_TEST_REASON, []).append(verdict.clause.id)
            continue
        tests = len(verdict.tests)
        note = f"  [{verdict.reason}]" if verdict.reason and verdict.verdict != "passed" else ""
        tr.write_line(
            f"{verdict.verdict.upper():8} {verdict.clause.id:7} {verdict.clause.title}"
            f"  ({tests} test{'s' if tests != 1 else ''}, {verdict.duration_s:.2f} s)"
            f"{note[:160]}",
            red=verdict.verdict in FAILING, green=verdict.verdict == "passed",
            yellow=verdict.verdict in ("skipped", "xfailed"),
        )
    for reason, ids in untested.items():
        tr.write_line(f"SKIPPED  {reason}: {', '.join(ids)}", yellow=True)
    counts = ", ".join(f"{n} {v}" for v, n in report.counts().items() if n)
    extra = f" ({chaos_skipped} chaos clauses not run: use --zmq-chaos)" if chaos_skipped else ""
    tr.write_line(f"clauses: {counts}{extra}", bold=True)
    for path in written:
        tr.write_line(f"report written: {os.fspath(path)}")
