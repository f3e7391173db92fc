"""The per-clause report of a pytest session, built from what the recorder collected."""

from __future__ import annotations

from typing import Any

import pytest

from conformance import contracts
from conformance.config import selection
from conformance.config.session import State
from conformance.errors import ConfigError, is_run_error
from conformance.reporting.verdicts import NO_TEST_REASON, ReplayContext, RunReport, aggregate

__all__ = ["INTERRUPTED_REASON", "build_report"]

#: Why a clause has no verdict when the run stopped early (Ctrl-C, SIGTERM, ``-x``):
#: "no test collected" would claim the suite has no test for it.
INTERRUPTED_REASON = "not run: the run was interrupted"


def build_report(config: pytest.Config, state: State, *, interrupted: bool = False) -> RunReport:
    """The per-clause :class:`RunReport` of this session; ``interrupted`` when the session
    stopped before every collected test ran."""
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
                            contract=state.contract, driver=_driver_command(config, state))
    narrowed = [
        f"{flag} {expr!r}"
        for flag, expr in (("-k", config.option.keyword), ("-m", config.option.markexpr))
        if expr
    ]
    if interrupted:
        no_test = INTERRUPTED_REASON
    elif narrowed:
        no_test = f"no test selected ({', '.join(narrowed)})"
    else:
        no_test = NO_TEST_REASON
    verdicts = aggregate(
        state.results.values(), context=context, chaos_enabled=state.chaos,
        clauses=contracts.CONTRACTS[state.contract].clauses, no_test_reason=no_test,
    )
    return RunReport(
        transport=transport, profile=state.profile, seed=seed, clauses=verdicts,
        contract=state.contract,
        warnings=_xfail_warnings(config, state),
        run_errors=[f"{r.nodeid}: {r.reason}" for r in state.results.values()
                    if is_run_error(r.reason)],
    )


def _driver_command(config: pytest.Config, state: State) -> str | None:
    """The driver command the implementation under test runs behind, if any."""
    if state.fixture_transport:
        return None
    try:
        found = selection.configured_driver(
            config, transport_origin=selection.configured_transport(config)[1])
    except ConfigError:
        return None
    return found[0] if found else None


def _xfail_warnings(config: pytest.Config, state: State) -> list[str]:
    return list(dict.fromkeys(state.warnings))
