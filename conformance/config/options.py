"""The plugin's options: ``--zmq-*`` on the command line and ``zmq_*`` in the ini file.

The CLI translates its own options into these (:mod:`conformance.config.run_args`).
"""

from __future__ import annotations

import argparse

import pytest

from conformance import contracts
from conformance.config import profiles
from conformance.reporting import run_output
from conformance.supervision import postmortem, reruns

__all__ = ["add_options", "reruns_count"]


def add_options(parser: pytest.Parser) -> None:
    """Add the plugin's command-line and ini options to ``parser``."""
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
    group.addoption("--zmq-driver", metavar="CMD", default=None,
                    help="a driver command to test instead of MODULE:ATTR, for an "
                         "implementation in any language (implies --zmq-conformance; "
                         "docs/drivers.md); default: ini zmq_driver, $ZMQ_CONFORMANCE_DRIVER")
    group.addoption("--zmq-capability", metavar="NAME=VALUE", action="append", default=[],
                    help="declare a capability of the implementation (repeatable), e.g. "
                         "heartbeat_ivl_ms=1000")
    group.addoption("--zmq-profile", metavar="NAME", default=None,
                    help=f"depth profile: {', '.join(profiles.PROFILES)} (default: ini "
                         f"zmq_profile or {profiles.DEFAULT_PROFILE})")
    group.addoption("--zmq-xfail-file", metavar="PATH", default=None,
                    help="expected failures: lines 'CLAUSE-ID: reason' or 'test-id: reason'")
    group.addoption("--zmq-chaos", action="store_true", default=False,
                    help="also run the tests under injected faults (fault proxy, paused or "
                         "killed processes): the chaos clauses and each contract's chaos suite")
    group.addoption("--zmq-nodes", metavar="MODE", default=None, choices=contracts.NODE_MODES,
                    help="where nodes run: inprocess (default) or process (each node in its "
                         "own OS process, driven through execnet; needed by PROC-1..3 only)")
    group.addoption("--zmq-suite", metavar="PATH", action="append", default=[],
                    help="collect PATH as the suite instead of the built-in one (advanced: "
                         "suite development, vendored copies)")
    group.addoption("--zmq-stall-limit", metavar="SECONDS", type=float, default=None,
                    help="a suite test that starts no call into the implementation for this long "
                         "is hung: its process is ended and the test reported blocked "
                         f"(default {postmortem.DEFAULT_STALL_LIMIT_S:.0f})")
    group.addoption("--zmq-reruns", metavar="N", type=reruns_count, default=None,
                    help="re-run a failing clause test up to N times to tell a flaky "
                         f"failure from a reproducible one (default {reruns.DEFAULT_RERUNS}; "
                         "0: never)")
    group.addoption("--zmq-report-json", metavar="PATH", default=None,
                    help="write per-clause verdicts as JSON")
    group.addoption("--zmq-report-junit", metavar="PATH", default=None,
                    help="write per-clause verdicts as JUnit XML (one testcase per clause)")
    group.addoption("--zmq-report-markdown", metavar="PATH", default=None,
                    help="write per-clause verdicts as a Markdown report")
    group.addoption("--zmq-verdicts", metavar="PATH", default=None,
                    help="write the JSON verdicts for a supervising process (as "
                         "--zmq-report-json, but not announced as a report)")
    group.addoption("--zmq-progress", choices=run_output.PROGRESS_MODES, default="off",
                    help="per-clause progress while the run goes: a live line (live), a line "
                         "per finished clause (lines), live on a terminal else lines (auto), "
                         "or pytest's own (off, the default)")
    parser.addini("zmq_conformance", "run the conformance suite in every session",
                  type="bool", default=False)
    parser.addini("zmq_contract", "the contract to check (default p2p)", default="")
    parser.addini("zmq_transport", "MODULE:ATTR of the implementation under test", default="")
    parser.addini("zmq_driver", "driver command of the implementation under test "
                  "(docs/drivers.md)", default="")
    parser.addini("zmq_capabilities", "capabilities of the transport, one NAME=VALUE per line",
                  type="linelist", default=[])
    parser.addini("zmq_profile", "depth profile of the suite (ci, dev, thorough)", default="")
    parser.addini("zmq_xfail_file", "expected-failure file (relative to the ini file)",
                  default="")


def reruns_count(text: str) -> int:
    """``--zmq-reruns``: a non-negative integer."""
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(
            f"--zmq-reruns={text!r}: expected a non-negative integer"
        )
    return int(text)
