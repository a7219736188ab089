"""Aggregator: one record per training step, combined across ranks.

A step is emitted when every expected rank has reported it, when a later step completes (ranks
step in lockstep and each rank's records arrive in order, so an older step still open then
will get nothing more), or after `step_timeout_s` (a rank died; elastic worlds shrink). A step
emitted without some ranks says which in "missing_ranks". Straggler view per step:
perf/step_time_max, perf/step_time_min, perf/slowest_rank.

Ranks come and go: a rank missing from DEAD_AFTER_TIMEOUTS timed-out steps in a row is no
longer waited for (so one dead rank does not delay every later step by the timeout); it is
waited for again as soon as it reports. A record that arrives for a step already emitted
without its rank (a straggler past the timeout) is "late": it is not folded into a second
record for that step but handed back to be written as the rank's own record, so nothing
accepted is lost. A rank that reports a step it already contributed to (a second log call for
the step, e.g. eval metrics, or a restarted run going over old steps) opens the step again.

Cost: `add` stores each rank's values dict as it is (one dict operation per record); the
per-metric reductions run once per step in `finish`. Open steps are indexed twice, by step (a
heap) and by opening time (a deque, in opening order), so closing and expiring cost what they
close, not the number of open steps: under overload thousands of steps can be open at once.
"""
from __future__ import annotations

import heapq
import time
from collections import OrderedDict, deque

from telemetry.daemon.config import AggregatorConfig
from telemetry.daemon.reductions import RANK_RULES, Reducer, _mean

# Timed-out steps in a row a rank may miss before the aggregator stops waiting for it.
DEAD_AFTER_TIMEOUTS = 2
# Closed steps remembered (with their ranks) to tell a late straggler from a step logged again.
CLOSED_STEPS_KEPT = 4096


class StepAccumulator:
    __slots__ = ("step", "opened_mono", "t_ns", "by_rank", "per_rank")

    def __init__(self, step: int, now: float) -> None:
        self.step = step
        self.opened_mono = now
        self.t_ns = 0
        self.by_rank: dict[int, dict] = {}
        # rank -> [tokens, attn_doc_len_sq, step_time_s] for throughput and MFU (set by finish)
        self.per_rank: dict[int, list] = {}


