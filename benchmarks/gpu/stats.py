"""Small statistics for the benchmark: percentiles and a bootstrap CI of a ratio of medians."""
from __future__ import annotations

import random
import statistics


def pct(xs: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank; NaN for no data."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def ratio_ci(base: list[float], other: list[float], num_resamples: int = 2000,
             level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap CI of median(other) / median(base), resampling steps in each.

    Steps are not independent (a slow phase spans several), so this understates the spread a
    little; the per-round ratios in the report show the drift between processes.
    """
    if not base or not other:
        return float("nan"), float("nan")
    rng = random.Random(seed)
    ratios = []
    for _ in range(num_resamples):
        b = statistics.median(rng.choices(base, k=len(base)))
        o = statistics.median(rng.choices(other, k=len(other)))
        ratios.append(o / b)
    tail = (1 - level) / 2
    return pct(ratios, tail), pct(ratios, 1 - tail)
