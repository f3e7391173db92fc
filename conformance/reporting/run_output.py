"""What a run shows while it goes and for CI: clause progress and GitHub Actions output.

:class:`RunOutput` is a pytest plugin object the suite's plugin registers in
every session. It

* follows the run clause by clause (:class:`~conformance.reporting.progress.Progress`)
  when ``--zmq-progress`` is ``auto`` (a live line on a terminal, one line per
  finished clause elsewhere), ``live`` or ``lines``; pytest's own one-letter
  progress is then left out, since the clause lines say more. The CLI asks
  for ``auto`` unless run with ``-v``; plain pytest sessions keep pytest's
  output (``off``);
* learns which tests check which clauses from the collection: in the
  process that collects (no xdist), or from a file each xdist worker leaves
  in the directory the controller shares with its workers (the postmortem
  directory, removed with the session; a remote worker's file cannot be
  seen: the progress then counts tests instead of clauses);
* inside GitHub Actions, writes the ``::error`` annotations of the failing
  clauses and appends the Markdown report to ``GITHUB_STEP_SUMMARY``
  (:mod:`conformance.reporting.github`), in every session that built a
  report.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Generator, Iterable
from pathlib import Path
from typing import Any, Final

import pytest

from conformance.config.session import State
from conformance.reporting import build, github
from conformance.reporting.progress import Progress
from conformance.reporting.verdicts import ClauseVerdict, RunReport

__all__ = ["PROGRESS_MODES", "RunOutput", "register", "unregister"]

#: ``--zmq-progress`` values: ``auto`` is ``live`` on a terminal, else ``lines``.
PROGRESS_MODES: Final = ("off", "auto", "live", "lines")
_PLAN_DIR_KEY: Final = "zmq_plan_dir"
_CLAUSES_PROPERTY: Final = "zmq_clauses"
_PLUGIN_NAME: Final = "zmq-conformance-run-output"


def register(config: pytest.Config, state: State) -> RunOutput:
    """Register the session's :class:`RunOutput` (``--zmq-progress``, GitHub Actions)."""
    output = RunOutput(
        config, mode=config.getoption("zmq_progress"),
        judge=lambda cid: build.build_report(config, state).clauses[cid],
        report=lambda: state.report,
        shared_dir=lambda: state.postmortem_dir,
    )
    config.pluginmanager.register(output, _PLUGIN_NAME)
    return output


def unregister(config: pytest.Config) -> None:
    """Stop the session's progress and unregister its :class:`RunOutput`."""
    output = config.pluginmanager.get_plugin(_PLUGIN_NAME)
    if isinstance(output, RunOutput):
        output.close()
        config.pluginmanager.unregister(output)


class RunOutput:
    """See the module docstring. ``judge`` gives a clause's verdict from the results so
    far; ``report`` the session's report once it is built."""

    def __init__(
        self,
        config: pytest.Config,
        *,
        mode: str,
        judge: Callable[[str], ClauseVerdict],
        report: Callable[[], RunReport | None],
        shared_dir: Callable[[], Path | None],
    ) -> None:
        self._config = config
        self._report = report
        self._shared_dir = shared_dir
        self.progress: Progress | None = None
        worker = getattr(config, "workerinput", None)
        if mode == "off" or worker is not None or config.option.collectonly:
            return
        stream = sys.stdout
        live = mode == "live" or (mode == "auto" and stream.isatty())
        distributed = config.getoption("dist", "no") != "no"
        # Without xdist the tests run in this process, under pytest's output
        # capture: redraw only from the hooks (capture is off there), not a thread.
        self.progress = Progress(stream, live=live, judge=judge,
                                 tick_s=0.5 if distributed else None)

    def close(self) -> None:
        """Stop the progress (idempotent)."""
        if self.progress is not None:
            self.progress.close()

    # -- the plan: which tests check which clauses --------------------------------------

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        directory = self._shared_dir()
        if self.progress is not None and directory is not None:
            node.workerinput[_PLAN_DIR_KEY] = str(directory)

    @pytest.hookimpl(trylast=True)  # after the suite's plugin gave each item its clauses
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        plan = {item.nodeid: _clauses(item.user_properties) for item in items}
        plan = {nodeid: ids for nodeid, ids in plan.items() if ids}
        worker = getattr(self._config, "workerinput", None)
        if worker is not None:
            directory = worker.get(_PLAN_DIR_KEY)
            if directory:
                with contextlib.suppress(OSError):  # a remote worker: not our file system
                    target = Path(directory) / f"plan-{worker['workerid']}.json"
                    target.write_text(json.dumps(plan), encoding="utf-8")
        elif self.progress is not None:
            self.progress.plan(plan)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        directory = self._shared_dir()
        if self.progress is None or directory is None:
            return
        worker = node.workerinput.get("workerid", "")
        try:
            plan = json.loads((directory / f"plan-{worker}.json").read_text("utf-8"))
        except (OSError, ValueError):
            return
        wanted = set(ids)
        self.progress.plan({k: v for k, v in plan.items() if k in wanted})

    # -- the run --------------------------------------------------------------------

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        if self.progress is not None:
            self.progress.started(nodeid)

    @pytest.hookimpl(trylast=True)  # after the suite's recorder folded the report in
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # "???": the report xdist makes for a test whose worker died (no teardown follows).
        if self.progress is not None and report.when in ("teardown", "???"):
            self.progress.finished(report.nodeid)

    @pytest.hookimpl(wrapper=True)
    def pytest_report_teststatus(
        self, report: pytest.TestReport
    ) -> Generator[None, object, object]:
        status = yield
        if (
            self.progress is not None
            and isinstance(status, tuple)
            and len(status) == 3
            and self._config.get_verbosity() <= 0
        ):
            return (status[0], "", "")  # counted in the summary, no letter printed
        return status

    @pytest.hookimpl(tryfirst=True)  # the live line goes before pytest's summary
    def pytest_sessionfinish(self) -> None:
        if self.progress is not None:
            self.progress.close()

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        report = self._report()
        if report is None or hasattr(self._config, "workerinput"):
            return
        github.emit(report, sys.stdout)


def _clauses(properties: Iterable[tuple[str, object]]) -> list[str]:
    for key, value in properties:
        if key == _CLAUSES_PROPERTY:
            return str(value).split()
    return []
