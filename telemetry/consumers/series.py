"""Series for display: one value per x, gaps where the daemon was down, min/max downsampling.

Shared by the dashboard and the report. Downsampling is for drawing only: a chart `width`
pixels wide cannot show more than a minimum and a maximum per pixel column, so each column's
bucket keeps its first and last point, its minimum and its maximum (a one-step loss spike in a
100k-step run stays visible). The data itself (metrics.jsonl) is never thinned.
"""
from __future__ import annotations

import numpy as np

# A time series (GPU, host, daemon records: one every poll interval) is broken where two
# records are further apart than GAP_FACTOR times its usual interval, and at least GAP_MIN_S:
# a line drawn straight across a daemon's downtime would show values nobody measured.
GAP_FACTOR = 5.0
GAP_MIN_S = 5.0


def last_per_x(xs: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted by x, one point per x, the later record winning (a resumed run logs steps again)."""
    if len(xs) < 2 or bool(np.all(xs[1:] > xs[:-1])):
        return xs, ys
    order = np.argsort(xs, kind="stable")
    xs, ys = xs[order], ys[order]
    last = np.r_[xs[1:] != xs[:-1], True]
    return xs[last], ys[last]


def gap_threshold(xs: np.ndarray) -> float | None:
    """The x distance beyond which two neighbours of a time series are a gap (None: too few points)."""
    if len(xs) < 3:
        return None
    return max(GAP_MIN_S, GAP_FACTOR * float(np.median(np.diff(xs))))


def insert_gaps(xs: np.ndarray, ys: np.ndarray, threshold: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A NaN point between neighbours further apart than `threshold` (default gap_threshold)."""
    threshold = gap_threshold(xs) if threshold is None else threshold
    if threshold is None:
        return xs, ys
    at = np.flatnonzero(np.diff(xs) > threshold) + 1
    if not len(at):
        return xs, ys
    mid = (xs[at - 1] + xs[at]) / 2
    return np.insert(xs, at, mid), np.insert(ys.astype(float), at, np.nan)


def minmax_downsample(xs: np.ndarray, ys: np.ndarray, num_buckets: int,
                      x_range: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """At most ~4 points per bucket of equal x width: first, last, min, max (and a NaN gap).

    xs must be sorted. Series of at most 2 * num_buckets points come back as they are. The
    buckets span the data, or `x_range` (so that downsampling again keeps to the same columns).
    """
    n = len(xs)
    if n <= 2 * max(1, num_buckets):
        return xs, ys
    lo, hi = (float(xs[0]), float(xs[-1])) if x_range is None else x_range
    span = hi - lo
    if span > 0:
        buckets = np.clip(((xs - lo) * (num_buckets / span)).astype(np.int64), 0, num_buckets - 1)
    else:
        buckets = np.zeros(n, dtype=np.int64)
    starts = np.flatnonzero(np.r_[True, buckets[1:] != buckets[:-1]])
    ends = np.r_[starts[1:], n] - 1
    counts = ends - starts + 1
    idx = np.arange(n)
    none = n  # "no such point in this bucket"
    with np.errstate(invalid="ignore"):
        mins = np.fmin.reduceat(ys, starts)   # NaN only where the whole bucket is NaN
        maxs = np.fmax.reduceat(ys, starts)
    at_min = np.minimum.reduceat(np.where(ys == np.repeat(mins, counts), idx, none), starts)
    at_max = np.minimum.reduceat(np.where(ys == np.repeat(maxs, counts), idx, none), starts)
    at_nan = np.minimum.reduceat(np.where(np.isnan(ys), idx, none), starts)
    keep = np.concatenate([starts, ends, at_min, at_max, at_nan])
    keep = np.unique(keep[keep < none])
    return xs[keep], ys[keep]
