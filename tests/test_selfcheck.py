"""The mutant catalog and ``zmq-conformance self-check``.

Pure-logic tests of the catalog (coverage of clauses and bug classes, names,
factories), of the runner's parsing and rendering, and one expensive test,
parametrized by mutant so it spreads over ``pytest -n auto``: every non-chaos
mutant is killed by the tests of the clauses it targets, under the default
profile, and the reference passes those same clauses.
"""

from __future__ import annotations

import ast
import json
import sys
import textwrap
from pathlib import Path

import pytest
from _selfcheck_batch import session_dir

from conformance.config.loading import DEFAULT_TRANSPORT, load_factory
from conformance.contracts import CLAUSES
from conformance.contracts.p2p.clauses import CLAUSES as P2P_CLAUSES
from conformance.contracts.p2p.mutants import CATALOG, FAILURE_MODES, RACY
from conformance.errors import ConfigError
from conformance.selfcheck import batch, runner
from conformance.selfcheck import mutants as catalog_module
from conformance.selfcheck.mutants import (
    Mutant,
    load_catalog,
    load_extra,
    validate,
)

ROOT = Path(__file__).resolve().parents[1]
NON_CHAOS = [m for m in CATALOG if not m.chaos]
#: The control of the kill tests: the reference against every non-chaos clause a
#: mutant targets (an entry whose factory is its base; never a catalog member).
REFERENCE = Mutant(
    "reference_control", DEFAULT_TRANSPORT, "the unmutated reference", "control",
    tuple(sorted({c for m in NON_CHAOS for c in m.clauses if not CLAUSES[c].chaos})),
)


# -- the catalog ---------------------------------------------------------------


def test_every_clause_is_targeted() -> None:
    """Every clause has a mutant; non-chaos clauses have a non-chaos one (SEC-2 too: the
    reference declares authentication, and its mutants drop it in four ways)."""
    targeted = {c for m in CATALOG for c in m.clauses}
    non_chaos_targeted = {c for m in NON_CHAOS for c in m.clauses}
    for clause in P2P_CLAUSES.values():
        assert clause.id in targeted, f"no mutant targets {clause.id}"
        if not clause.chaos:
            assert clause.id in non_chaos_targeted, f"no non-chaos mutant targets {clause.id}"


def test_every_design_bug_class_is_modelled() -> None:
    used = {m.models for m in CATALOG}
    missing = [k for k, mode in FAILURE_MODES.items() if mode.design and k not in used]
    assert not missing, f"bug classes of DESIGN.md without a mutant: {missing}"
    assert all(m.models in FAILURE_MODES for m in (*CATALOG, *RACY))


def test_names_unique_and_valid() -> None:
    names = [m.name for m in (*CATALOG, *RACY)]
    assert len(names) == len(set(names))
    validate((*CATALOG, *RACY))


@pytest.mark.parametrize("mutant", [*CATALOG, *RACY], ids=lambda m: m.name)
def test_every_factory_imports_and_derives_from_the_reference(mutant: Mutant) -> None:
    from reference_impl import ZmqTransport

    factory = load_factory(mutant.factory)
    assert isinstance(factory, type) and issubclass(factory, ZmqTransport)
    assert factory is not ZmqTransport
    assert factory.__doc__, f"{mutant.factory} has no docstring describing its defect"
    assert load_factory(mutant.base) is ZmqTransport


def test_every_mutant_class_is_in_the_catalog() -> None:
    from conformance.contracts.p2p import process_transports, transports

    listed = {m.factory.split(":")[1] for m in (*CATALOG, *RACY)}
    assert set(transports.__all__) | set(process_transports.__all__) == listed


def test_mutant_source_marks_the_defect() -> None:
    """Each mutant class (or the class it plugs in) carries a ``# MUTATION`` line."""
    source = "".join((ROOT / "conformance" / "contracts" / "p2p" / name).read_text()
                     for name in ("transports.py", "process_transports.py"))
    assert source.count("# MUTATION") >= len(CATALOG) + len(RACY)


