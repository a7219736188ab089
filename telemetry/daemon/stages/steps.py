"""The steps stage: each batch's metrics records added to their steps across ranks (aggregator.py,
world.py), the steps they complete reduced and given their derived metrics as their records are
made (aggregator.finish_batch, derived.py), encoded once and passed to the fan-out; steps waited
on beyond their memory share go out early. It is what the receiver stage's drain sizes its
processing by (stages.receive.Downstream): the steps open, the steps out, a step's cost as
measured, the open steps' flush.

A node's metrics carry times moved by its clock's offset (node_clocks.py) before they are added;
the last batches are kept for hang forensics (memory.RecentRing); without --per-rank, each batch's
per-rank records go to the goodput stage before their steps (goodput_stage.py).
"""
from __future__ import annotations

import time

from protocol import Metrics
from protocol import output
from protocol.output import MetricsRecord
from telemetry.daemon import memory
from telemetry.daemon.aggregator import Aggregator
from telemetry.daemon.derived import Derived
from telemetry.daemon.node_clocks import NodeClocks
from telemetry.daemon.pipeline import Stage
from telemetry.daemon.self_report import Losses
from telemetry.daemon.sinks.base import Out
from telemetry.daemon.stages.fanout import FanOut


# Steps in one batch from which its cost per step is taken as a measure (fewer: the batch's fixed
# costs would count as the steps').
MEASURE_MIN_STEPS = 64


class StepsStage(Stage):
    name = "steps"
    # Its drain is the open steps' flush, which the receiver's drain has sized to fit its own time.
    drain_share = 0.5

    def __init__(self, aggregator: Aggregator, derived: Derived, *, per_rank: bool, losses: Losses,
                 shed: memory.Shed, names: memory.NameCatalogue, recent: memory.RecentRing,
                 open_steps_bytes: int, fanout: FanOut) -> None:
        self.aggregator = aggregator
        self.derived = derived
        self.per_rank = per_rank
        self.losses = losses
        self.shed = shed
        self.names = names
        self.recent = recent
        self.open_steps_bytes = open_steps_bytes
        self.fanout = fanout
        self._emit = fanout.emit           # an output record, encoded by the fan-out
        self._put = fanout.put             # an output record already encoded (a step's line)
        self.clocks: NodeClocks | None = None     # a head's (set at start)
        self.goodput = None                # the GoodputStage, for the per-rank records (set at start)
        self.record_bytes = 1024           # estimated bytes of a metrics record in memory (per batch)
        self.latest: MetricsRecord | None = None  # the last step out (the progress line)
        # What sending a step out costs on this box now (reduce, derive, encode), measured on
        # batches of MEASURE_MIN_STEPS or more: the drain sizes the open steps' flush with it.
        self._step_cost_s: float | None = None

    def consume(self, batch: list) -> None:
        """A run of metrics records (protocol.Metrics), in the order they came."""
        recs = batch
        if self.clocks is not None and self.clocks.offset_ns:
            recs = self.clocks.correct(recs)
        self.recent.append(recs, len(recs) * self.record_bytes)
        if self.per_rank:
            for rec in recs:
                self._emit_rank(rec)
        try:
            closed, late = self.aggregator.add_many(recs)
        except Exception as exc:              # the boundary should have caught it: counted, go on
            self.losses.failed("aggregator", exc, len(recs))
            return
        if not self.per_rank:
            for rec in late:
                self._emit_rank(rec, late=True)   # its step went out without it; keep it
            if self.goodput is not None and self.goodput.rank_bytes_max:   # before their steps go out
                if late:
                    late_ids = set(map(id, late))
                    recs = [r for r in recs if id(r) not in late_ids]
                self.goodput.take_rank_records(recs, len(recs) * self.record_bytes)
        self.emit_steps(closed)
        max_open = self.open_steps_bytes // self.record_bytes
        if self.aggregator.num_open_records > max_open:
            early = self.aggregator.shed_oldest(max_open)
            self.shed.add("steps_closed_early", len(early), "steps waited on hold more records than their share: "
                          "the oldest go out early, without the ranks that have not reported")
            self.emit_steps(early)

    def expire(self, now: float) -> None:
        """The steps whose ranks are overdue go out without them."""
        self.emit_steps(self.aggregator.expire(now))

    def flush(self) -> None:
        """Every open step goes out with whatever ranks it has."""
        self.emit_steps(self.aggregator.flush())

    def drain(self, deadline: float) -> bool:
        self.flush()
        return True

    # -- what the receiver stage needs of it (stages.receive.Downstream) -----------------------
    def hand_out(self) -> None:
        self.fanout.flush()

    def num_open_steps(self) -> int:
        return len(self.aggregator.pending)

    def num_steps_out(self) -> int:
        return self.aggregator.num_steps_out

    def step_cost_s(self) -> float | None:
        return self._step_cost_s

    def flush_open(self) -> None:
        """The records posted from other threads first (the pollers'), as the loop takes them."""
        self.fanout.take_inbox()
        self.flush()
        self.fanout.flush()

    def _emit_rank(self, rec: Metrics, late: bool = False) -> None:
        out = MetricsRecord(rec.t_ns / 1e9, rec.step, rec.values, rank=rec.rank)
        if late:
            out.late = True
        self._emit(out)

    def emit_steps(self, accs: list) -> None:
        """The steps the aggregator closed, reduced across ranks, with their derived metrics; in
        chunks whose steps x names table fits memory.MAX_BATCH_CELLS (steps with different names
        each make that table grow as steps x all their names)."""
        if not accs:
            return
        chunk = max(1, memory.MAX_BATCH_CELLS // max(1, len(self.names)))
        if len(accs) > chunk:
            for i in range(0, len(accs), chunk):
                self.emit_steps(accs[i:i + chunk])
            return
        t0 = time.perf_counter()
        failed: list = []           # a derivation that fails costs its names in this batch, never the steps
        world_size = self.aggregator.world.size()
        try:
            _, recs = self.aggregator.finish_batch(
                accs, lambda batch, values: failed.extend(self.derived.apply(batch, values, world_size)))
        except Exception as exc:              # the boundary should have caught it: counted, go on
            self.losses.failed("reduce", exc, sum(len(acc.records) for acc in accs))
            return
        for what, exc in failed:
            self.losses.failed(f"derived: {what}", exc, 0)
        put = self._put
        for acc, rec in zip(accs, recs):
            try:
                line = output.encode(rec)
            except Exception as exc:
                self.losses.failed("encode", exc, len(acc.records))
                continue
            put(Out("metrics", rec, line))
        self.latest = recs[-1]
        if len(accs) >= MEASURE_MIN_STEPS:
            cost = (time.perf_counter() - t0) / len(accs)
            self._step_cost_s = cost if self._step_cost_s is None else (self._step_cost_s + cost) / 2

    def next_deadline(self, now: float, max_wait_s: float) -> float:
        """When the oldest open step is due (now + max_wait_s when none is open)."""
        deadline = self.aggregator.next_deadline()
        return now + max_wait_s if deadline is None else deadline

    def stats(self) -> dict:
        agg = self.aggregator
        return {"steps_out": agg.num_steps_out, "steps_incomplete": agg.num_steps_incomplete,
                "records_late": agg.num_records_late, "world_size": agg.world.size(),
                "records_unannounced": agg.num_records_unannounced,
                "records_unannounced_refused": agg.num_records_unannounced_refused,
                "ranks_unannounced": len(agg.world.strangers),
                "last_step": agg.last_step, "steps_pending": len(agg.pending),
                "ranks_gone": sorted(agg.world.gone)}


