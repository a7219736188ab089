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
        st_max = values.get("perf/step_time_max") or values.get("perf/step_time")
        if not st_max or st_max <= 0:
            return
        values["perf/steps_per_second"] = 1.0 / st_max
        if "perf/tokens_per_second" not in values and "perf/tokens" in values:
            values["perf/tokens_per_second"] = values["perf/tokens"] / st_max
        if "perf/samples_per_second" not in values and "perf/samples" in values:
            values["perf/samples_per_second"] = values["perf/samples"] / st_max
        if self.estimator is not None and acc.cols is not None:
            _ranks, tokens, doc_sq, step_times = acc.cols
            if tokens is not None:
                values.update(self.estimator.step_metrics_columns(tokens, doc_sq, step_times, world_size))