def test_plugin_and_suite_never_import_selfcheck() -> None:
    """Importing the plugin and every suite module leaves conformance.selfcheck unloaded
    (the CLI imports the runner lazily, for ``self-check`` only)."""
    import subprocess

    probe = textwrap.dedent("""
        import importlib, pkgutil, sys
        import conformance.plugin
        from conformance.contracts import CONTRACTS
        for contract in CONTRACTS.values():
            for name in (*contract.suite, *contract.chaos_suite):
                package = importlib.import_module(name)
                importlib.import_module(contract.make_spec.partition(":")[0])
                for info in pkgutil.walk_packages(package.__path__, name + "."):
                    importlib.import_module(info.name)
        loaded = sorted(m for m in sys.modules if m.startswith("conformance.selfcheck"))
        print(" ".join(loaded))
    """)
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=False, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"loaded by plugin/suite: {proc.stdout.strip()}"
    offenders = []
    for path in [*(ROOT / "conformance").glob("*.py"), *(ROOT / "conformance").rglob("suite/*.py")]:
        if path.name == "cli.py":
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n.startswith("conformance.selfcheck") for n in names):
                offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"these import conformance.selfcheck: {sorted(set(offenders))}"


def test_validate_rejects_bad_entries() -> None:
    good = CATALOG[0]
    with pytest.raises(ConfigError, match="duplicate name"):
        validate([good, good])
    with pytest.raises(ConfigError, match="unknown clause 'NOPE-1'"):
        validate([Mutant("x", "m:a", "d", "m", ("NOPE-1",))])
    with pytest.raises(ConfigError, match="snake_case"):
        validate([Mutant("Bad-Name", "m:a", "d", "m", ("CONN-1",))])
    with pytest.raises(ConfigError, match="not marked chaos"):
        validate([Mutant("x", "m:a", "d", "m", ("HB-1",))])
    with pytest.raises(ConfigError, match="MODULE:ATTR"):
        validate([Mutant("x", "nocolon", "d", "m", ("CONN-1",))])


def test_extra_catalog_loads_from_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_mutants.py").write_text(textwrap.dedent("""
        from conformance.selfcheck import Mutant
        CATALOG = [Mutant("mine", "my_transport:Broken", "drops all", "custom", ("MSG-2",),
                          base="my_transport:Good")]
        def build():
            return CATALOG
        NOT_A_CATALOG = 3
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert [m.name for m in load_extra("my_mutants:CATALOG")] == ["mine"]
    assert [m.name for m in load_extra("my_mutants:build")] == ["mine"]
    combined = load_catalog(["my_mutants:CATALOG"], entry_points=False)
    assert combined[-1].name == "mine" and len(combined) == len(CATALOG) + 1
    with pytest.raises(ConfigError, match="iterable of Mutant"):
        load_extra("my_mutants:NOT_A_CATALOG")
    with pytest.raises(ConfigError, match="cannot import"):
        load_extra("no_such_module_xyz:CATALOG")
    with pytest.raises(ConfigError, match="MODULE:ATTR"):
        load_extra("my_mutants")
    with pytest.raises(ConfigError, match="duplicate name"):
        load_catalog(["my_mutants:CATALOG", "my_mutants:build"], entry_points=False)


def test_entry_point_group_is_documented() -> None:
    doc = (ROOT / "docs" / "mutants.md").read_text()
    assert catalog_module.ENTRY_POINT_GROUP in doc
    for mutant in CATALOG:
        assert f"`{mutant.name}`" in doc, f"docs/mutants.md does not list {mutant.name}"


# -- the runner's logic ----------------------------------------------------------


def test_counterexample_steps() -> None:
    stateful = textwrap.dedent("""\
        Falsifying example:
        state = ClusterMachine()
        state.add_node(name='a')
        state.connect(a='a', b='b')
        state.send(n=1)
        state.teardown()
        AssertionError: MSG-2: ...""")
    assert runner.counterexample_steps(stateful) == 3
    assert runner.counterexample_steps("Falsifying example: test_x(n=3)\nAssertionError") == 1
    assert runner.counterexample_steps(None) == 1
    assert runner.counterexample_steps("AssertionError: CONN-5: leaked") == 1


def test_main_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert runner.main(["--mutant", "no_such_mutant"]) == 2
    assert "--mutant='no_such_mutant'" in capsys.readouterr().err
    assert runner.main(["--profile", "nope"]) == 2
    assert runner.main(["--extra", "nomodule"]) == 2
    assert runner.main(["-n", "0"]) == 2


