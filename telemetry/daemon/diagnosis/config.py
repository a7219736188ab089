"""DiagnosisConfig: every threshold of the diagnosis rules, and their rate limit.

Loaded with the daemon config's `diagnosis:` key (telemetry.daemon.config), which checks every
value's type and names a bad key; here only what the values may be.
Step-based rules ignore the first `warmup_steps` steps, where compilation, allocator growth and
optimizer-state creation make every signal look alarming.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

# Fields whose value is a fraction in (0, 1).
_FRACTIONS = ("data_loading_ratio_high", "data_loading_ratio_low", "leak_min_increase_fraction",
              "loss_spike_min_rel", "throughput_drop_fraction")
# Fields that are counts >= 1.
_COUNTS = ("gpu_util_min_samples", "leak_window", "loss_spike_window", "loss_spike_min_points",
           "throughput_min_points", "throughput_drop_consecutive", "straggler_consecutive",
           "throttle_consecutive", "rank_missing_steps", "hang_records_kept", "data_loading_consecutive")
_PERCENTS = ("gpu_util_low_percent", "host_memory_percent_high")


@dataclass(kw_only=True, slots=True)
class DiagnosisConfig:
    """Thresholds of the diagnosis rules (names carry units; see each rule's docstring).

    Attributes:
        enabled: run the rules at all.
        min_interval_s: the same rule about the same subject (a rank, a GPU, the run) speaks at
            most once per this many seconds; repeats in between are counted in the next event.
        disabled_rules: rule names to switch off (see telemetry.daemon.diagnosis.RULES).
        log_events: also write each event's message to the "telemetry.daemon.diagnosis" logger (off by
            default: the daemon logs the events it emits itself; on for standalone use).
        warmup_steps: steps before the step-based rules start judging.
        gpu_util_low_percent: mean GPU utilization under this is "low".
        gpu_util_window_s: the mean is over the GPU samples of the last this many seconds.
        gpu_util_min_samples: need at least this many GPU samples in the window.
        data_loading_ratio_high: data loading at least this fraction of the step is "data-bound".
        data_loading_ratio_low: data loading under this fraction rules the input pipeline out.
        data_loading_consecutive: data_bound and launch_bound judge only a data-loading ratio
            past their threshold for this many consecutive log steps (one slow batch is not a
            data-bound run).
        leak_window: judge memory growth over this many consecutive log steps.
        leak_min_growth_gb: growth over the window that counts as a leak.
        leak_min_increase_fraction: fraction of step-over-step changes that must be increases.
        loss_spike_window: the loss baseline is the median of this many previous log steps.
        loss_spike_min_points: need this many previous losses before judging.
        loss_spike_robust_z: spike if the loss exceeds the median by this many robust sigmas
            (1.4826 x median absolute deviation) ...
        loss_spike_min_rel: ... and by at least this fraction of the median.
        throughput_drop_fraction: tokens/s this fraction under the run's median is a drop.
        throughput_drop_robust_z: ... and more than this many robust sigmas of the run's own
            values (1.4826 x their median absolute deviation) under it ...
        throughput_drop_consecutive: ... for this many consecutive log steps ...
        throughput_drop_min_s: ... spanning at least this many seconds of the run (a busy
            machine's scheduler dips a fast run's throughput for half a second at a time).
        throughput_min_points: need this many log steps of history first (the run's own
            spread is not known from a few: a shared machine's load changes over minutes).
        straggler_ratio: slowest / fastest rank step time at or above this is a straggler ...
        straggler_consecutive: ... for this many consecutive log steps, same slowest rank (three
            times as many while the run's usual excess, below, is not known yet).
            With per-phase timings (perf/forward_time, ...) the ratio is of the slowest rank's
            phase time to the other ranks' median in that phase (straggler_view.py) ...
        straggler_min_excess_s: ... and the slowest rank's excess in it at least this (s) ...
        straggler_noise_z: ... and, as the median over those log steps, this many times the run's
            step-time noise (the robust sigma of its step-to-step changes; each step at least
            half of it) and the excess's own step-to-step noise over them: a shared machine's
            swings are not a straggler ...
        straggler_usual_factor: ... and this many times the run's usual excess (the 90th
            percentile of the straggler view's excess over the last 100 log steps outside
            reported stragglers): a rank sharing a core with another process for a while is
            part of a busy machine's usual spread, not a straggler.
        throttle_consecutive: GPU polls in a row with a throttle flag before it is reported.
        throttle_include_power_cap: report the software power cap too (common at full load).
        host_memory_percent_high: host RAM use at or above this percent is "near full".
        rank_silence_s: a rank that has reported before and sent nothing for this long has stopped.
        rank_missing_steps: a rank absent from this many consecutive aggregated steps has stopped.
        hang_enabled: hang and crash forensics (telemetry/daemon/forensics/): a bundle and a
            diagnosis/hang or diagnosis/rank_exited event.
        hang_factor: a hang is no aggregated step for this many times the recent median step time ...
        hang_min_s: ... and at least this many seconds (the floor: a checkpoint or an eval pauses).
        hang_records_kept: the last this many records of each rank go into the bundle.
        hang_py_spy: also run `py-spy dump --native` on each rank, where installed and permitted.
        hang_stacks_wait_s: how long to wait for the ranks' faulthandler dumps.
    """

    enabled: bool = True
    min_interval_s: float = 60.0
    disabled_rules: tuple[str, ...] = ()
    log_events: bool = False
    warmup_steps: int = 10
    gpu_util_low_percent: float = 50.0
    gpu_util_window_s: float = 30.0
    gpu_util_min_samples: int = 3
    data_loading_ratio_high: float = 0.3
    data_loading_ratio_low: float = 0.1
    data_loading_consecutive: int = 5
    leak_window: int = 10
    leak_min_growth_gb: float = 0.5
    leak_min_increase_fraction: float = 0.7
    loss_spike_window: int = 50
    loss_spike_min_points: int = 10
    loss_spike_robust_z: float = 6.0
    loss_spike_min_rel: float = 0.25
    throughput_drop_fraction: float = 0.3
    throughput_drop_robust_z: float = 3.0
    throughput_drop_consecutive: int = 5
    throughput_drop_min_s: float = 10.0
    throughput_min_points: int = 50
    straggler_ratio: float = 1.2
    straggler_consecutive: int = 8
    straggler_min_excess_s: float = 0.01
    straggler_noise_z: float = 3.0
    straggler_usual_factor: float = 3.0
    throttle_consecutive: int = 5
    throttle_include_power_cap: bool = True
    host_memory_percent_high: float = 90.0
    rank_silence_s: float = 300.0
    rank_missing_steps: int = 3
    hang_enabled: bool = True
    hang_factor: float = 10.0
    hang_min_s: float = 60.0
    hang_records_kept: int = 20
    hang_py_spy: bool = True
    hang_stacks_wait_s: float = 2.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):   # the loader checked the types; YAML can still say .nan
            v = getattr(self, f.name)
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError(f"diagnosis.{f.name} must be a finite number, got {v!r}")
        for name in _FRACTIONS:
            if not 0.0 < getattr(self, name) < 1.0:
                raise ValueError(f"diagnosis.{name} must be in (0, 1), got {getattr(self, name)!r}")
        for name in _COUNTS:
            if getattr(self, name) < 1:
                raise ValueError(f"diagnosis.{name} must be >= 1, got {getattr(self, name)!r}")
        for name in _PERCENTS:
            if not 0.0 < getattr(self, name) <= 100.0:
                raise ValueError(f"diagnosis.{name} must be a percentage in (0, 100], got {getattr(self, name)!r}")
        for name in ("min_interval_s", "gpu_util_window_s", "rank_silence_s", "leak_min_growth_gb",
                     "straggler_min_excess_s", "hang_factor", "hang_min_s", "hang_stacks_wait_s",
                     "loss_spike_robust_z", "throughput_drop_robust_z", "straggler_noise_z",
                     "straggler_usual_factor"):
            if getattr(self, name) <= 0:
                raise ValueError(f"diagnosis.{name} must be > 0, got {getattr(self, name)!r}")
        if self.throughput_drop_min_s < 0:
            raise ValueError(f"diagnosis.throughput_drop_min_s must be >= 0, got {self.throughput_drop_min_s!r}")
        if self.warmup_steps < 0:
            raise ValueError(f"diagnosis.warmup_steps must be >= 0, got {self.warmup_steps!r}")
        if self.straggler_ratio <= 1.0:
            raise ValueError(f"diagnosis.straggler_ratio must be > 1, got {self.straggler_ratio!r}")
        if self.data_loading_ratio_low >= self.data_loading_ratio_high:
            raise ValueError("diagnosis.data_loading_ratio_low must be below data_loading_ratio_high")
        if self.loss_spike_min_points > self.loss_spike_window:
            raise ValueError("diagnosis.loss_spike_min_points must be <= loss_spike_window")
        from telemetry.daemon.diagnosis.rules import RULES  # here, not at import: rules import this module

        unknown = sorted(set(self.disabled_rules) - set(RULES))
        if unknown:
            raise ValueError(f"diagnosis.disabled_rules: unknown rule(s) {unknown}; known: {sorted(RULES)}")
