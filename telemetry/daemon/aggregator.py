"""Aggregator: one record per training step, combined across ranks.

A step is emitted when every expected rank has reported it, when a later step completes (ranks
step in lockstep and each rank's records arrive in order, so an older step still open then
will get nothing more), or after `step_timeout_s` (a rank died; elastic worlds shrink). A step
emitted without some ranks says which in "missing_ranks". Straggler view per step:
perf/step_time_max, perf/step_time_min, perf/slowest_rank, and per phase (straggler_view.py,
run with the other derived metrics: derived.py).

Which ranks a step waits for is the World's (world.py): the ranks announced to the daemon; a
rank no hello announced joins its steps but is never waited for; ranks come and go, a rank missing from
timed-out steps in a row is no longer waited for, and waited for again once it reports. A record that arrives for a step already emitted
without its rank (a straggler past the timeout) is "late": it is not folded into a second
record for that step but handed back to be written as the rank's own record, so nothing
accepted is lost. A rank that sends several records for a step says so in each (`parts`, e.g. 2
for a training step's metrics and its eval results): the rank counts as reported once all of
them are in, whatever the order of its and the other ranks' records, so the step is written
once with every part of every rank. A rank that reports a step it already contributed to (a
record without `parts` after its first, or a restarted run going over old steps) opens the
step again.

Cost: the daemon works in batches. `add_many` appends each record to its open step (a dict
lookup and two appends per record); `finish_batch` turns the steps a batch closed into one
StepBatch (steps.py: one column per metric, built by loops.gather or its C twin), reduces
each metric across ranks once, over the columns (reductions.py), and has the derived metrics
added to each step's values before its record is made (`derive`: derived.py). Open steps are indexed twice,
by step (a heap) and by opening time (a deque, in opening order), so closing and expiring cost
what they close, not the number of open steps: under overload thousands of steps can be open
at once.
"""
from __future__ import annotations

import heapq
import logging
import time
from collections import OrderedDict, deque
from typing import Callable

from protocol.output import MetricsRecord
from telemetry.daemon import hotpath
from telemetry.daemon.config import AggregatorConfig
from telemetry.daemon.reductions import RANK_RULES, Reducer
from telemetry.daemon.steps import StepBatch
# MAX_WORLD_SIZE: the largest world size a hello is believed about (hellos.py, for the rare stage).
from telemetry.daemon.world import MAX_UNANNOUNCED_RANKS, MAX_WORLD_SIZE, World

log = logging.getLogger("telemetry.daemon")

# Closed steps remembered (with their ranks) to tell a late straggler from a step logged again.
CLOSED_STEPS_KEPT = 4096


class StepAccumulator:
    """An open step: its records in order of arrival and the ranks that are done with it (every
    part they announced is in); `partial`: rank -> parts in so far, of a rank that sends several
    records for the step (`parts` > 1) and has not sent them all yet (None until one does)."""

    __slots__ = ("step", "opened_mono", "records", "ranks", "partial")

    def __init__(self, step: int, now: float) -> None:
        self.step = step
        self.opened_mono = now
        self.records: list = []
        self.ranks: set[int] = set()
        self.partial: dict[int, int] | None = None

    def more_to_come(self, rank: int, parts: int) -> bool:
        """Count one of `rank`'s `parts` records for this step (in any order: only their number
        counts); True while some of them have not arrived yet."""
        partial = self.partial
        if partial is None:
            partial = self.partial = {}
        n = partial.pop(rank, 0) + 1
        if n < parts:
            partial[rank] = n
            return True
        return False


