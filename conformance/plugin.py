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
whose worker died, or when the report is made for a test whose driver
process died: :class:`conformance.drivers.DriverCrashed`).

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

from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from conformance.config import collection, hypothesis_warmup, options, run_args
from conformance.config import session as sessions
from conformance.config.fixtures import zmq_transport_factory, zmq_transport_spec
from conformance.errors import ConfigError
from conformance.reporting import recording, run_output, xfail
from conformance.reporting.xfail import ZmqConformanceWarning
from conformance.supervision import cleanup, guard, reruns, watchdog

__all__ = ["ZmqConformanceWarning", "zmq_transport_factory", "zmq_transport_spec"]

_RECORDER = "zmq-conformance-recorder"


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "clause(*ids): the contract clauses (DESIGN.md IDs) this test checks"
    )
    config.addinivalue_line(
        "markers", "chaos: needs fault injection; runs only with --zmq-chaos / --chaos"
    )
    config.addinivalue_line(
        "markers", f"{collection.LONG_MARKER}(seconds): a long test and its typical run time; "
        "long tests start first, longest first"
    )
    try:
        state = sessions.configure(config)
    except ConfigError as exc:
        run_args.note_own_usage_error(str(exc))
        raise pytest.UsageError(str(exc)) from None
    config.stash[sessions.STATE] = state
    config.pluginmanager.register(recording.Recorder(config, state), _RECORDER)
    run_output.register(config, state)
    if state.opted_in:
        sessions.start_postmortem(config, state)
        # Before any worker starts (they load what the controller built) and any test runs.
        hypothesis_warmup.warm()


def pytest_unconfigure(config: pytest.Config) -> None:
    cleanup.session_ended()
    recorder = config.pluginmanager.get_plugin(_RECORDER)
    if recorder is not None:
        config.pluginmanager.unregister(recorder)
    run_output.unregister(config)
    sessions.remove_postmortem_dir(config)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: hand each worker the postmortem directory and the stall limit.

    Hypothesis's Unicode tables are built before this, in ``pytest_configure``
    (:mod:`conformance.config.hypothesis_warmup`)."""
    sessions.configure_node(node)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[
    None, object, object
]:
    """Around each suite test: whole watchdog limits, capped shrinking once a call
    blocked, and (where a sentinel runs) the journal, the stall deadline and
    the release of what the test's transports left open."""
    state = item.config.stash.get(sessions.STATE, None)
    clauses = item.stash.get(collection.CLAUSES_KEY, None)
    watchdog.new_test()  # every test: a call that blocked in one never shortens the next's
    if clauses is None:
        return (yield)
    watchdog.set_block_hook(guard.cap_shrinking)
    try:
        sentinel = state.sentinel if state is not None else None
        return (yield from guard.journaled(item, clauses, sentinel))
    finally:
        watchdog.set_block_hook(None)
        guard.restore_shrinking()


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    sessions.freeze_collected(session)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Bound the teardown of a worker that ran suite tests: its reports are out.

    Not in a run without workers: what follows there (the terminal summary,
    other plugins' reports) is not ours to cut short.
    """
    sessions.bound_worker_exit(session)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    """Collect the suite's ``test_*.py`` even where the user's ``python_files`` would not."""
    state = parent.config.stash.get(sessions.STATE, None)
    if state is None:
        return None
    return collection.suite_module(file_path, parent, state.suite_dirs)


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
    state = config.stash.get(sessions.STATE, None)
    if state is None:
        return
    tagged = collection.tag_clause_tests(items)
    found = xfail.apply(config, state.xfail_entries, state.xfail_origin, tagged)
    if found is not None:
        state.warnings = found
    collection.hold_back_chaos(session, config, items, tagged, chaos=state.chaos,
                               contract=state.contract, suite_dirs=state.suite_dirs)
    collection.longest_first(items, tagged)


@pytest.hookimpl(tryfirst=True, specname="pytest_runtest_protocol")
def pytest_runtest_protocol_reruns(
    item: pytest.Item, nextitem: pytest.Item | None
) -> bool | None:
    """Run a clause test, re-run it if it failed, then log the first run's reports.

    Other tests, and every test with ``--zmq-reruns 0``, run as pytest runs them.
    Inside the supervising wrapper above, so re-runs keep the stall deadline.
    """
    state = item.config.stash.get(sessions.STATE, None)
    if (state is None or state.rerun_count <= 0
            or item.stash.get(collection.CLAUSES_KEY, None) is None):
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
    recording.annotate(item, call, report)
    return report
