"""What the p2p family's cheaper strategies still draw (docs/gate-time.md, "Drawing").

The strategies were rewritten to draw without retries and filters; these
tests pin that the values keep every MessagePack type and edge value, the
same maxima (items, key lengths, leaves, nesting), nesting that reaches the
deepest level, and every hostile shape, with the nesting bombs left out only
where asked.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any, cast

import msgspec
import pytest
from hypothesis import HealthCheck, Phase, find, given, seed, settings
from hypothesis import strategies as st

from conformance.contracts.p2p.machines.cluster import _HOSTILE_FRAMES
from conformance.contracts.p2p.strategies import (
    MAX_FIELD_NAME_CHARS,
    MAX_MESSAGE_FIELDS,
    LargeMessage,
    hostile_frames,
    hostile_payloads,
    messages,
    nesting_bomb,
    sized_messages,
)
from conformance.testing import values as values_module
from conformance.testing.values import (
    INT64_MIN,
    MAX_CONTAINER_ITEMS,
    MAX_KEY_CHARS,
    UINT64_MAX,
    budgeted_msgpack_values,
    first_difference,
    nesting_levels,
)

#: Draws per sample: what a run of a few hundred examples sees, and cheap
#: (one generation pass with a fixed seed, no shrinking: deterministic).
_SAMPLE_SIZE = 250
_BOMBS = {nesting_bomb("arrays"), nesting_bomb("maps")}


def _leaves(value: Any) -> int:
    if isinstance(value, list):
        return sum(map(_leaves, value))
    if isinstance(value, dict):
        return sum(map(_leaves, value.values()))
    return 1


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


def _nodes(value: Any) -> Any:
    """``value`` and every value nested in it."""
    yield value
    items = value if isinstance(value, list) else value.values() if isinstance(value, dict) else ()
    for item in items:
        yield from _nodes(item)


def _check_bounds(value: Any, levels: int) -> None:
    if isinstance(value, list):
        assert len(value) <= MAX_CONTAINER_ITEMS and levels > 0
        for item in value:
            _check_bounds(item, levels - 1)
    elif isinstance(value, dict):
        assert len(value) <= MAX_CONTAINER_ITEMS and levels > 0
        for key, item in value.items():
            assert type(key) is str and len(key) <= MAX_KEY_CHARS
            _check_bounds(item, levels - 1)
    else:
        assert value is None or type(value) in (bool, int, float, str, bytes), value


@functools.cache
def _sample(strategy: st.SearchStrategy[Any], at: int = 0) -> tuple[Any, ...]:
    drawn: list[Any] = []

    @seed(at)
    @settings(max_examples=_SAMPLE_SIZE, database=None, deadline=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(value: Any) -> None:
        drawn.append(value)

    collect()
    return tuple(drawn)


#: Samples (of :data:`_SAMPLE_SIZE` draws, each from its own seed) :func:`_reaches` tries:
#: a rare shape (the deepest nesting at 20 leaves) was missed by one sample of 250 once,
#: in a fresh-clone CI run under ``pytest -n auto`` (not reproduced alone; why that
#: sample differed is not known).
_REACH_SAMPLES = 4


def _reaches(strategy: st.SearchStrategy[Any], condition: Any) -> Any:
    """The first drawn value meeting ``condition`` (the test fails if none does)."""
    for at in range(_REACH_SAMPLES):
        for value in _sample(strategy, at):
            if condition(value):
                return value
    raise AssertionError(f"{_REACH_SAMPLES} x {_SAMPLE_SIZE} draws of {strategy!r:.80} never "
                         "met the condition")


@pytest.mark.parametrize(("max_leaves", "levels"),
                         [(1, 1), (2, 2), (3, 2), (4, 3), (6, 3), (8, 4), (20, 5)])
def test_nesting_levels_match_st_recursive(max_leaves: int, levels: int) -> None:
    # st.recursive builds one extension per power of two up to max_leaves.
    assert nesting_levels(max_leaves) == levels


@pytest.mark.parametrize("max_leaves", [4, 20])
def test_budgeted_values_stay_within_every_bound(max_leaves: int) -> None:
    for value in _sample(budgeted_msgpack_values(max_leaves=max_leaves)):
        assert _leaves(value) <= max_leaves
        assert _depth(value) <= nesting_levels(max_leaves)
        _check_bounds(value, nesting_levels(max_leaves))
        decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(value))
        assert first_difference(value, decoded) is None


@pytest.mark.parametrize("max_leaves", [4, 20])
def test_the_deepest_nesting_and_the_whole_leaf_budget_are_reachable(max_leaves: int) -> None:
    """By construction, not by sampling: a draw that always takes the biggest choice (the
    deepest shape, full containers, fresh keys) reaches both bounds. At 20 leaves the
    deepest nesting is about 1 draw in 700, which 1,000 sampled draws missed in CI."""
    keys = itertools.count()

    def biggest(strategy: Any) -> Any:
        if strategy is values_module._SIZES:
            return MAX_CONTAINER_ITEMS
        if strategy is values_module._SCALAR_VALUES:
            return None
        if strategy is values_module._KEYS:
            return f"k{next(keys)}"
        return max(strategy.elements)  # a shape: (level, "list" | "map")

    levels = nesting_levels(max_leaves)
    value = values_module._draw_tree(cast(st.DrawFn, biggest), [max_leaves], levels)
    assert _depth(value) == levels
    assert _leaves(value) == max_leaves


@pytest.mark.parametrize("max_leaves", [4, 20])
def test_budgeted_values_reach_full_containers_and_varied_keys(max_leaves: int) -> None:
    values = budgeted_msgpack_values(max_leaves=max_leaves)
    if max_leaves == 4:  # common enough to see in a sample
        levels = nesting_levels(max_leaves)
        assert _depth(_reaches(values, lambda v: _depth(v) == levels)) == levels
    if max_leaves >= MAX_CONTAINER_ITEMS:
        for kind in (list, dict):
            _reaches(values, lambda v, kind=kind: any(
                isinstance(n, kind) and len(n) == MAX_CONTAINER_ITEMS for n in _nodes(v)))
    keys = [k for v in _sample(values) for n in _nodes(v) if isinstance(n, dict) for k in n]
    assert any(len(k) == MAX_KEY_CHARS for k in keys) or max_leaves < 20
    assert any(not k.isascii() for k in keys) and "" in keys


_SCALAR_KINDS: dict[str, Any] = {
    "None": lambda v: v is None,
    "True": lambda v: v is True,
    "False": lambda v: v is False,
    "INT64_MIN": lambda v: type(v) is int and v == INT64_MIN,
    "UINT64_MAX": lambda v: type(v) is int and v == UINT64_MAX,
    "a negative int": lambda v: type(v) is int and INT64_MIN < v < 0,
    "an int over 2**32": lambda v: type(v) is int and 2**32 < v < UINT64_MAX,
    "NaN": lambda v: type(v) is float and math.isnan(v),
    "-0.0": lambda v: type(v) is float and v == 0.0 and math.copysign(1.0, v) < 0,
    "inf": lambda v: v == math.inf,
    "-inf": lambda v: v == -math.inf,
    "a fractional float": lambda v: type(v) is float and math.isfinite(v) and v != int(v),
    "an empty str": lambda v: v == "",
    "a non-ASCII str": lambda v: type(v) is str and not v.isascii(),
    "empty bytes": lambda v: v == b"",
    "non-empty bytes": lambda v: type(v) is bytes and len(v) > 1,
    "an empty list": lambda v: v == [],
    "an empty map": lambda v: v == {},
}


def test_budgeted_values_reach_every_kind_and_edge_value() -> None:
    nodes = [n for v in _sample(budgeted_msgpack_values(max_leaves=4)) for n in _nodes(v)]
    missing = [kind for kind, condition in _SCALAR_KINDS.items()
               if not any(map(condition, nodes))]
    assert not missing, f"never drawn: {missing}"


def test_simplest_values_are_unchanged() -> None:
    quick = settings(max_examples=5, database=None, deadline=None,
                     phases=[Phase.generate, Phase.shrink])
    assert find(budgeted_msgpack_values(max_leaves=4), lambda v: True, settings=quick) is None
    assert find(messages(max_leaves=4), lambda m: True, settings=quick) == {}


def test_messages_keep_their_bounds_and_reach_them() -> None:
    for msg in _sample(messages(max_leaves=4)):
        assert type(msg) is dict and len(msg) <= MAX_MESSAGE_FIELDS
        for name, value in msg.items():
            assert type(name) is str and len(name) <= MAX_FIELD_NAME_CHARS
            assert _leaves(value) <= 4 and _depth(value) <= nesting_levels(4)
    strategy = messages(max_leaves=4)
    assert len(_reaches(strategy, lambda m: len(m) == MAX_MESSAGE_FIELDS)) == MAX_MESSAGE_FIELDS
    _reaches(strategy, lambda m: any(len(k) == MAX_FIELD_NAME_CHARS for k in m))
    _reaches(strategy, lambda m: any(_depth(v) == nesting_levels(4) for v in m.values()))


def test_strategies_are_built_once() -> None:
    assert messages(max_leaves=4) is messages(max_leaves=4)
    assert budgeted_msgpack_values(max_leaves=6) is budgeted_msgpack_values(max_leaves=6)
    assert hostile_frames(bombs=False) is hostile_frames(bombs=False)
    assert nesting_bomb("maps") is nesting_bomb("maps")


def test_sized_messages_draw_both_small_and_large() -> None:
    strategy = sized_messages()
    assert isinstance(_reaches(strategy, lambda m: isinstance(m, LargeMessage)), LargeMessage)
    assert isinstance(_reaches(strategy, lambda m: isinstance(m, dict) and len(m) > 2), dict)


@pytest.mark.parametrize("kind", ["arrays", "maps"])
def test_hostile_payloads_still_carry_nesting_bombs(kind: str) -> None:
    assert _reaches(hostile_payloads(), lambda p: p == nesting_bomb(kind)) == nesting_bomb(kind)
    assert nesting_bomb(kind) in _reaches(hostile_frames(), lambda f: nesting_bomb(kind) in f)


def test_the_cluster_machines_frames_have_every_shape_but_no_bomb() -> None:
    for frames in _sample(_HOSTILE_FRAMES):
        assert not _BOMBS & set(frames) and sum(map(len, frames)) < 4096
        assert all(type(f) is bytes for f in frames) and len(frames) <= 4
    assert _reaches(_HOSTILE_FRAMES, lambda f: f == []) == []
    _reaches(_HOSTILE_FRAMES, lambda f: len(f) == 1 and f[0][-1:] == b"\xc1" and len(f[0]) > 1)
    _reaches(_HOSTILE_FRAMES, lambda f: len(f) == 4)
    _reaches(_HOSTILE_FRAMES, lambda f: len(f) == 2 and f[0] == b"" and len(f[1]) > 1)
    _reaches(_HOSTILE_FRAMES, lambda f: f == [b"\xdf\xff\xff\xff\xff"])
