"""What makes the main job fast without weakening it (docs/gate-time.md).

Long state machines split into parts that together run at least the unsplit
machine's distinct examples, each part on its own seed; long tests are
collected first; the CLI's child loads only the suite's plugins unless the
caller's pytest arguments may need the others.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import core

from conformance import contracts
from conformance.config import collection, profiles, run_args
from conformance.contracts.p2p import machines


@pytest.mark.parametrize("total", [1, 2, 15, 60, 400])
@pytest.mark.parametrize("parts", [1, 2, 3, 4])
def test_parts_run_at_least_the_distinct_examples_of_the_whole(total: int, parts: int) -> None:
    share = machines.part_examples(total, parts)
    # Each part repeats Hypothesis' one simplest example; the rest are its own.
    distinct = 1 + parts * (share - 1) if parts > 1 else share
    assert distinct >= total
    assert share <= total or total < parts + 1  # never more than needed per part


def test_part_examples_rejects_no_parts() -> None:
    with pytest.raises(ValueError, match="parts"):
        machines.part_examples(15, 0)


def test_each_part_draws_from_its_own_seed_derived_from_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[int | None, int]] = []

    def fake_run(build: Any, settings: Any, *, seed: int | None = None) -> None:
        seen.append((seed, settings.max_examples))

    monkeypatch.setattr(machines, "run_machine", fake_run)
    monkeypatch.setattr(core, "global_force_seed", 7)
    settings = profiles.suite_settings(max_examples=15)
    for part in range(3):
        machines.run_machine_part(lambda: None, settings, part=part, parts=3,  # type: ignore[arg-type, return-value]
                                  name="m")
    seeds = [s for s, _ in seen]
    assert len(set(seeds)) == 3 and None not in seeds
    assert {n for _, n in seen} == {machines.part_examples(15, 3)}
    seen.clear()
    for part in range(3):  # the same run seed: the same part seeds (reproducible)
        machines.run_machine_part(lambda: None, settings, part=part, parts=3,  # type: ignore[arg-type, return-value]
                                  name="m")
    assert [s for s, _ in seen] == seeds
    seen.clear()
    monkeypatch.setattr(core, "global_force_seed", None)  # plain pytest: Hypothesis' own
    machines.run_machine_part(lambda: None, settings, part=1, parts=3,  # type: ignore[arg-type, return-value]
                              name="m")
    assert seen == [(None, machines.part_examples(15, 3))]
    with pytest.raises(ValueError, match="part"):
        machines.run_machine_part(lambda: None, settings, part=3, parts=3,  # type: ignore[arg-type, return-value]
                                  name="m")


class _Item:
    def __init__(self, name: str, seconds: float | None = None) -> None:
        self.name = name
        self._marker = None if seconds is None else SimpleNamespace(args=(seconds,))
        self.nodeid = name

    def get_closest_marker(self, name: str) -> Any:
        return self._marker if name == collection.LONG_MARKER else None

    def __repr__(self) -> str:
        return self.name


def test_long_tests_come_first_longest_first_one_short_test_after_each() -> None:
    items: list[Any] = [_Item("a"), _Item("m5", 5), _Item("b"), _Item("m10", 10), _Item("c"),
                        _Item("d"), _Item("m8", 8)]
    collection.longest_first(items)
    assert [i.name for i in items] == ["m10", "a", "m8", "b", "m5", "c", "d"]
    # Only clause tests count: a user's own "long" marker is not ours.
    mixed: list[Any] = [_Item("u", 99), _Item("s", 3), _Item("t")]
    collection.longest_first(mixed, [(mixed[1], ("CONN-1",))])
    assert [i.name for i in mixed] == ["s", "u", "t"]
    plain: list[Any] = [_Item("x"), _Item("y")]
    collection.longest_first(plain)
    assert [i.name for i in plain] == ["x", "y"]


def test_a_bad_long_marker_is_a_usage_error() -> None:
    bad = _Item("bad")
    bad._marker = SimpleNamespace(args=("soon",))
    with pytest.raises(pytest.UsageError, match="long"):
        collection.longest_first([bad])  # type: ignore[list-item]


def _namespace(*extra: str) -> argparse.Namespace:
    return run_args.parse_run(["--chaos", *extra])


def test_the_child_loads_only_the_suite_plugins_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    lean = run_args.lean_plugins(_namespace(), ["-n", "2"])
    assert lean is not None
    named = lean[1::2]
    assert lean[::2] == ["-p"] * len(named)
    # The plugin by name (not the whole package: only test files are rewritten);
    # xdist only with workers.
    assert named[0] == run_args.PLUGIN_MODULE and "conformance" not in named
    assert "_hypothesis_pytestplugin" in named and "xdist.plugin" in named
    assert "xdist.plugin" not in (run_args.lean_plugins(_namespace(), []) or [])
    env = run_args.lean_env(Path("/nonexistent/usage-error"))
    assert env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] == "1"
    assert env[run_args.OWN_USAGE_ERROR_ENV] == "/nonexistent/usage-error"
    # Arguments for pytest may name any plugin's options: every plugin then.
    assert run_args.lean_plugins(_namespace("--", "--cov"), ["-n", "2"]) is None
    monkeypatch.setenv("PYTEST_ADDOPTS", "--cov")
    assert run_args.lean_plugins(_namespace(), ["-n", "2"]) is None


def test_default_workers_are_two_and_a_half_per_cpu_for_p2p_and_one_for_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p2p, control = contracts.get("p2p"), contracts.get("control")
    assert [p2p.default_workers(c) for c in (1, 2, 3, 4, 64)] == [2, 5, 7, 8, 8]
    assert [control.default_workers(c) for c in (1, 2, 3, 64)] == [2, 2, 3, 8]
    assert [p2p.default_workers(c, driver=True) for c in (1, 2, 3, 64)] == [2, 4, 6, 8]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)

    def workers(*extra: str) -> str:
        out = run_args.pytest_args(run_args.parse_run(list(extra)))[0]
        return out[out.index("-n") + 1]

    assert workers() == "5"
    assert workers("--contract", "control") == "2"
    assert workers("-n", "3") == "3"  # an explicit count always wins
    driver = (f"{shlex.quote(sys.executable)} -m conformance.drivers.python "
              "reference_impl:ZmqTransport")
    assert workers("--driver", driver) == "4"  # at most two per CPU through a driver
