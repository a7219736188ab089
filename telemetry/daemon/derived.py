"""Derived metrics for an aggregated step: throughput from the ranks' counts, MFU from the model.

    perf/steps_per_second    1 / slowest rank's step time
    perf/tokens_per_second   sum of the ranks' own figures, else Σ tokens / slowest step time
    perf/mfu, perf/mfu_percent, perf/hfu   from telemetry.mfu (analytic FLOPs, never a profiler)

The model comes from the ranks' hello records (info["model"], info["device_name"]).
"""
from __future__ import annotations

import logging

from telemetry.daemon.aggregator import StepAccumulator
from telemetry.daemon.config import MfuConfig

log = logging.getLogger("telemetry.derived")


class Derived:
    def __init__(self, cfg: MfuConfig) -> None:
        self.cfg = cfg
        self.estimator = None
        self._warned = False

    def on_hello(self, info: dict) -> None:
        model = info.get("model")
        if not isinstance(model, dict) or self.estimator is not None:
            return
        try:
            from telemetry.mfu import MfuEstimator
        except ImportError:
            return
        try:
            self.estimator = MfuEstimator.from_hello(info, peak_override=self.cfg.peak_flops or None,
                                                     dtype_override=self.cfg.dtype or None,
                                                     halve_causal=self.cfg.halve_causal)
        except (ValueError, KeyError, TypeError) as exc:
            if not self._warned:
                log.warning("no MFU for this run: %s", exc)
                self._warned = True

    def apply(self, acc: StepAccumulator, values: dict, world_size: int) -> None:
        self.apply_many([acc], [values], world_size)

    def apply_many(self, accs: list[StepAccumulator], values: list[dict], world_size: int) -> None:
        """Add the derived metrics to each closed step's values (in place)."""
        mfu_accs, mfu_values = [], []
        for acc, v in zip(accs, values):
            st_max = v.get("perf/step_time_max") or v.get("perf/step_time")
            if not st_max or st_max <= 0:
                continue
            v["perf/steps_per_second"] = 1.0 / st_max
            if "perf/tokens_per_second" not in v and "perf/tokens" in v:
                v["perf/tokens_per_second"] = v["perf/tokens"] / st_max
            if "perf/samples_per_second" not in v and "perf/samples" in v:
                v["perf/samples_per_second"] = v["perf/samples"] / st_max
            if acc.cols is not None and acc.cols[1] is not None:
                mfu_accs.append(acc.cols)
                mfu_values.append(v)
        if self.estimator is not None and mfu_accs:
            _ranks, tokens, doc_sq, step_times = zip(*mfu_accs)
            for v, m in zip(mfu_values, self.estimator.step_metrics_many(tokens, doc_sq, step_times, world_size)):
                v.update(m)
