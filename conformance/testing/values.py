"""MessagePack values for any family: a Hypothesis strategy and a strict comparison.

:func:`msgpack_values` draws everything MessagePack represents: nested maps
(``str`` keys) and lists, unicode and binary strings, integers over the whole
signed and unsigned 64-bit range, floats including ``-0.0``, the infinities
and NaN, booleans and ``None``.
:func:`first_difference` compares a sent value with a received one
strictly: ``True`` is not ``1``, ``1`` is not ``1.0``, ``-0.0`` is not
``0.0``, ``str`` is not ``bytes``, and NaN equals NaN.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

__all__ = ["INT64_MIN", "UINT64_MAX", "first_difference", "msgpack_values"]

INT64_MIN = -(2**63)
UINT64_MAX = 2**64 - 1


def _scalars() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=INT64_MIN, max_value=UINT64_MAX),
        st.sampled_from([0, -1, 2**31, 2**32, 2**63 - 1, INT64_MIN, 2**63, UINT64_MAX]),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, 1.7976931348623157e308]),
        st.text(max_size=40),
        st.binary(max_size=64),
    )


def msgpack_values(*, max_leaves: int = 20) -> st.SearchStrategy[Any]:
    """Any MessagePack-representable value; maps have ``str`` keys."""
    return st.recursive(
        _scalars(),
        lambda children: st.one_of(
            st.lists(children, max_size=5),
            st.dictionaries(st.text(max_size=12), children, max_size=5),
        ),
        max_leaves=max_leaves,
    )


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