class Aggregator:
    def __init__(self, cfg: AggregatorConfig) -> None:
        self.cfg = cfg
        self.reducer = Reducer(RANK_RULES, cfg.reductions)
        self.pending: dict[int, StepAccumulator] = {}
        # Indexes over `pending`; entries whose step has closed since are skipped lazily.
        self._step_heap: list[int] = []
        self._by_age: deque[StepAccumulator] = deque()
        self.ranks_seen: set[int] = set()
        self.world_size_hint = cfg.world_size
        self.ranks_gone: set[int] = set()
        self._misses: dict[int, int] = {}          # rank -> timed-out steps missed in a row
        self._steady: set[int] = set()
        self._plans: dict[tuple, list] = {}
        self._closed: OrderedDict[int, frozenset] = OrderedDict()   # step -> ranks it had
        self._num_expected = self._recount()
        self.last_step = -1
        self.num_steps_out = 0
        self.num_steps_incomplete = 0
        self.num_records_late = 0

    # -- who is expected -----------------------------------------------------------------------
    def known_ranks(self) -> set[int]:
        if not self.world_size_hint:
            return set(self.ranks_seen)
        first = self.cfg.first_rank   # a node daemon waits for its own slice of the global ranks
        return set(range(first, first + self.world_size_hint)) | self.ranks_seen

    def expected_ranks(self) -> set[int]:
        return self.known_ranks() - self.ranks_gone

    def expected_world(self) -> int:
        return self.world_size_hint or len(self.ranks_seen)

    def _recount(self) -> int:
        self._known = self.known_ranks()
        self._expected = self._known - self.ranks_gone
        # Ranks seen, not gone, with no misses pending: a record from one of them changes nothing.
        self._steady = self.ranks_seen - self.ranks_gone - self._misses.keys()
        return len(self._expected)

    def note_world_size(self, world_size: int) -> None:
        if not self.cfg.world_size and world_size > self.world_size_hint:
            self.world_size_hint = world_size
            self._num_expected = self._recount()

    def _rank_reported(self, rank: int) -> None:
        self.ranks_seen.add(rank)
        self.ranks_gone.discard(rank)
        self._misses.pop(rank, None)
        self._num_expected = self._recount()

    # -- the per-record path -------------------------------------------------------------------
    def add(self, rank: int, step: int, t_ns: int, values: dict) -> list[StepAccumulator] | None:
        """Add one rank's metrics; return the steps this completes (oldest first), or None if
        the record is late (its step went out without this rank): the caller writes it as the
        rank's own record."""
        acc = self.pending.get(step)
        if acc is None:
            closed = self._closed.get(step)
            if closed is not None and rank not in closed:
                self.num_records_late += 1
                return None
            acc = self.pending[step] = StepAccumulator(step, time.monotonic())
            heapq.heappush(self._step_heap, step)
            self._by_age.append(acc)
        by_rank = acc.by_rank
        prev = by_rank.get(rank)
        by_rank[rank] = values if prev is None else {**prev, **values}
        if t_ns > acc.t_ns:
            acc.t_ns = t_ns
        if rank not in self._steady:       # one set lookup per record in the steady state
            self._rank_reported(rank)
        if len(by_rank) >= self._num_expected and self._expected.issubset(by_rank):
            return self._close_through(step)
        return []

    def _close_through(self, step: int) -> list[StepAccumulator]:
        """Pop every open step <= `step`, oldest step first."""
        pending, heap = self.pending, self._step_heap
        done = []
        while heap and heap[0] <= step:
            s = heapq.heappop(heap)
            acc = pending.pop(s, None)
            if acc is not None:
                done.append(acc)
        return done

    def _oldest_open(self) -> StepAccumulator | None:
        by_age, pending = self._by_age, self.pending
        while by_age:
            acc = by_age[0]
            if pending.get(acc.step) is acc:
                return acc
            by_age.popleft()   # closed since, or reopened (a newer accumulator is further on)
        return None

    def next_deadline(self) -> float | None:
        """When the oldest open step times out (monotonic clock), or None with nothing open."""
        acc = self._oldest_open()
        return None if acc is None else acc.opened_mono + self.cfg.step_timeout_s

    def expire(self, now: float) -> list[StepAccumulator]:
        """Steps open longer than the timeout, and everything older than them."""
        cutoff = now - self.cfg.step_timeout_s
        late: set[int] = set()
        while (acc := self._oldest_open()) is not None and acc.opened_mono <= cutoff:
            late.add(acc.step)
            self._by_age.popleft()
        if not late:
            return []
        done = self._close_through(max(late))
        for acc in done:
            if acc.step in late:
                self._note_misses(acc)
        return done

    def _note_misses(self, acc: StepAccumulator) -> None:
        for r in self._expected - acc.by_rank.keys():
            n = self._misses[r] = self._misses.get(r, 0) + 1
            if n >= DEAD_AFTER_TIMEOUTS:
                self.ranks_gone.add(r)
        self._num_expected = self._recount()

    def flush(self) -> list[StepAccumulator]:
        done = sorted(self.pending)
        self._step_heap.clear()
        self._by_age.clear()
        return [self.pending.pop(s) for s in done]

    # -- once per step -------------------------------------------------------------------------
    def _reduce_fast(self, rows: list[dict]) -> dict | None:
        """The usual case: every rank logged the same keys in the same order (same code). The
        rows are transposed in C (zip) and each column reduced by a plan cached per key order.
        None when the rows differ or a value is not a number: the general path handles it."""
        keys = tuple(rows[0])
        for r in rows:
            if len(r) != len(keys) or tuple(r) != keys:
                return None
        plan = self._plans.get(keys)
        if plan is None:
            func = self.reducer.func
            plan = self._plans[keys] = [(k, _OPS.get(func(k), -1), func(k)) for k in keys]
            if len(self._plans) > 1024:        # bounded: key sets are few in any real run
                self._plans.pop(next(iter(self._plans)))
        n = len(rows)
        values = {}
        try:
            for (k, op, f), xs in zip(plan, zip(*[r.values() for r in rows])):
                if op == 0:
                    values[k] = sum(xs) / n
                elif op == 1:
                    values[k] = sum(xs)
                elif op == 2:
                    values[k] = max(xs)
                elif op == 3:
                    values[k] = min(xs)
                else:
                    values[k] = f(xs)
        except TypeError:
            return None
        return values

    def _reduce_general(self, rows: list[dict]) -> dict:
        func = self.reducer.func
        gathered: dict[str, list] = {}
        for r in rows:
            for k, v in r.items():
                lst = gathered.get(k)
                if lst is None:
                    gathered[k] = [v]
                else:
                    lst.append(v)
        return {k: xs[0] if len(xs) == 1 else _reduce(func(k), xs) for k, xs in gathered.items()}

    def finish(self, acc: StepAccumulator) -> dict:
        """The aggregated record for a closed step (the JSONL schema)."""
        by_rank = acc.by_rank
        rows = list(by_rank.values())
        if len(rows) == 1:
            values = dict(rows[0])
        else:
            values = self._reduce_fast(rows)
            if values is None:
                values = self._reduce_general(rows)
        per_rank = acc.per_rank
        for r, row in by_rank.items():
            st = row.get("perf/step_time")
            if st is not None:
                per_rank[r] = [row.get("perf/tokens", 0), row.get("perf/attn_doc_len_sq", 0), st]
        if per_rank:
            times = [(row[2], r) for r, row in per_rank.items()]
            st_max, slowest = max(times)
            values["perf/step_time_max"] = st_max
            values["perf/step_time_min"] = min(times)[0]
            values["perf/slowest_rank"] = slowest
        rec = {"kind": "metrics", "t": acc.t_ns / 1e9, "step": acc.step, "values": values}
        missing = self._known - by_rank.keys() if len(by_rank) < len(self._known) else None
        if missing:
            rec["missing_ranks"] = sorted(missing)
            self.num_steps_incomplete += 1
        closed = self._closed
        prev = closed.pop(acc.step, None)
        closed[acc.step] = frozenset(by_rank) | prev if prev else frozenset(by_rank)
        if len(closed) > CLOSED_STEPS_KEPT:
            closed.popitem(last=False)
        if acc.step > self.last_step:
            self.last_step = acc.step
        self.num_steps_out += 1
        return rec


_OPS = {_mean: 0, sum: 1, max: 2, min: 3}


def _reduce(f, xs: list):
    try:
        return f(xs)
    except TypeError:   # a non-number slipped in; keep the latest
        return xs[-1]
