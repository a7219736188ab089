"""Aggregator: one record per training step, combined across ranks.

A step is emitted when every expected rank has reported it, when a later step completes (ranks
step in lockstep and each rank's records arrive in order, so an older step still open then
will get nothing more), or after `step_timeout_s` (a rank died; elastic worlds shrink). A step
emitted without some ranks says which in "missing_ranks". Straggler view per step:
perf/step_time_max, perf/step_time_min, perf/slowest_rank.
"""
from __future__ import annotations

import time

from telemetry.daemon.config import AggregatorConfig
from telemetry.daemon.reductions import RANK_RULES, Reducer


class StepAccumulator:
    __slots__ = ("step", "opened_mono", "t_ns", "ranks", "values", "per_rank")

    def __init__(self, step: int, now: float) -> None:
        self.step = step
        self.opened_mono = now
        self.t_ns = 0
        self.ranks: set[int] = set()
        self.values: dict[str, list] = {}
        # rank -> (tokens, attn_doc_len_sq, step_time_s) for throughput and MFU
        self.per_rank: dict[int, list] = {}


class Aggregator:
    def __init__(self, cfg: AggregatorConfig) -> None:
        self.cfg = cfg
        self.reducer = Reducer(RANK_RULES, cfg.reductions)
        self.pending: dict[int, StepAccumulator] = {}
        self.ranks_seen: set[int] = set()
        self.world_size_hint = cfg.world_size
        self.last_step = -1
        self.num_steps_out = 0
        self.num_steps_incomplete = 0

    def expected_world(self) -> int:
        return self.world_size_hint or len(self.ranks_seen)

    def note_world_size(self, world_size: int) -> None:
        if not self.cfg.world_size and world_size > self.world_size_hint:
            self.world_size_hint = world_size

    def add(self, rank: int, step: int, t_ns: int, values: dict) -> list[StepAccumulator]:
        """Add one rank's metrics; return the steps this completes (oldest first)."""
        acc = self.pending.get(step)
        if acc is None:
            acc = self.pending[step] = StepAccumulator(step, time.monotonic())
        if rank not in self.ranks_seen:
            self.ranks_seen.add(rank)
        acc.ranks.add(rank)
        if t_ns > acc.t_ns:
            acc.t_ns = t_ns
        vals = acc.values
        for k, v in values.items():
            lst = vals.get(k)
            if lst is None:
                vals[k] = [v]
            else:
                lst.append(v)
        st = values.get("perf/step_time")
        if st is not None:
            acc.per_rank[rank] = [values.get("perf/tokens", 0), values.get("perf/attn_doc_len_sq", 0), st]
        if len(acc.ranks) >= self.expected_world():
            return self._close_through(step)
        return []

    def _close_through(self, step: int) -> list[StepAccumulator]:
        done = sorted(s for s in self.pending if s <= step)
        return [self.pending.pop(s) for s in done]

    def expire(self, now: float) -> list[StepAccumulator]:
        """Steps open longer than the timeout, and everything older than them."""
        timeout = self.cfg.step_timeout_s
        late = [s for s, acc in self.pending.items() if now - acc.opened_mono >= timeout]
        return self._close_through(max(late)) if late else []

    def flush(self) -> list[StepAccumulator]:
        done = sorted(self.pending)
        return [self.pending.pop(s) for s in done]

    def finish(self, acc: StepAccumulator) -> dict:
        """The aggregated record for a closed step (the JSONL schema)."""
        values = self.reducer.reduce(acc.values)
        per_rank = acc.per_rank
        if per_rank:
            slowest = max(per_rank, key=lambda r: per_rank[r][2])
            values["perf/step_time_max"] = per_rank[slowest][2]
            values["perf/step_time_min"] = min(row[2] for row in per_rank.values())
            values["perf/slowest_rank"] = slowest
        rec = {"kind": "metrics", "t": acc.t_ns / 1e9, "step": acc.step, "values": values}
        expected = self.expected_world()
        if len(acc.ranks) < expected:
            known = set(range(expected)) if self.world_size_hint else self.ranks_seen
            rec["missing_ranks"] = sorted(known - acc.ranks)
            self.num_steps_incomplete += 1
        if acc.step > self.last_step:
            self.last_step = acc.step
        self.num_steps_out += 1
        return rec
