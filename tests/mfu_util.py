"""MFU of one step from a map of ranks, the form the tests state their cases in; the daemon
computes it from a batch's columns (MfuEstimator.step_metrics_batch / step_metrics_columns)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def rank_row(values: Any) -> tuple[Any, Any, Any]:
    """(tokens, attn_doc_len_sq, step_time_s) from a values map or a 3-sequence; Nones if neither."""
    if isinstance(values, Mapping):
        return values.get("perf/tokens"), values.get("perf/attn_doc_len_sq"), values.get("perf/step_time")
    try:
        tokens, doc_sq, step_time_s = tuple(values)[:3]
    except (TypeError, ValueError):
        return None, None, None
    return tokens, doc_sq, step_time_s


def step_metrics(est, per_rank: Mapping[Any, Any], world_size: int | None = None) -> dict[str, float]:
    """est.step_metrics_columns over `per_rank` (rank -> values map or (tokens, doc_sq, step_time))."""
    if est.shape is None or not per_rank:
        return {}
    tokens, doc_sq, step_times = zip(*map(rank_row, per_rank.values()))
    return est.step_metrics_columns(tokens, doc_sq, step_times, world_size)
