"""Small statistics helpers shared by the benchmark sections."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Spread:
    """min / median / max of repeated measurements."""

    min: float
    median: float
    max: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            raise ValueError("no measurements")
        return cls(min(values), statistics.median(values), max(values), len(values))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def fmt(self, unit: str = "", digits: int = 1) -> str:
        return f"{self.median:,.{digits}f}{unit} ({self.min:,.{digits}f}-{self.max:,.{digits}f})"


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values, ``q`` in [0, 100]."""
    if not sorted_values:
        raise ValueError("no values")
    rank = max(0, min(len(sorted_values) - 1, round(q / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[rank]
