"""How metrics combine: across ranks within a step, and across steps within a downsampling window.

The two differ: tokens/s of 8 ranks add up, while tokens/s over 10 steps average. Rules are
matched exactly first, then by prefix ("perf/*"), then by suffix ("*/tokens"); the default is the
mean. Users add or override rules in the daemon config (`aggregator.reductions`).
"""
from __future__ import annotations

from typing import Callable, Sequence

# Across ranks, within one step.
RANK_RULES: dict[str, str] = {
    "perf/tokens": "sum",
    "perf/samples": "sum",
    "perf/tokens_per_second": "sum",
    "perf/samples_per_second": "sum",
    "perf/attn_doc_len_sq": "sum",
    "*/tokens": "sum",
    "*/samples": "sum",
    "*_count": "sum",
    "memory/num_ooms": "sum",
    "memory/alloc_retries": "sum",
    "perf/step_time": "max",           # a synchronous step is as slow as its slowest rank
    "memory/max_allocated_gb": "max",
    "*_max": "max",
    "*_min": "min",
    "train/step": "max",
}

# Across steps, within one downsampling window.
WINDOW_RULES: dict[str, str] = {
    "perf/tokens": "sum",
    "perf/samples": "sum",
    "perf/attn_doc_len_sq": "sum",
    "*/tokens": "sum",
    "*/samples": "sum",
    "*_count": "sum",
    "memory/num_ooms": "max",          # cumulative counters: the latest is the total
    "memory/alloc_retries": "max",
    "memory/max_allocated_gb": "max",
    "*_max": "max",
    "*_min": "min",
    "perf/slowest_rank": "last",
    "train/epoch": "last",
}


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _last(xs: Sequence[float]) -> float:
    return xs[-1]


FUNCS: dict[str, Callable[[Sequence[float]], float]] = {
    "mean": _mean, "sum": sum, "max": max, "min": min, "last": _last,
}


class Reducer:
    """Resolves a metric name to its reduction once, then from a cache."""

    def __init__(self, rules: dict[str, str], overrides: dict[str, str] | None = None) -> None:
        merged = {**rules, **(overrides or {})}
        self._exact = {k: FUNCS[v] for k, v in merged.items() if "*" not in k}
        self._prefix = [(k[:-1], FUNCS[v]) for k, v in merged.items() if k.endswith("*")]
        self._suffix = [(k[1:], FUNCS[v]) for k, v in merged.items() if k.startswith("*")]
        self._cache: dict[str, Callable] = {}

    def func(self, name: str) -> Callable[[Sequence[float]], float]:
        f = self._cache.get(name)
        if f is None:
            f = self._exact.get(name)
            if f is None:
                f = next((g for p, g in self._prefix if name.startswith(p)), None)
            if f is None:
                f = next((g for s, g in self._suffix if name.endswith(s)), _mean)
            self._cache[name] = f
        return f

    def reduce(self, values: dict[str, list]) -> dict[str, float]:
        func = self.func
        out = {}
        for k, xs in values.items():
            if len(xs) == 1:
                out[k] = xs[0]
            else:
                try:
                    out[k] = func(k)(xs)
                except TypeError:   # a non-number slipped in; keep the latest
                    out[k] = xs[-1]
        return out
