"""Derived metrics: what the daemon computes for each closed step, one list of functions.

DERIVATIONS runs in its order on each batch of closed steps: every function reads the batch
(steps.StepBatch: the ranks' values as columns, rank i's at index i) and the values the
aggregator reduced from it, and writes into each step's values the names its Derivation declares.
Each of those names has its entry in the metric catalogue (telemetry/shared/catalogue.py: unit,
kind, how it reduces at a head and over a window, group, doc; tests/test_catalogue.py checks).

    step time view       perf/step_time_max, perf/step_time_min, perf/slowest_rank (straggler_view.py)
    phase maxima         perf/<phase>_time_max, a node daemon's only (it forwards): its slowest rank
                         in each phase, which its head's phase straggler view compares (straggler_view.py)
    phase straggler      perf/straggler_rank, _excess_s, _median_s, _phase_index (straggler_view.py)
    throughput           perf/steps_per_second; perf/tokens_per_second and perf/samples_per_second
                         where the ranks did not send them (Σ counts / the slowest rank's step time)
    MFU                  perf/mfu, perf/mfu_percent, perf/hfu, perf/model_flops_per_second
                         (telemetry.daemon.mfu: analytic FLOPs, never a profiler; the model from
                         the ranks' hello records: info["model"], info["device_name"])

Adding one: a function and its Derivation appended here, and a catalogue entry per name it
writes. A failing derivation costs its own names for that batch (counted by the daemon as a
"derived" failure), never the steps.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from telemetry.daemon import hotpath
from telemetry.daemon.config import MfuConfig
from telemetry.daemon.steps import ATTN_DOC_LEN_SQ, STEP_TIME, TOKENS, StepBatch
from telemetry.daemon.straggler_view import (OUTPUT_KEYS, PHASE_MAX_METRICS, STEP_TIME_KEYS, add_phase_maxima,
                                             add_phase_straggler_view, add_step_time_view)
from telemetry.shared.numbers import is_number, positive_finite

log = logging.getLogger("telemetry.derived")


@dataclass(frozen=True, slots=True)
class Derivation:
    name: str
    outputs: tuple[str, ...]                                  # catalogue names it writes
    fn: Callable[[StepBatch, list[dict], "Derived"], None]    # (batch, each step's values, the daemon's state)


def _step_time_view(batch: StepBatch, values: list[dict], d: "Derived") -> None:
    add_step_time_view(batch, values, d.loops.reduce_column)


def _phase_maxima(batch: StepBatch, values: list[dict], d: "Derived") -> None:
    if d.forwards:
        add_phase_maxima(batch, values, d.loops.reduce_column)


def _phase_straggler(batch: StepBatch, values: list[dict], d: "Derived") -> None:
    add_phase_straggler_view(batch, values, d.loops)


# (count, rate): the rate is derived from the count where the ranks did not send it.
_RATES = (("perf/tokens", "perf/tokens_per_second"), ("perf/samples", "perf/samples_per_second"))


def add_throughput(v: dict) -> None:
    """perf/steps_per_second, tokens/s and samples/s where the ranks did not send them, from a
    step's reduced values: a synchronous step runs at the pace of its slowest rank. What a rank
    sent is its own (a W&B script's perf/steps_per_second was replaced by 1/step_time)."""
    st_max = positive_finite(v.get("perf/step_time_max") or v.get("perf/step_time"))
    if st_max is None:
        return
    if "perf/steps_per_second" not in v:
        v["perf/steps_per_second"] = 1.0 / st_max
    for count, rate in _RATES:
        if rate not in v and is_number(v.get(count)):
            v[rate] = v[count] / st_max


def _throughput(batch: StepBatch, values: list[dict], d: "Derived") -> None:
    for v in values:
        add_throughput(v)


def _mfu(batch: StepBatch, values: list[dict], d: "Derived") -> None:
    if d.estimator is None:
        return
    per_step = d.estimator.step_metrics_batch(batch.column(TOKENS), batch.column(ATTN_DOC_LEN_SQ),
                                              batch.column(STEP_TIME), d.world_size, d.loops.rate_sums)
    for v, metrics in zip(values, per_step):
        v.update(metrics)


DERIVATIONS: tuple[Derivation, ...] = (
    Derivation("step time view", STEP_TIME_KEYS, _step_time_view),
    Derivation("phase maxima", PHASE_MAX_METRICS, _phase_maxima),
    Derivation("phase straggler", OUTPUT_KEYS, _phase_straggler),
    Derivation("throughput", ("perf/steps_per_second", "perf/tokens_per_second", "perf/samples_per_second"),
               _throughput),
    Derivation("MFU", ("perf/mfu", "perf/mfu_percent", "perf/hfu", "perf/model_flops_per_second"), _mfu),
)


# Every name a derivation may write: in a W&B script's own run, those the ranks never sent are the
# daemon's series (W&B's system metrics), not the script's history (sinks/wandb_sink.py).
DERIVED_KEYS = frozenset(k for dv in DERIVATIONS for k in dv.outputs)


class Derived:
    """Runs DERIVATIONS (or the ones given) on the daemon's closed steps, with what they need:
    the inner loops, the MFU estimator from the ranks' hellos, the world size, whether this
    daemon forwards to a head (`forwards`: a node daemon, or a group head)."""

    def __init__(self, cfg: MfuConfig, derivations: tuple[Derivation, ...] | None = None) -> None:
        self.cfg = cfg
        self.derivations = DERIVATIONS if derivations is None else derivations
        self.estimator = None
        self.world_size = 0
        self.forwards = False
        self._warned = False
        self.loops = hotpath.loops      # loops.py or its C twin: the views' and MFU's loops

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

    def apply(self, batch: StepBatch, values: list[dict], world_size: int) -> list[tuple[str, Exception]]:
        """Add the derived metrics to each closed step's values (in place), in DERIVATIONS'
        order; return the derivations that failed, as ("name (its outputs)", exception): their
        names are left out of this batch."""
        self.world_size = world_size
        failed = []
        for dv in self.derivations:
            try:
                dv.fn(batch, values, self)
            except Exception as exc:
                failed.append((f"{dv.name} ({', '.join(dv.outputs)})", exc))
        return failed
