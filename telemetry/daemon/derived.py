"""Derived metrics for an aggregated step: throughput from the ranks' counts, MFU from the model.

    perf/steps_per_second    1 / slowest rank's step time
    perf/tokens_per_second   sum of the ranks' own figures, else Σ tokens / slowest step time
    perf/mfu, perf/mfu_percent, perf/hfu   from telemetry.mfu (analytic FLOPs, never a profiler)

The model comes from the ranks' hello records (info["model"], info["device_name"]).
"""
from __future__ import annotations

import logging
from itertools import repeat
from operator import setitem, truediv

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
        """Add the derived metrics to each closed step's values (in place).

        A batch of steps whose step times are all positive numbers and which agree on which of
        perf/tokens(_per_second) and perf/samples(_per_second) they logged (a backlog from one
        training loop) is done a metric at a time over the batch (maps over C functions);
        anything else step by step."""
        st_max = list(map(dict.get, values, repeat("perf/step_time_max")))
        try:
            batched = 0 < min(st_max) and max(st_max) < _INF
        except TypeError:        # a step without a step time (None), or a step time not a number
            batched = False
        todo = []
        for count, rate in _RATES if batched else ():
            with_count = sum(map(dict.__contains__, values, repeat(count)))
            with_rate = sum(map(dict.__contains__, values, repeat(rate)))
            if with_rate == 0 and with_count == len(values):
                todo.append((count, rate))
            elif not (with_count == 0 or with_rate == len(values)):
                batched = False           # some steps have the rate already, some not: one at a time
        if batched:
            _put(values, "perf/steps_per_second", map(truediv, repeat(1.0), st_max))
            for count, rate in todo:
                _put(values, rate, map(truediv, map(dict.get, values, repeat(count)), st_max))
        else:
            for v in values:
                _throughput(v)
        if self.estimator is None:
            return
        # Steps whose ranks logged step times and tokens.
        todo = [(acc.cols, v) for acc, v in zip(accs, values) if acc.cols is not None and acc.cols[0] is not None]
        if todo:
            cols, values = zip(*todo)
            tokens, doc_sq, step_times = zip(*cols)
            list(map(dict.update, values, self.estimator.step_metrics_many(tokens, doc_sq, step_times, world_size)))


_INF = float("inf")
_RATES = (("perf/tokens", "perf/tokens_per_second"), ("perf/samples", "perf/samples_per_second"))


def _put(values: list[dict], key: str, column) -> None:
    list(map(setitem, values, repeat(key), column))


def _throughput(v: dict) -> None:
    st_max = v.get("perf/step_time_max") or v.get("perf/step_time")
    if not st_max or st_max <= 0:
        return
    v["perf/steps_per_second"] = 1.0 / st_max
    for count, rate in _RATES:
        if rate not in v and count in v:
            v[rate] = v[count] / st_max
