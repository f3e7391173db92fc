"""MessagePack values for any family: a Hypothesis strategy and a strict comparison.

:func:`msgpack_values` draws everything MessagePack represents: nested maps
(``str`` keys) and lists, unicode and binary strings, integers over the whole
signed and unsigned 64-bit range, floats including ``-0.0``, the infinities
and NaN, booleans and ``None``.
:func:`first_difference` compares a sent value with a received one
strictly: ``True`` is not ``1``, ``1`` is not ``1.0``, ``-0.0`` is not
``0.0``, ``str`` is not ``bytes``, and NaN equals NaN.

:func:`budgeted_msgpack_values` draws the same kinds of values within the
same bounds (container sizes, key lengths, nesting depth, leaf count) several
times cheaper: ``st.recursive`` retries a whole draw whenever it exceeds
``max_leaves`` (most draws, for small budgets), and ``st.dictionaries``
redraws duplicate keys through a filter. The p2p family's messages use it;
the other families keep :func:`msgpack_values`.

:func:`text` is the suite's ``str`` strategy: every family draws strings
through it (see its docstring for why not ``st.text()``).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Final

from hypothesis import strategies as st

__all__ = [
    "INT64_MIN",
    "UINT64_MAX",
    "budgeted_msgpack_values",
    "first_difference",
    "msgpack_values",
    "nesting_levels",
    "text",
]

INT64_MIN = -(2**63)
UINT64_MAX = 2**64 - 1

#: Every code point UTF-8 encodes: all but the surrogates, which are exactly
#: the category Cs.
_UNICODE: Final = st.characters(exclude_categories=["Cs"])


def text(*, min_size: int = 0, max_size: int | None = None) -> st.SearchStrategy[str]:
    """Strings of any code point UTF-8 encodes, as ``st.text()`` draws them.

    The same characters as Hypothesis's default alphabet (``characters(codec=
    "utf-8")``), named by category instead: Hypothesis builds a table for a
    codec on its first use, 3.2 s of CPU on 2 cores in a fresh storage
    directory, where the category table it needs here takes 0.24 s. The
    suite's run builds its tables once, before the first worker starts
    (:mod:`conformance.config.hypothesis_warmup`), so in a fresh checkout that
    time was the run's.
    """
    return st.text(alphabet=_UNICODE, min_size=min_size, max_size=max_size)


def _scalars() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=INT64_MIN, max_value=UINT64_MAX),
        st.sampled_from([0, -1, 2**31, 2**32, 2**63 - 1, INT64_MIN, 2**63, UINT64_MAX]),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, 1.7976931348623157e308]),
        text(max_size=40),
        st.binary(max_size=64),
    )


def msgpack_values(*, max_leaves: int = 20) -> st.SearchStrategy[Any]:
    """Any MessagePack-representable value; maps have ``str`` keys."""
    return st.recursive(
        _scalars(),
        lambda children: st.one_of(
            st.lists(children, max_size=5),
            st.dictionaries(text(max_size=12), children, max_size=5),
        ),
        max_leaves=max_leaves,
    )


#: Items of one drawn list or map, at most (as :func:`msgpack_values`).
MAX_CONTAINER_ITEMS = 5
#: Characters of one map key, at most (as :func:`msgpack_values`).
MAX_KEY_CHARS = 12

_SCALAR_VALUES = _scalars()
_SIZES = st.integers(min_value=0, max_value=MAX_CONTAINER_ITEMS)
_KEYS = text(max_size=MAX_KEY_CHARS)
_SCALAR: Final = (0, "scalar")


def nesting_levels(max_leaves: int) -> int:
    """Container levels a value of at most ``max_leaves`` leaves may nest.

    The depth ``st.recursive(..., max_leaves=max_leaves)`` reaches: one level,
    plus one for every power of two up to ``max_leaves`` (4 -> 3, 20 -> 5).
    """
    if max_leaves < 1:
        raise ValueError(f"max_leaves={max_leaves!r}: expected at least 1")
    levels = 1
    while 2**levels <= max_leaves:
        levels += 1
    return levels


@functools.cache
def _shapes(levels: int) -> st.SearchStrategy[tuple[int, str]]:
    """A node of at most ``levels`` container levels: its own level, chosen uniformly
    as ``st.recursive`` does (a scalar is level 0), and whether a list or a map.

    The scalar is listed twice so each level is equally likely, and first, so
    a node shrinks to a scalar.
    """
    shapes = [_SCALAR, _SCALAR]
    for level in range(1, levels + 1):
        shapes += [(level, "list"), (level, "map")]
    return st.sampled_from(shapes)


def _draw_tree(draw: st.DrawFn, budget: list[int], levels: int) -> Any:
    """One value using at most ``budget[0]`` leaves (scalars), at most ``levels`` deep.

    A container of level ``k`` holds values of level below ``k``, as in
    ``st.recursive``. The leaf budget is shared by the whole value and checked
    before each item is started, so a draw never overruns it and is never
    redrawn: a container whose budget runs out simply ends there. A repeated
    map key keeps its first value (the map is one item smaller) instead of
    drawing another key.
    """
    level, kind = draw(_shapes(levels)) if levels > 0 else _SCALAR
    if level == 0:
        budget[0] -= 1
        return draw(_SCALAR_VALUES)
    size = draw(_SIZES)
    if kind == "list":
        items: list[Any] = []
        while len(items) < size and budget[0] > 0:
            items.append(_draw_tree(draw, budget, level - 1))
        return items
    entries: dict[str, Any] = {}
    for _ in range(size):
        if budget[0] <= 0:
            break
        key = draw(_KEYS)
        entries.setdefault(key, _draw_tree(draw, budget, level - 1))
    return entries


@st.composite
def _budgeted(draw: st.DrawFn, max_leaves: int, levels: int) -> Any:
    return _draw_tree(draw, [max_leaves], levels)


@functools.cache
def budgeted_msgpack_values(*, max_leaves: int = 20) -> st.SearchStrategy[Any]:
    """What :func:`msgpack_values` draws, without its retries.

    The same scalars (every MessagePack type and its edge values), lists and
    ``str``-keyed maps of at most :data:`MAX_CONTAINER_ITEMS` items, keys of
    at most :data:`MAX_KEY_CHARS` characters, nesting up to
    :func:`nesting_levels` deep and at most ``max_leaves`` scalars in all;
    the simplest value is ``None``. Only the distribution differs: one leaf
    budget is spent left to right instead of a whole draw being thrown away
    when it overran. Cached: one strategy object per ``max_leaves``.
    """
    return _budgeted(max_leaves, nesting_levels(max_leaves))


def first_difference(sent: Any, got: Any, path: str = "msg") -> str | None:
    """Where ``got`` differs from ``sent``, as ``"msg['a'][2]: ..."``; ``None`` if equal.

    Strict about types (bool/int/float, str/bytes, list/dict), NaN-aware,
    and tells ``-0.0`` from ``0.0``. Any bytes-like ``got`` may stand for
    ``bytes``.
    """
    if isinstance(sent, bool) or sent is None:
        if got is not sent:
            return f"{path}: sent {sent!r}, got {got!r}"
        return None
    if isinstance(sent, int):
        if type(got) is not int or got != sent:
            return f"{path}: sent int {sent!r}, got {type(got).__name__} {got!r}"
        return None
    if isinstance(sent, float):
        if type(got) is not float:
            return f"{path}: sent float {sent!r}, got {type(got).__name__} {got!r}"
        if math.isnan(sent) and math.isnan(got):
            return None
        if got != sent or math.copysign(1.0, got) != math.copysign(1.0, sent):
            return f"{path}: sent {sent!r}, got {got!r}"
        return None
    if isinstance(sent, str):
        if type(got) is not str or got != sent:
            return f"{path}: sent str {sent!r:.60}, got {type(got).__name__} {got!r:.60}"
        return None
    if isinstance(sent, (bytes, bytearray, memoryview)):
        if not isinstance(got, (bytes, bytearray, memoryview)) or bytes(got) != bytes(sent):
            return f"{path}: sent bytes {bytes(sent)!r:.60}, got {type(got).__name__} {got!r:.60}"
        return None
    if isinstance(sent, (list, tuple)):
        if not isinstance(got, (list, tuple)):
            return f"{path}: sent a list, got {type(got).__name__} {got!r:.60}"
        if len(got) != len(sent):
            return f"{path}: sent {len(sent)} items, got {len(got)}"
        for i, (a, b) in enumerate(zip(sent, got, strict=True)):
            diff = first_difference(a, b, f"{path}[{i}]")
            if diff:
                return diff
        return None
    if isinstance(sent, dict):
        if not isinstance(got, dict):
            return f"{path}: sent a dict, got {type(got).__name__} {got!r:.60}"
        if set(got) != set(sent):
            missing = sorted(map(repr, set(sent) - set(got)))
            extra = sorted(map(repr, set(got) - set(sent)))
            return f"{path}: keys differ (missing {missing}, unexpected {extra})"
        for k in sent:
            diff = first_difference(sent[k], got[k], f"{path}[{k!r}]")
            if diff:
                return diff
        return None
    raise TypeError(f"{path}: {type(sent).__name__} is not a MessagePack value")
