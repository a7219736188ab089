"""GPU utilization read against the data-loading share of the step: is the GPU waiting, and on what?

The GPU samples carry the daemon's clock (its NVML poller's time.time()); a metrics record's "t"
is its ranks' clock, which may be minutes off. The window of samples a step is judged against
therefore ends at the daemon's clock when the rule takes the step, never at the record's t (a
rank 600 s ahead emptied the window and silenced both rules).
"""
from __future__ import annotations

import time
from collections import deque
from typing import Callable

from telemetry.daemon.diagnosis.config import DiagnosisConfig
from telemetry.daemon.diagnosis.rules.base import Finding, Rule, finite, step_of, t_of


class GpuUtilWindow:
    """GPU utilization samples (all GPUs seen) of the last window_s seconds."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, float]] = deque()

    def add(self, record: dict) -> None:
        util = finite(record.get("values"), "gpu/util_percent")
        if util is None:
            return
        t = t_of(record)
        self._samples.append((t, util))
        self._prune(t)

    def _prune(self, now: float) -> None:
        while self._samples and self._samples[0][0] < now - self.window_s:
            self._samples.popleft()

    def mean(self, now: float) -> tuple[float, int]:
        """(mean utilization %, number of samples) over [now - window_s, now]."""
        self._prune(now)
        vals = [u for _, u in self._samples]
        return (sum(vals) / len(vals), len(vals)) if vals else (0.0, 0)


class _LowUtilRule(Rule):
    kinds = frozenset({"gpu", "metrics"})
    aggregated_only = after_warmup = True

    def __init__(self, cfg: DiagnosisConfig, wall: Callable[[], float] = time.time) -> None:
        super().__init__(cfg)
        self.wall = wall            # the daemon's clock, the GPU samples' clock
        self.window = GpuUtilWindow(cfg.gpu_util_window_s)
        self.gpu_seen = False       # any GPU sample at all: without one, utilization is unknown
        self.num_matching = 0       # log steps in a row whose data-loading ratio matches

    def consume(self, record: dict) -> list[Finding]:
        if record.get("kind") == "gpu":
            self.gpu_seen = True
            self.window.add(record)
            return []
        ratio = finite(record.get("values"), "perf/data_loading_ratio")
        if ratio is None:
            return []
        # A run of log steps, not one: a single slow batch (a page fault, another process taking
        # the CPU for a moment) is noise, not an input pipeline too slow for the run.
        self.num_matching = self.num_matching + 1 if self._ratio_matches(ratio) else 0
        if self.num_matching < self.cfg.data_loading_consecutive:
            return []
        t = t_of(record)
        if not self.gpu_seen:
            return self._without_gpu(ratio, record)
        util, n = self.window.mean(self.wall())
        if n < self.cfg.gpu_util_min_samples or util >= self.cfg.gpu_util_low_percent:
            return []
        data = {"gpu_util_percent": round(util, 1), "data_loading_ratio": round(ratio, 3),
                "step": step_of(record), "window_s": self.cfg.gpu_util_window_s}
        return [Finding("run", self._message(util, ratio, step_of(record)), t, data=data)]

    def _without_gpu(self, ratio: float, record: dict) -> list[Finding]:
        """No GPU samples (a CPU run, or GPU polling off): judge by the data-loading ratio alone."""
        return []

    def _ratio_matches(self, ratio: float) -> bool:
        raise NotImplementedError

    def _message(self, util: float, ratio: float, step: int | None) -> str:
        raise NotImplementedError


class DataBound(_LowUtilRule):
    """GPU utilization under gpu_util_low_percent while data loading is >= data_loading_ratio_high
    for data_loading_consecutive log steps in a row; with no GPU samples at all (a CPU run, GPU
    polling off), the data-loading ratio alone."""

    name = "data_bound"

    def _without_gpu(self, ratio: float, record: dict) -> list[Finding]:
        step = step_of(record)
        msg = (f"data-bound at step {step}: data loading takes {ratio:.0%} of the step, at least "
               f"{self.cfg.data_loading_ratio_high:.0%} for {self.num_matching} log steps in a row (no GPU "
               f"utilization known); the input pipeline is the bottleneck (more DataLoader workers, pin_memory, "
               f"prefetching, pre-tokenized data)")
        return [Finding("run", msg, t_of(record), data={
            "gpu_util_percent": None, "data_loading_ratio": round(ratio, 3), "step": step,
            "num_log_steps": self.num_matching})]

    def _ratio_matches(self, ratio: float) -> bool:
        return ratio >= self.cfg.data_loading_ratio_high

    def _message(self, util: float, ratio: float, step: int | None) -> str:
        return (f"data-bound at step {step}: GPU utilization averages {util:.0f}% over the last "
                f"{self.cfg.gpu_util_window_s:.0f} s while data loading takes {ratio:.0%} of the step; "
                f"the input pipeline is the bottleneck (more DataLoader workers, pin_memory, prefetching, "
                f"pre-tokenized data)")


class LaunchBound(_LowUtilRule):
    """GPU utilization under gpu_util_low_percent with data loading < data_loading_ratio_low for
    data_loading_consecutive log steps in a row."""

    name = "launch_bound"

    def _ratio_matches(self, ratio: float) -> bool:
        return ratio < self.cfg.data_loading_ratio_low

    def _message(self, util: float, ratio: float, step: int | None) -> str:
        return (f"GPU underused at step {step}: utilization averages {util:.0f}% over the last "
                f"{self.cfg.gpu_util_window_s:.0f} s although data loading is only {ratio:.0%} of the step; "
                f"the GPU waits on the CPU side (kernel-launch overhead, Python work, host-device syncs "
                f"such as .item()) or the batch is too small (larger micro-batch, torch.compile / CUDA graphs)")
