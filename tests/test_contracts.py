"""The contract-family core: registry, ``--contract`` selection, factory fit, reports.

Pure-logic tests of :mod:`conformance.contracts` and of how the CLI and the
plugin pick a contract; the contracts' own suites run in their own tests.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conformance import contracts
from conformance.cli import main
from conformance.config.loading import check_fits, contract_spec_from_path, load_factory
from conformance.config.selection import parse_capabilities, suite_paths
from conformance.contracts import CLAUSES
from conformance.errors import ConfigError
from conformance.reporting.verdicts import ReplayContext, RunReport, aggregate
from conformance.selfcheck.mutants import builtin_catalog, contract_of, load_catalog

ROOT = Path(__file__).resolve().parents[1]


def test_every_clause_belongs_to_exactly_one_contract() -> None:
    owned = [cid for c in contracts.CONTRACTS.values() for cid in c.clauses]
    assert sorted(owned) == sorted(CLAUSES)
    assert len(owned) == len(set(owned))
    assert contracts.DEFAULT_CONTRACT == "p2p"
    assert {c.family for c in contracts.CONTRACTS["kv-events-publisher"].clauses.values()} == {
        "EVT"
    }


@pytest.mark.parametrize("contract", list(contracts.CONTRACTS.values()), ids=lambda c: c.name)
def test_every_part_of_a_contract_resolves(contract: contracts.Contract) -> None:
    """Suite directories exist, the reference fits its own contract, the catalog loads
    and targets only the contract's clauses, the capability type parses."""
    assert suite_paths(chaos=True, contract=contract.name)
    reference = load_factory(contract.default_factory)
    check_fits(reference, contract, path=contract.default_factory, option="test")
    spec = contract_spec_from_path(contract, contract.default_factory)
    assert spec.name == contract.default_factory
    catalog = builtin_catalog(contract.name)
    assert catalog, f"{contract.name} has no mutant"
    for mutant in catalog:
        assert set(mutant.clauses) <= set(contract.clauses), mutant.name
        assert contract_of(mutant) == contract.name
    assert importlib.import_module(contract.make_spec.partition(":")[0])
    # The driver bridge: the suite's proxy factory, and the Python driver's service.
    from conformance.drivers.serving import Service

    assert callable(contracts.resolve(contract.driver))
    assert issubclass(contracts.resolve(contract.python_service), Service)


def test_a_factory_of_another_contract_does_not_fit() -> None:
    publisher = contracts.CONTRACTS["kv-events-publisher"]
    with pytest.raises(ConfigError, match=r"does not fit the contract 'kv-events-publisher'"):
        contract_spec_from_path(publisher, "reference_impl:ZmqTransport", option="--transport")
    with pytest.raises(ConfigError, match=r"does not fit the contract 'p2p'.*--contract"):
        contract_spec_from_path(
            contracts.CONTRACTS["p2p"], "reference_impl.kv_events.publisher:KVEventPublisher"
        )


def test_unknown_contract_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="p2p, kv-events-publisher, kv-events-subscriber"):
        contracts.get("nope")


def test_capabilities_are_parsed_per_contract() -> None:
    publisher = contracts.CONTRACTS["kv-events-publisher"].capability_type()
    assert parse_capabilities([], ["encoding=array", "buffer_steps=8"], kind=publisher) == {
        "encoding": "array", "buffer_steps": 8,
    }
    with pytest.raises(ConfigError, match="encoding"):
        parse_capabilities([], ["encoding=json"], kind=publisher)
    with pytest.raises(ConfigError, match="unknown capability 'max_message_bytes'"):
        parse_capabilities([], ["max_message_bytes=10"], kind=publisher)


def test_catalog_selection_by_contract() -> None:
    p2p = {m.name for m in load_catalog(entry_points=False)}
    kv = {m.name for m in load_catalog(entry_points=False, contract="kv-events-publisher")}
    assert p2p and kv and not p2p & kv


def test_list_groups_by_contract(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    text = capsys.readouterr().out
    headers = [line for line in text.splitlines() if line.startswith("== ")]
    assert [h.split()[1].rstrip(":") for h in headers] == list(contracts.CONTRACTS)
    assert text.index("EVT-1") > text.index("== kv-events-publisher") > text.index("SEC-2")
    assert main(["list", "--contract", "kv-events-subscriber", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == set(contracts.CONTRACTS["kv-events-subscriber"].clauses)
    assert {e["contract"] for e in data.values()} == {"kv-events-subscriber"}
    assert main(["list", "--contract", "nope"]) == 2
    assert "unknown contract" in capsys.readouterr().err


def test_run_rejects_a_factory_that_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["run", "--contract", "kv-events-publisher", "--transport",
                   "reference_impl:ZmqTransport"])
    assert status == 2
    err = capsys.readouterr().err
    assert "does not fit the contract 'kv-events-publisher'" in err
    assert "factory(endpoint: str, replay_endpoint: str, *, topic: str)" in err
    assert main(["run", "--contract", "nope"]) == 2


def test_reports_and_replay_commands_name_the_contract() -> None:
    clauses = contracts.CONTRACTS["kv-events-publisher"].clauses
    ctx = ReplayContext("pkg:Pub", "ci", 3, contract="kv-events-publisher")
    verdicts = aggregate([], context=ctx, clauses=clauses)
    assert set(verdicts) == set(clauses)
    cli, plain = ctx.commands("test_x")
    assert "--contract kv-events-publisher" in cli
    assert "--zmq-contract kv-events-publisher" in plain
    assert "--contract" not in ReplayContext("pkg:T", "ci", 3).commands("t")[0]
    report = RunReport("pkg:Pub", "ci", 3, verdicts, contract="kv-events-publisher")
    assert report.to_json()["contract"] == "kv-events-publisher"


def test_replay_commands_of_a_driver_run_name_the_driver_not_its_label() -> None:
    command = "./my-driver --flag"
    ctx = ReplayContext(f"driver {command} (mine)", "ci", 3, driver=command)
    cli, plain = ctx.commands("test_x")
    assert "--driver './my-driver --flag'" in cli and "--transport" not in cli
    assert "--zmq-driver './my-driver --flag'" in plain and "--zmq-transport" not in plain


def test_pytest_option_picks_the_contract(tmp_path: Path) -> None:
    """``pytest --zmq-contract`` collects that contract's suite only; a bad name is a
    usage error naming the option."""
    command = [sys.executable, "-m", "pytest", "--zmq-conformance-only", "--collect-only",
               "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)]
    proc = subprocess.run([*command, "--zmq-contract", "kv-events-subscriber"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    collected = [line for line in proc.stdout.splitlines() if "::" in line]
    assert collected and all(line.startswith("test_subscriber") for line in collected)
    proc = subprocess.run([*command, "--zmq-contract", "nope"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120, check=False)
    assert proc.returncode == 4
    assert "--zmq-contract='nope': unknown contract" in proc.stderr
