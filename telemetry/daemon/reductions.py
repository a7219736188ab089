"""How metrics combine: across ranks within a step, and across steps within a downsampling window.

The two differ: tokens/s of 8 ranks add up, while tokens/s over 10 steps average. Rules are
matched exactly first, then by prefix ("perf/*"), then by suffix ("*/tokens"); the default is the
mean. The built-in rules are the metric catalogue's (telemetry/shared/catalogue.py); users add or
override them in the daemon config (`metrics:` declarations, `aggregator.reductions`,
`aggregator.window_reductions`).

A reduction is one of mean, sum, max, min, last, or `weighted_mean:<count>`: the mean weighted
by a sibling count, the metric of the same name with its last part replaced by <count>
(`dataset/web/loss` weighted by `dataset/web/tokens`). Per-dataset loss and accuracy are each
rank's mean over its own tokens; weighted by those tokens, the figure across ranks is the one
a single process over all their tokens would report, not a mean of rank means. Where a value
comes without its count, it falls back to the plain mean.

Both are applied to columns (steps.StepBatch across ranks, a window of steps in
downsample.py): per metric, one tuple of values per step, None where a rank (or a step) has
none. Missing values do not count; one value is kept as it is (an int stays an int, -0.0 stays
-0.0); all missing gives None.
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Sequence

from telemetry.shared import catalogue

# Across ranks, within one step, and across steps, within one downsampling window: from the
# metric catalogue (telemetry/shared/catalogue.py), the entries that are not the mean.
RANK_RULES: dict[str, str] = catalogue.rules("across_ranks")
WINDOW_RULES: dict[str, str] = catalogue.rules("over_window")

WEIGHTED_MEAN = "weighted_mean:"


# Each reduces a column cell by cell: a cell is one tuple of values (no None among them, at
# least one), and a single value is kept as it is (sum() would make -0.0 0.0 and True 1).
def mean(column: list) -> list:
    return [xs[0] if len(xs) == 1 else sum(xs) / len(xs) for xs in column]


def total(column: list) -> list:
    return [xs[0] if len(xs) == 1 else sum(xs) for xs in column]


def largest(column: list) -> list:
    return [max(xs) for xs in column]


def smallest(column: list) -> list:
    return [min(xs) for xs in column]


def last(column: list) -> list:
    return [xs[-1] for xs in column]


# The reductions by their config name, and each by a small code: the inner loops (loops.py
# reduce_column and its C twin) take the code, so the C needs no Python function to name one.
MEAN, SUM, MAX, MIN, LAST = range(5)
CODES: dict[str, int] = {"mean": MEAN, "sum": SUM, "max": MAX, "min": MIN, "last": LAST}
FUNCS: dict[str, Callable[[list], list]] = {"mean": mean, "sum": total, "max": largest, "min": smallest, "last": last}
BY_CODE: tuple[Callable[[list], list], ...] = (mean, total, largest, smallest, last)


def reduce_column(column: list, op: int) -> list:
    """One value per cell of a column, reduced by the function of code `op`: None for a cell
    that is None or holds only None; the others' missing values do not count. (The definition
    of loops.reduce_column and its C twin.)"""
    if not 0 <= op < len(BY_CODE):
        raise ValueError(f"reduce_column: no reduction has the code {op}")
    func = BY_CODE[op]
    try:
        # The usual case: every rank has a value. A None (a missing value, or the cell of a
        # step without this metric) makes the functions raise TypeError; `last` checks.
        if op == LAST and any(xs is None or xs[-1] is None for xs in column):
            raise TypeError("a missing last value")
        return func(column)
    except TypeError:
        return [func([present])[0] if present else None for present in map(_present, column)]


def weighted_mean(xs: Sequence, weights: Sequence | None) -> Any:
    """One cell: sum(x * w) / sum(w) over the values whose weight is not 0 (a rank that saw no
    token of a dataset has no loss for it, NaN); the plain mean if a value has no usable weight."""
    present = [x for x in xs if x is not None]
    if len(present) <= 1:
        return present[0] if present else None
    pairs = []
    for i, x in enumerate(xs):
        if x is None:
            continue
        w = weights[i] if weights is not None else None
        if w == 0:
            continue
        if not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
            return mean([present])[0]
        pairs.append((x, w))
    if not pairs:
        return mean([present])[0]
    if len(pairs) == 1:
        return pairs[0][0]
    return sum(x * w for x, w in pairs) / sum(w for _, w in pairs)


class Rule(NamedTuple):
    op: int                       # MEAN, SUM, MAX, MIN or LAST
    count: str | None = None      # weighted_mean: the sibling count's last name part


def parse(spec: str) -> Rule:
    """A rule from its config spelling; ValueError for one that is not a reduction."""
    if spec in CODES:
        return Rule(CODES[spec])
    if spec.startswith(WEIGHTED_MEAN) and spec[len(WEIGHTED_MEAN):] and "/" not in spec[len(WEIGHTED_MEAN):]:
        return Rule(MEAN, spec[len(WEIGHTED_MEAN):])
    raise ValueError(f"{spec!r}: expected one of {', '.join(FUNCS)} or weighted_mean:<count>")


def sibling(name: str, count: str) -> str:
    """`dataset/web/loss` with count `tokens` -> `dataset/web/tokens`."""
    head, _, _ = name.rpartition("/")
    return f"{head}/{count}" if head else count


class Reducer:
    """Resolves a metric name to its rule once, then from a cache; reduces columns."""

    def __init__(self, rules: dict[str, str], overrides: dict[str, str] | None = None) -> None:
        merged = {k: parse(v) for k, v in {**rules, **(overrides or {})}.items()}
        self._exact = {k: r for k, r in merged.items() if "*" not in k}
        self._prefix = [(k[:-1], r) for k, r in merged.items() if k.endswith("*")]
        self._suffix = [(k[1:], r) for k, r in merged.items() if k.startswith("*")]
        self._cache: dict[str, Rule] = {}

    def rule(self, name: str) -> Rule:
        rule = self._cache.get(name)
        if rule is None:
            rule = self._exact.get(name)
            if rule is None:
                rule = next((r for p, r in self._prefix if name.startswith(p)), None)
            if rule is None:
                rule = next((r for s, r in self._suffix if name.endswith(s)), Rule(MEAN))
            if len(self._cache) > 65536:      # bounded: names are few in any real run
                self._cache.clear()
            self._cache[name] = rule
        return rule

    def reduce_columns(self, columns: dict[str, list], reduce: Callable[[list, int], list] = reduce_column
                       ) -> dict[str, list]:
        """Each column reduced cell by cell: name -> one reduced value per cell (None for a cell
        that is None or holds only None). `reduce`: reduce_column or its C twin (hotpath.loops)."""
        out = {}
        for name, column in columns.items():
            op, count = self.rule(name)
            weights = columns.get(sibling(name, count)) if count is not None else None
            if weights is not None:
                out[name] = [None if xs is None else weighted_mean(xs, ws) for xs, ws in zip(column, weights)]
            else:
                out[name] = reduce(column, op)
        return out


def _present(xs: Sequence | None) -> list:
    return [] if xs is None else [x for x in xs if x is not None]