class Aggregator:
    def __init__(self, cfg: AggregatorConfig, loops=hotpath.loops) -> None:
        self.cfg = cfg
        self.loops = loops          # loops.py or its C twin (hotpath.loops); same results
        self.reducer = Reducer(RANK_RULES, cfg.reductions)
        self.pending: dict[int, StepAccumulator] = {}
        # Indexes over `pending`; entries whose step has closed since are skipped lazily.
        self._step_heap: list[int] = []
        self._by_age: deque[StepAccumulator] = deque()
        self.world = World(cfg.world_size, cfg.first_rank)     # which ranks a step waits for
        self._closed: OrderedDict[int, frozenset] = OrderedDict()   # step -> ranks it had
        self.last_step = -1
        self.num_steps_out = 0
        self.num_steps_incomplete = 0
        self.num_records_late = 0
        # Records of ranks outside the world (world.py): taken into their steps, never waited for;
        # refused beyond the strangers the world remembers.
        self.num_records_unannounced = 0
        self.num_records_unannounced_refused = 0
        self.num_open_records = 0                 # records in `pending` (the memory budget's measure)

    # -- the hot path ---------------------------------------------------------------------------
    def add_many(self, recs: list) -> tuple[list[StepAccumulator], list]:
        """Add metrics records (anything with .rank, .step, .t_ns, .values, .parts) in order of
        arrival. Returns the steps they complete, oldest first, and the records that came late
        (their step went out without their rank): the caller writes those as the rank's own records.

        A rank is done with a step when all its `parts` records for it are in (1: its one record;
        a training record and an eval record: 2, in whatever order they and the other ranks'
        arrive); the step is complete when every expected rank is done with it.

        A record of a rank outside the world (a stranger: no hello announced it, world.py) joins
        its step without counting toward it; one of a stranger beyond those the world remembers
        is refused (counted, in neither list).

        The daemon's hot path: per record a dict lookup, two appends and the completeness test;
        opening a step, a rank not seen before, a stranger's record and a record of several parts
        take the slower paths (each O(1)).
        """
        pending, world = self.pending, self.world
        steady, expected, num_expected = world.steady, world.expected, world.num_expected
        now = time.monotonic()
        done: list[StepAccumulator] = []
        late: list = []
        num_strangers = num_refused = 0
        for rec in recs:
            step, rank = rec.step, rec.rank
            settled = rank in steady        # one set lookup per record in the steady state
            if not settled:
                member = world.admit(rank)
                if member is None:
                    num_refused += 1
                    continue
                if not member:
                    num_strangers += 1
            acc = pending.get(step)
            if acc is None:
                acc = self._open(step, rank, now)
                if acc is None:
                    late.append(rec)
                    continue
            acc.records.append(rec)
            if not settled and not member:
                continue                    # a stranger's: no step waits for it
            if rec.parts != 1 and acc.more_to_come(rank, rec.parts):
                continue                    # the rank is not done with the step yet
            ranks = acc.ranks
            ranks.add(rank)
            if not settled:
                world.reported(rank)
                steady, expected, num_expected = world.steady, world.expected, world.num_expected
            if len(ranks) >= num_expected and expected <= ranks:
                done += self._close_through(step)
        if num_strangers or num_refused:
            self._count_strangers(num_strangers, num_refused)
        self.num_records_late += len(late)
        self.num_open_records += len(recs) - len(late) - num_refused
        return done, late

    def _count_strangers(self, num_taken: int, num_refused: int) -> None:
        """Count a batch's records of strangers; the first taken and the first refused are logged."""
        if num_taken and not self.num_records_unannounced:
            log.warning("records of a rank no hello announced (a rank id outside the world): each joins its step, "
                        "no step waits for it or names it missing (counted in records_unannounced; "
                        "status: ranks_unannounced). A rank of this run whose hello never arrived is not "
                        "waited for either: --world-size says whom to wait for")
        if num_refused and not self.num_records_unannounced_refused:
            log.warning("records of more than %d ranks no hello announced: those of the ranks beyond are refused "
                        "(counted in records_unannounced_refused)", MAX_UNANNOUNCED_RANKS)
        self.num_records_unannounced += num_taken
        self.num_records_unannounced_refused += num_refused

    def held_by_source(self) -> dict[int, int]:
        """Records in open steps, per source (`src`): taken in, not yet in any output record
        (the daemon's checkpoint counts them as not arrived: continuity.py). Per checkpoint, not per record."""
        held: dict[int, int] = {}
        get = held.get
        for acc in self.pending.values():
            for rec in acc.records:
                held[rec.src] = get(rec.src, 0) + 1
        return held

    def _open(self, step: int, rank: int, now: float) -> StepAccumulator | None:
        """A new accumulator for `step`, or None if `rank`'s record for it is late: the step went
        out without this rank. (A rank that had contributed to it logs it again: reopened.)"""
        ranks_then = self._closed.get(step)
        if ranks_then is not None and rank not in ranks_then:
            return None
        acc = self.pending[step] = StepAccumulator(step, now)
        heapq.heappush(self._step_heap, step)
        self._by_age.append(acc)
        return acc

    def _close_through(self, step: int) -> list[StepAccumulator]:
        """Pop every open step <= `step`, oldest step first."""
        pending, heap, by_age = self.pending, self._step_heap, self._by_age
        done = []
        while heap and heap[0] <= step:
            s = heapq.heappop(heap)
            acc = pending.pop(s, None)
            if acc is not None:
                self._remember_closed(acc)
                self.num_open_records -= len(acc.records)
                done.append(acc)
                if by_age and by_age[0] is acc:   # the usual case: steps close in opening order
                    by_age.popleft()              # (others are skipped later, by _oldest_open)
        return done

    def _remember_closed(self, acc: StepAccumulator) -> None:
        """Which ranks a step had when it closed: remembered at once, not when the step is
        written, so a record for it later in the same batch is late (written as the rank's own
        record), never the start of a second aggregate of the step."""
        closed = self._closed
        prev = closed.pop(acc.step, None)
        closed[acc.step] = frozenset(acc.ranks) if prev is None else prev | acc.ranks   # newest last
        if len(closed) > CLOSED_STEPS_KEPT:
            closed.popitem(last=False)

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
            # A step no rank of the world reported (a stranger's alone) is none the world missed.
            if acc.step in late and (acc.ranks or acc.partial):
                self.world.timed_out(acc.ranks)
        return done

    def shed_oldest(self, max_open_records: int) -> list[StepAccumulator]:
        """Close the oldest open steps (and the steps before them) until at most `max_open_records`
        records are open: the daemon's memory bound on waiting, beside the timeout. They go out as
        they are, without the ranks that have not reported (their records, if they come, are late);
        no rank counts as having missed them."""
        done: list[StepAccumulator] = []
        while self.num_open_records > max_open_records and (acc := self._oldest_open()) is not None:
            self._by_age.popleft()
            done += self._close_through(acc.step)
        return done

    def flush(self) -> list[StepAccumulator]:
        done = [self.pending.pop(s) for s in sorted(self.pending)]
        self.num_open_records = 0
        self._step_heap.clear()
        self._by_age.clear()
        for acc in done:
            self._remember_closed(acc)
        return done

    # -- once per batch of closed steps ---------------------------------------------------------
    def finish_batch(self, accs: list[StepAccumulator],
                     derive: Callable[[StepBatch, list[dict]], None] | None = None,
                     ) -> tuple[StepBatch, list[MetricsRecord]]:
        """The closed steps as one StepBatch, and their records: each metric reduced across ranks,
        plus what `derive` adds to each step's values from the batch (the derived metrics:
        derived.py) before the records are made; remembers which ranks each had."""
        batch = StepBatch.gather([acc.step for acc in accs], [acc.records for acc in accs], self.loops.gather)
        values = step_values(batch.names, self.reducer.reduce_columns(batch.columns, self.loops.reduce_column))
        if derive is not None:
            derive(batch, values)
        return batch, self._records(accs, batch, values)

    def _records(self, accs: list[StepAccumulator], batch: StepBatch, values: list[dict]) -> list[MetricsRecord]:
        """The output records of closed steps (the JSONL schema); remembers which ranks each had."""
        known = self.world.known
        num_known = len(known)
        recs = []
        for acc, t_ns, v in zip(accs, batch.t_ns, values):
            rec = MetricsRecord(t_ns / 1e9, acc.step, v)
            if len(acc.ranks) != num_known or not acc.ranks <= known:   # (strangers are not known)
                missing = known - acc.ranks
                if missing:
                    rec.missing_ranks = sorted(missing)
                    self.num_steps_incomplete += 1
            recs.append(rec)
        if accs:
            self.last_step = max(self.last_step, max(batch.steps))
        self.num_steps_out += len(accs)
        return recs


def step_values(names: list[tuple], reduced: dict[str, list]) -> list[dict]:
    """Each step's values dict from the reduced columns (every name of every step has its
    column in `reduced`, one value per step), its metrics in its own order."""
    first = names[0] if names else ()
    if first and names.count(first) == len(names):     # every step has the same metrics (the usual case)
        rows = zip(*[reduced[name] for name in first])
        return [dict(zip(first, row)) for row in rows]
    return [{name: reduced[name][i] for name in step_names} for i, step_names in enumerate(names)]