def test_list_prints_the_catalog_without_running(capsys: pytest.CaptureFixture[str]) -> None:
    assert runner.main(["--list", "--chaos"]) == 0
    out = capsys.readouterr().out
    assert all(m.name in out for m in CATALOG)
    assert runner.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(m.name not in out for m in CATALOG if m.chaos)


def test_renderings_carry_the_kill_matrix() -> None:
    killed = runner.MutantResult(CATALOG[0], "killed", ["CONN-1"], 3.25, 2, "targeted")
    survived = runner.MutantResult(CATALOG[1], "survived", [], 9.0, None, None, "too weak")
    control = runner.ControlResult("reference_impl:ZmqTransport", True, "passed", [], 20.0)
    config = runner._Config("ci", 1, False, 60.0, 10, (), ROOT)
    data = runner.to_json([killed, survived], [control], 30.0, config)
    assert data["mutants"][CATALOG[0].name] == {
        **data["mutants"][CATALOG[0].name],
        "killed": True, "clauses": ["CONN-1"], "seconds": 3.25, "counterexample_steps": 2,
    }
    assert data["mutants"][CATALOG[1].name]["killed"] is False
    assert data["controls"]["reference_impl:ZmqTransport"]["passed"] is True
    json.dumps(data)
    text = runner.render_text([killed, survived], [control], 30.0)
    assert "1/2 mutants killed" in text and "too weak" in text
    markdown = runner.render_markdown([killed, survived], [control], 30.0)
    assert f"| `{CATALOG[1].name}` | **SURVIVED** |" in markdown


def test_claims_share_runs_and_tell_lost_ones(tmp_path: Path) -> None:
    """A run is claimed once; it is running while its claimer lives, lost when the
    claimer died without finishing it, done once done.json exists."""
    import subprocess

    assert batch.state(tmp_path, "m") == "unclaimed"
    assert batch.claim(tmp_path, "m") and not batch.claim(tmp_path, "m")
    assert batch.state(tmp_path, "m") == "running"
    (tmp_path / "m" / batch.DONE).write_text('{"exit_code": 1, "seconds": 1.0}')
    assert batch.state(tmp_path, "m") == "done"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    (tmp_path / "lost").mkdir()
    (tmp_path / "lost" / batch.CLAIM).write_text(gone.stdout.strip())
    assert batch.state(tmp_path, "lost") == "lost"


def test_a_lost_run_is_run_again_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mutant = next(m for m in NON_CHAOS if not m.isolate)
    (tmp_path / mutant.name).mkdir()
    (tmp_path / mutant.name / batch.CLAIM).write_text("999999999")  # no such process
    alone: list[tuple[str, bool, int | None]] = []

    def fake_run_suite(factory: str, clauses: object, config: object, *, tag: str,
                       stop_at_first_failure: bool, reruns: int | None = None,
                       rundir: Path | None = None) -> runner.SuiteRun:
        alone.append((factory, stop_at_first_failure, reruns))
        return runner.SuiteRun("failed", 1.0, {"CONN-1": "failed"})

    monkeypatch.setattr(runner, "run_suite", fake_run_suite)
    run = runner.targeted_run(mutant, _config(tmp_path), tmp_path, budget_s=1.0)
    assert alone == [(mutant.factory, True, 0)] and run.killing == ["CONN-1"]


def test_batched_runs_get_the_options_of_a_lone_run(tmp_path: Path) -> None:
    settings = batch.RunSettings("ci", 7, 0, "p2p")
    job = batch.Job("m", "reference_impl:ZmqTransport", ("CONN-1", "MSG-2"))
    args = batch.pytest_args(job, settings, tmp_path)
    joined = " ".join(args)
    for expected in ("--zmq-transport reference_impl:ZmqTransport", "--hypothesis-seed=7",
                     "--zmq-profile ci", "--zmq-reruns 0", "--selfcheck-clause CONN-1",
                     "--selfcheck-clause MSG-2", "--selfcheck-shrink-seconds 0",
                     f"--zmq-report-json {tmp_path / batch.VERDICTS}"):
        assert expected in joined, expected
    assert "-x" in args and "-n" not in args  # no workers: the session runs in the driver


