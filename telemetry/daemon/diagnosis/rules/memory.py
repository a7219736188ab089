"""Rules on device memory as the ranks report it: a growth trend (leak), allocator retries, OOMs."""
from __future__ import annotations

from collections import deque

from telemetry.daemon.diagnosis.config import DiagnosisConfig
from telemetry.daemon.diagnosis.rules.base import Finding, Rule, finite, step_of, t_of

# Changes smaller than this between two log steps are noise, not growth.
GROWTH_EPS_GB = 1e-3


def _subject(record: dict) -> tuple[str, int | None]:
    rank = record.get("rank")
    return (f"rank{rank}", rank) if rank is not None else ("all", None)


class MemoryLeak(Rule):
    """memory/allocated_gb up by >= leak_min_growth_gb over leak_window log steps, rising in at
    least leak_min_increase_fraction of the step-over-step changes. Per rank when per-rank
    records arrive (the aggregated series is then ignored), else on the aggregated series."""

    name = "memory_leak"
    kinds = frozenset({"metrics"})
    after_warmup = complete_only = True   # a partial mean is no trend
    KEY = "memory/allocated_gb"

    def __init__(self, cfg: DiagnosisConfig) -> None:
        super().__init__(cfg)
        self.series: dict[str, deque[tuple[int | None, float]]] = {}
        self.seen_per_rank = False

    def consume(self, record: dict) -> list[Finding]:
        v = finite(record.get("values"), self.KEY)
        if v is None:
            return []
        subject, rank = _subject(record)
        if rank is not None:
            if not self.seen_per_rank:
                self.seen_per_rank = True
                self.series.pop("all", None)
        elif self.seen_per_rank:
            return []
        s = self.series.setdefault(subject, deque(maxlen=self.cfg.leak_window))
        s.append((step_of(record), v))
        if len(s) < self.cfg.leak_window:
            return []
        vals = [x for _, x in s]
        growth = vals[-1] - vals[0]
        deltas = [b - a for a, b in zip(vals, vals[1:])]
        num_up = sum(d > GROWTH_EPS_GB for d in deltas)
        if growth < self.cfg.leak_min_growth_gb or num_up < self.cfg.leak_min_increase_fraction * len(deltas):
            return []
        first_step, last_step = s[0][0], s[-1][0]
        s.clear()  # the next report needs a fresh window of growth
        where = f"rank {rank}" if rank is not None else "the ranks (aggregated)"
        msg = (f"device memory keeps growing on {where}: {self.KEY} went from {vals[0]:.3g} to {vals[-1]:.3g} GB "
               f"over steps {first_step}-{last_step}, up in {num_up} of {len(deltas)} log steps; a leak, e.g. "
               f"tensors kept with their autograd history (summing losses without .detach()), a growing "
               f"cache or a list of outputs")
        return [Finding(subject, msg, t_of(record), rank=rank, data={
            "first_gb": vals[0], "last_gb": vals[-1], "growth_gb": growth, "num_increases": num_up,
            "num_log_steps": len(vals), "first_step": first_step, "last_step": last_step})]


class AllocatorPressure(Rule):
    """memory/alloc_retries or memory/num_ooms rising (both are cumulative counters per rank)."""

    name = "allocator"
    kinds = frozenset({"metrics"})
    complete_only = True   # the aggregated counters are sums over ranks: partial sums would dip and "rise"

    def __init__(self, cfg: DiagnosisConfig) -> None:
        super().__init__(cfg)
        self.last: dict[tuple[str, str], float] = {}

    def consume(self, record: dict) -> list[Finding]:
        subject, rank = _subject(record)
        values = record.get("values")
        out = []
        for key in ("memory/alloc_retries", "memory/num_ooms"):
            v = finite(values, key)
            if v is None:
                continue
            before = self.last.get((subject, key), 0.0)
            self.last[(subject, key)] = v
            if v <= before:
                continue
            where = f"rank {rank}" if rank is not None else "the ranks (aggregated)"
            if key == "memory/num_ooms":
                msg = (f"out of memory on {where} at step {step_of(record)}: {v:.0f} CUDA OOM(s) so far "
                       f"(+{v - before:.0f}); reduce the micro-batch or sequence length, or use activation "
                       f"checkpointing")
                severity = "critical"
            else:
                msg = (f"allocator under pressure on {where} at step {step_of(record)}: {v:.0f} cudaMalloc "
                       f"retries so far (+{v - before:.0f}); the caching allocator had to free its cache to "
                       f"allocate, which stalls the step (near OOM or fragmented; try "
                       f"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True or a smaller batch)")
                severity = "warning"
            out.append(Finding(f"{subject}/{key}", msg, t_of(record), rank=rank, severity=severity,
                               data={"key": key, "value": v, "increase": v - before, "step": step_of(record)}))
        return out
