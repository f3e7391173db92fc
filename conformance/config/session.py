"""The plugin's state of one pytest session: configured at start, supervised, ended.

:func:`configure` activates the profile, decides the opt-in, validates the
implementation and points the collection at the suite; :func:`start_postmortem`
sets up the sentinel of a process that runs suite tests (or, in the xdist
controller, the directory its workers leave their journals in, handed to each
worker by :func:`configure_node`); :func:`bound_worker_exit` and
:func:`remove_postmortem_dir` close the session. :func:`freeze_collected`
spares the garbage collector what lives for the whole session.
"""

from __future__ import annotations

import gc
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conformance import contracts
from conformance.config import collection, profiles, selection
from conformance.errors import ConfigError
from conformance.reporting import xfail
from conformance.reporting.verdicts import RunReport, TestResult
from conformance.supervision import lifeline, postmortem, reruns, watchdog

__all__ = [
    "STATE", "State", "bound_worker_exit", "configure", "configure_node",
    "remove_postmortem_dir", "start_postmortem",
]


@dataclass
class State:
    """Per-session state of the plugin (in ``config.stash`` under :data:`STATE`)."""

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


#: The session's :class:`State`.
STATE = pytest.StashKey[State]()
_WORKER_DIR_KEY = "zmq_postmortem_dir"
_WORKER_STALL_KEY = "zmq_stall_limit"
#: After its session finished, a worker gets this long to exit (finalizers of
#: a misbehaving transport run at exit) before it is ended.
_EXIT_GRACE_S = 10.0


def configure(config: pytest.Config) -> State:
    """Activate the profile, decide the opt-in, validate the transport, extend the args."""
    state = State()
    profile = config.getoption("zmq_profile") or str(config.getini("zmq_profile") or "")
    state.profile = profiles.activate(profile.strip() or profiles.DEFAULT_PROFILE).name
    state.only = bool(config.getoption("zmq_conformance_only"))
    state.opted_in = state.only or bool(
        config.getoption("zmq_conformance")
        or config.getoption("zmq_transport")
        or config.getoption("zmq_driver")
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
        _preflight(config, state.contract, spec)
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
        collection.extend_args(config, only=state.only, suite_dirs=state.suite_dirs)
    return state


def _preflight(config: pytest.Config, contract: str, spec: Any) -> None:
    """The contract's check that its clauses can be judged at all (once, in the controller)."""
    check = contracts.get(contract).preflight
    if check and not hasattr(config, "workerinput") and not config.option.collectonly:
        contracts.resolve(check)(spec)


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


def start_postmortem(config: pytest.Config, state: State) -> None:
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


def configure_node(node: Any) -> None:
    """xdist controller: hand each worker the postmortem directory and the stall limit."""
    state = node.config.stash.get(STATE, None)
    if state is not None and state.postmortem_dir is not None:
        node.workerinput[_WORKER_DIR_KEY] = str(state.postmortem_dir)
        node.workerinput[_WORKER_STALL_KEY] = state.stall_limit


def freeze_collected(session: pytest.Session) -> None:
    """In a session that runs only the suite (``--zmq-conformance-only``), move what
    exists once collection is done into the collector's permanent generation.

    Imported modules, the collected items and Hypothesis's strategies live
    until the process ends, yet each full collection walks them again: on 2
    cores a worker spent 0.56-1.0 s of CPU in the collector over a main job,
    0.25-0.48 s frozen. In a session shared with other tests the heap is not
    the suite's to decide about.
    """
    state = session.config.stash.get(STATE, None)
    if state is not None and state.only:
        gc.freeze()


def bound_worker_exit(session: pytest.Session) -> None:
    """Bound the teardown of a worker that ran suite tests: its reports are out.

    Not in a run without workers: what follows there (the terminal summary,
    other plugins' reports) is not ours to cut short.
    """
    state = session.config.stash.get(STATE, None)
    if state is not None and state.sentinel is not None:
        watchdog.set_progress_hook(None)
        if hasattr(session.config, "workerinput"):
            state.sentinel.finish(_EXIT_GRACE_S)
        else:
            state.sentinel.end()


def remove_postmortem_dir(config: pytest.Config) -> None:
    """The session is over: remove the postmortem directory this process owns."""
    state = config.stash.get(STATE, None)
    if state is not None and state.owns_postmortem_dir and state.postmortem_dir is not None:
        watchdog.set_progress_hook(None)
        shutil.rmtree(state.postmortem_dir, ignore_errors=True)