def test_shrink_seconds_zero_drops_the_shrink_phase() -> None:
    from types import SimpleNamespace

    from hypothesis import Phase, given, settings
    from hypothesis import strategies as st

    from conformance.selfcheck import clause_filter

    @settings(max_examples=3)
    @given(st.integers())
    def probe(n: int) -> None:
        pass

    own = probe._hypothesis_internal_use_settings  # type: ignore[attr-defined]
    clause_filter._without_shrinking([SimpleNamespace(obj=probe)])  # type: ignore[list-item]
    patched = probe._hypothesis_internal_use_settings  # type: ignore[attr-defined]
    assert Phase.shrink not in patched.phases and patched.max_examples == 3
    clause_filter.pytest_unconfigure(None)  # type: ignore[arg-type]
    assert probe._hypothesis_internal_use_settings is own  # type: ignore[attr-defined]


# -- the expensive one: every mutant is killed -----------------------------------


#: A kill test that finds its mutant's run unclaimed runs it and, side by side in
#: this many lanes, further unclaimed runs until this many seconds have passed (so no
#: single test runs the whole catalog); later kill tests find theirs done.
_BATCH_BUDGET_S = 8.0
_LANES = 3


def _config(tmp_path: Path, *, shrink_seconds: int = runner.DEFAULT_SHRINK_S) -> runner._Config:
    return runner._Config(
        profile="ci", seed=runner.DEFAULT_SEED, chaos=False, run_timeout=600.0,
        shrink_seconds=shrink_seconds, run_args=(), workdir=tmp_path,
    )


@pytest.fixture(scope="session")
def batched_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the kill tests leave their targeted runs: one directory for the whole
    session, shared by the xdist workers, so each mutant runs once."""
    shared = session_dir(tmp_path_factory) / "selfcheck-batched"
    shared.mkdir(exist_ok=True)
    return shared


def test_reference_passes_every_targeted_clause(tmp_path: Path, batched_runs: Path) -> None:
    """Every clause a mutant is killed by passes on the reference: one run of all
    their tests, with the suite's default re-runs. Its other lanes meanwhile run
    mutants' targeted runs for the kill tests."""
    run = runner.targeted_run(REFERENCE, _config(tmp_path), batched_runs,
                              others=NON_CHAOS, budget_s=_BATCH_BUDGET_S, lanes=_LANES)
    assert run.status == "ok", f"reference: {run.unclean} ({run.status})\n{run.log_tail}"
    assert {c for c, v in run.verdicts.items() if v == "passed"} >= set(REFERENCE.clauses)


@pytest.mark.parametrize("mutant", NON_CHAOS, ids=lambda m: m.name)
def test_mutant_is_killed_by_its_target_clauses(
    mutant: Mutant, tmp_path: Path, batched_runs: Path
) -> None:
    """The run of the suite limited to the mutant's target clauses kills it.

    Shrinking is off (a kill needs a failing example, not a minimal one). A
    mutant that can share a process runs in a batch driver; the others run
    alone under the CLI, as ``zmq-conformance self-check`` does. Runs are
    shared by every test (and xdist worker) of the session: see
    :func:`conformance.selfcheck.runner.targeted_run`.
    """
    start = NON_CHAOS.index(mutant)
    run = runner.targeted_run(mutant, _config(tmp_path, shrink_seconds=0), batched_runs,
                              others=[*NON_CHAOS[start + 1:], *NON_CHAOS[:start]],
                              budget_s=_BATCH_BUDGET_S, lanes=_LANES)
    assert run.status in ("failed", "ok"), f"suite run {run.status}:\n{run.log_tail}"
    assert run.killing, (
        f"{mutant.name} survived its target clauses {mutant.clauses}: verdicts "
        f"{ {c: v for c, v in run.verdicts.items() if c in mutant.clauses} }\n{run.log_tail}"
    )


def test_runner_module_runs_as_a_script() -> None:
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "conformance.selfcheck.runner", "--list"],
                          capture_output=True, text=True, check=False, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert CATALOG[0].name in proc.stdout


def test_reports_go_into_directories_that_do_not_exist_yet(tmp_path: Path) -> None:
    from conformance.selfcheck.runner import _write

    target = tmp_path / "reports" / "nested" / "selfcheck.md"
    _write(str(target), "# matrix\n")
    assert target.read_text(encoding="utf-8") == "# matrix\n"
