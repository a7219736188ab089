"""Derived metrics for an aggregated step: throughput from the ranks' counts, MFU from the model.

    perf/steps_per_second    1 / slowest rank's step time
    perf/tokens_per_second   sum of the ranks' own figures, else Σ tokens / slowest step time
    perf/mfu, perf/mfu_percent, perf/hfu   from telemetry.daemon.mfu (analytic FLOPs, never a profiler)

Both read a steps.StepBatch (the columns) and the values the aggregator reduced from it.

The model comes from the ranks' hello records (info["model"], info["device_name"]).
"""
from __future__ import annotations

import logging

from telemetry.daemon import hotpath
from telemetry.daemon.config import MfuConfig
from telemetry.daemon.steps import ATTN_DOC_LEN_SQ, STEP_TIME, TOKENS, StepBatch

log = logging.getLogger("telemetry.derived")


class Derived:
    def __init__(self, cfg: MfuConfig) -> None:
        self.cfg = cfg
        self.estimator = None
        self._warned = False
        self.loops = hotpath.loops      # loops.py or its C twin: MFU's sums over the ranks

    def on_hello(self, info: dict) -> None:
        model = info.get("model")
        if not isinstance(model, dict) or self.estimator is not None:
            return
        try:
            from telemetry.daemon.mfu import MfuEstimator
        except ImportError:
            return
        try:
            self.estimator = MfuEstimator.from_hello(info, peak_override=self.cfg.peak_flops or None,
                                                     dtype_override=self.cfg.dtype or None,
                                                     halve_causal=self.cfg.halve_causal)
        except Exception as exc:     # a hello is input from the network: no MFU, never a crash
            if not self._warned:
                log.warning("no MFU for this run: %s", exc)
                self._warned = True

    def apply(self, batch: StepBatch, values: list[dict], world_size: int) -> None:
        """Add the derived metrics to each closed step's values (in place): throughput from its
        reduced values, MFU from the ranks' own step times and token counts (the batch's
        columns: rank i's values at index i)."""
        for v in values:
            add_throughput(v)
        if self.estimator is None:
            return
        per_step = self.estimator.step_metrics_batch(batch.column(TOKENS), batch.column(ATTN_DOC_LEN_SQ),
                                                     batch.column(STEP_TIME), world_size, self.loops.rate_sums)
        for v, metrics in zip(values, per_step):
            v.update(metrics)


# (count, rate): the rate is derived from the count where the ranks did not send it.
_RATES = (("perf/tokens", "perf/tokens_per_second"), ("perf/samples", "perf/samples_per_second"))


def add_throughput(v: dict) -> None:
    """perf/steps_per_second, and tokens/s and samples/s where the ranks did not send them, from
    a step's reduced values: a synchronous step runs at the pace of its slowest rank."""
    st_max = v.get("perf/step_time_max") or v.get("perf/step_time")
    if not isinstance(st_max, (int, float)) or st_max <= 0:
        return
    v["perf/steps_per_second"] = 1.0 / st_max
    for count, rate in _RATES:
        if rate not in v and isinstance(v.get(count), (int, float)):
            v[rate] = v[count] / st_max
