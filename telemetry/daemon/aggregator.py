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

Cost: the daemon works in batches. `add_many` stores each rank's values dict as it is (a few
dict operations per record); `finish_many` reduces the steps a batch closed together, a metric
at a time over all of them when their ranks logged the same keys in the same order (the usual
case), else one step at a time. Open steps are indexed twice, by step (a heap) and by opening
time (a deque, in opening order), so closing and expiring cost what they close, not the number
of open steps: under overload thousands of steps can be open at once.
"""
from __future__ import annotations

import heapq
import time
from collections import OrderedDict, deque
from itertools import chain, repeat
from operator import attrgetter, getitem, truediv
from typing import NamedTuple

from protocol import Metrics
from telemetry.daemon import hotpath
from telemetry.daemon.config import AggregatorConfig
from telemetry.daemon.reductions import RANK_RULES, Reducer, _mean

# Timed-out steps in a row a rank may miss before the aggregator stops waiting for it.
DEAD_AFTER_TIMEOUTS = 2
# Closed steps remembered (with their ranks) to tell a late straggler from a step logged again.
CLOSED_STEPS_KEPT = 4096


class StepAccumulator:
    __slots__ = ("step", "opened_mono", "t_ns", "by_rank", "keys", "uniform", "cols")

    def __init__(self, step: int, now: float, keys: object) -> None:
        self.step = step
        self.opened_mono = now
        self.t_ns = 0
        self.by_rank: dict[int, dict] = {}
        # The first rank's key order; uniform while every rank's is the same object (see add_many).
        self.keys = keys
        self.uniform = True
        # For MFU, set by finish: side by side over the ranks that logged perf/step_time, their
        # perf/tokens, perf/attn_doc_len_sq (None: not logged) and perf/step_time values.
        self.cols: tuple | None = None


class _Row(NamedTuple):
    rank: int
    step: int
    t_ns: int
    values: dict


class Aggregator:
    def __init__(self, cfg: AggregatorConfig, native=hotpath.native) -> None:
        self.cfg = cfg
        self.native = native        # the C loops (hotpath.native) or None; same results
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
        self._key_orders: dict[tuple, tuple] = {}    # add()'s own canonical key orders (see add_many)
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
        self._known_frozen = frozenset(self._known)
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
        keys = tuple(values)
        orders = self._key_orders
        if len(orders) > 1024:
            orders.clear()
        done, late = self.add_many([_Row(rank, step, t_ns, values)], [orders.setdefault(keys, keys)])
        return None if late else done

    def add_many(self, recs: list, key_orders: list) -> tuple[list[StepAccumulator], list]:
        """Add metrics records (anything with .rank, .step, .t_ns, .values) in order of arrival.
        Returns the steps they complete, oldest first, and the records that came late (their
        step went out without their rank): the caller writes those as the rank's own records.

        key_orders[i] stands for the order of recs[i]'s keys: records with the same object
        there have the same keys in the same order (the receiver hands out one tuple per key
        order). A step whose ranks all had the same is reduced in bulk (finish_many).
        The daemon's hot path: a few dict operations per record, no call in the steady state
        (or the same loop in C, see hotpath.py).
        """
        if self.native is not None:
            return self._add_many_native(recs, key_orders)
        pending, closed, heap, by_age = self.pending, self._closed, self._step_heap, self._by_age
        steady, expected, num_expected = self._steady, self._expected, self._num_expected
        now = time.monotonic()
        done: list[StepAccumulator] = []
        late: list = []
        for rec, keys in zip(recs, key_orders):
            step, rank, values = rec.step, rec.rank, rec.values
            acc = pending.get(step)
            if acc is None:
                ranks_then = closed.get(step)
                if ranks_then is not None and rank not in ranks_then:
                    late.append(rec)
                    continue
                acc = pending[step] = StepAccumulator(step, now, keys)
                heapq.heappush(heap, step)
                by_age.append(acc)
            elif keys is not acc.keys:
                acc.uniform = False
            by_rank = acc.by_rank
            prev = by_rank.setdefault(rank, values)
            if prev is not values:          # this rank logged this step twice: merge
                by_rank[rank] = {**prev, **values}
                acc.uniform = False
            if rec.t_ns > acc.t_ns:
                acc.t_ns = rec.t_ns
            if rank not in steady:          # one set lookup per record in the steady state
                self._rank_reported(rank)
                steady, expected, num_expected = self._steady, self._expected, self._num_expected
            if len(by_rank) >= num_expected and expected.issubset(by_rank):
                done += self._close_through(step)
        self.num_records_late += len(late)
        return done, late

    def _add_many_native(self, recs: list, key_orders: list) -> tuple[list[StepAccumulator], list]:
        done: list[StepAccumulator] = []
        late: list = []
        recs, key_orders = list(recs), list(key_orders)
        now, i, force = time.monotonic(), 0, False
        while i < len(recs):
            i = self.native.add_many(self, recs, key_orders, i, force, now, done, late, StepAccumulator, Metrics)
            if i < len(recs):        # a rank not seen yet (or back): noted here, then its record goes in
                self._rank_reported(recs[i].rank)
                force = True
        self.num_records_late += len(late)
        return done, late

    def _close_through(self, step: int) -> list[StepAccumulator]:
        """Pop every open step <= `step`, oldest step first."""
        pending, heap, by_age = self.pending, self._step_heap, self._by_age
        done = []
        while heap and heap[0] <= step:
            s = heapq.heappop(heap)
            acc = pending.pop(s, None)
            if acc is not None:
                done.append(acc)
                if by_age and by_age[0] is acc:   # the usual case: steps close in opening order
                    by_age.popleft()              # (others are skipped later, by _oldest_open)
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
    def finish(self, acc: StepAccumulator) -> dict:
        """The aggregated record for a closed step (the JSONL schema)."""
        return self.finish_many([acc])[0]

    def finish_many(self, accs: list[StepAccumulator]) -> list[dict]:
        """The aggregated records of closed steps, in the order given.

        The usual case is reduced in bulk: steps whose ranks all logged the same keys in the same
        order (same code) are grouped by that key order and rank count, and each metric is
        reduced for the whole group at once by C-level iteration (a column of every step's values,
        cut into one tuple per step by zip, mapped through sum/max/min). Per step and metric no
        Python bytecode runs: this is what a backlog of thousands of steps costs (see
        benchmarks/ingest.py). Other steps (ranks with different keys, a value that is not a
        number) take the general path, one value list per metric.
        """
        out: list = [None] * len(accs)
        groups: dict[tuple, list[int]] = {}
        for i, acc in enumerate(accs):
            n = len(acc.by_rank)
            if n == 1:
                out[i] = self._straggle(acc, dict(next(iter(acc.by_rank.values()))))
            elif acc.uniform:
                g = groups.get((acc.keys, n))
                if g is None:
                    groups[(acc.keys, n)] = [i]
                else:
                    g.append(i)
            else:
                out[i] = self._straggle(acc, self._reduce_general(list(acc.by_rank.values())))
        for (keys, n), idx in groups.items():
            group = [accs[i] for i in idx]
            try:
                values = self._reduce_group(group, keys, n)
            except TypeError:       # a value that is not a number: reduce these one list at a time
                values = [self._straggle(acc, self._reduce_general(list(acc.by_rank.values()))) for acc in group]
            for i, v in zip(idx, values):
                out[i] = v
        return self._records(accs, out)

    def _plan(self, keys: tuple) -> tuple[tuple, tuple]:
        """Per key: an op number (_OPS) or the reduction function; and where in keys the
        columns the straggler view and MFU read are (-1: not logged)."""
        plan = self._plans.get(keys)
        if plan is None:
            ops = tuple(_OPS.get(f, f) for f in map(self.reducer.func, keys))
            view = tuple(keys.index(name) if name in keys else -1 for name in _VIEW)
            plan = self._plans[keys] = (ops, view)
            if len(self._plans) > 1024:        # bounded: key sets are few in any real run
                self._plans.pop(next(iter(self._plans)))
        return plan

    def _reduce_group(self, group: list[StepAccumulator], keys: tuple, n: int) -> list[dict]:
        """Reduce steps that share one key order and rank count; one values dict per step, with
        the straggler view. Every loop here is a map or zip over C functions (or, with the C
        loops, one call)."""
        ops, view_at = self._plan(keys)
        if self.native is not None:
            return self.native.reduce_group(group, keys, ops, n, view_at)
        k = len(keys)
        rows = chain.from_iterable(map(dict.values, map(_by_rank, group)))
        flat = list(chain.from_iterable(map(dict.values, rows)))
        num_steps = len(group)
        view = dict.fromkeys(_VIEW)
        cols = []
        for j, (name, op) in enumerate(zip(keys, ops)):
            per_step = zip(*[iter(flat[j::k])] * n)        # one n-tuple per step
            if name in view:
                per_step = view[name] = list(per_step)
            if op == 0:
                col = map(truediv, map(sum, per_step), repeat(n, num_steps))
            elif op == 1:
                col = map(sum, per_step)
            elif op == 2:
                col = map(max, per_step)
            elif op == 3:
                col = map(min, per_step)
            else:
                col = map(op, per_step)
            cols.append(list(col))                   # raises TypeError here, not half-way through
        times = view["perf/step_time"]
        if times is not None:
            ranks = list(map(tuple, map(_by_rank, group)))
            maxes = list(map(max, times))
            slowest = map(getitem, ranks, map(tuple.index, times, maxes))   # the first to report it
            cols += (maxes, list(map(min, times)), list(slowest))
            keys += _STRAGGLER_KEYS
            tokens, doc_sq = view["perf/tokens"] or repeat(None), view["perf/attn_doc_len_sq"] or repeat(None)
            for acc, c in zip(group, zip(tokens, doc_sq, times)):
                acc.cols = c
        return list(map(dict, map(zip, repeat(keys), zip(*cols))))

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

    def _straggle(self, acc: StepAccumulator, values: dict) -> dict:
        """The straggler view of a step reduced one metric at a time (and acc.cols, for MFU)."""
        ranks, tokens, doc_sq, times = [], [], [], []
        for r, row in acc.by_rank.items():
            st = row.get("perf/step_time")
            if st is not None:
                ranks.append(r)
                tokens.append(row.get("perf/tokens"))
                doc_sq.append(row.get("perf/attn_doc_len_sq"))
                times.append(st)
        if times:
            acc.cols = (tuple(tokens), tuple(doc_sq), tuple(times))
            st_max = max(times)
            values["perf/step_time_max"] = st_max
            values["perf/step_time_min"] = min(times)
            values["perf/slowest_rank"] = ranks[times.index(st_max)]   # the first to report it
        return values

    def _records(self, accs: list[StepAccumulator], values: list[dict]) -> list[dict]:
        """The output records of closed steps (the JSONL schema); remembers which ranks each had."""
        known, closed = self._known, self._closed
        num_known, known_frozen = len(known), self._known_frozen
        recs = []
        for acc, v in zip(accs, values):
            by_rank, step = acc.by_rank, acc.step
            rec = {"kind": "metrics", "t": acc.t_ns / 1e9, "step": step, "values": v}
            if len(by_rank) == num_known:      # every rank (a step's ranks are among the known)
                ranks = known_frozen
            else:
                ranks = frozenset(by_rank)
                rec["missing_ranks"] = sorted(known - ranks)
                self.num_steps_incomplete += 1
            prev = closed.get(step)
            if prev is None:
                closed[step] = ranks
            else:                              # logged again after it went out: newest last
                del closed[step]
                closed[step] = ranks | prev
            recs.append(rec)
        while len(closed) > CLOSED_STEPS_KEPT:
            closed.popitem(last=False)
        if accs:
            self.last_step = max(self.last_step, max(map(_step, accs)))
        self.num_steps_out += len(accs)
        return recs


_OPS = {_mean: 0, sum: 1, max: 2, min: 3}
# The columns the straggler view and MFU read, kept per step by the bulk reduction.
_VIEW = ("perf/step_time", "perf/tokens", "perf/attn_doc_len_sq")
_STRAGGLER_KEYS = ("perf/step_time_max", "perf/step_time_min", "perf/slowest_rank")
_by_rank = attrgetter("by_rank")
_step = attrgetter("step")


def _reduce(f, xs: list):
    try:
        return f(xs)
    except TypeError:   # a non-number slipped in; keep the latest
        return xs[-1]
