"""The straggler series of each aggregated step: which rank is slow, and in what phase.

Its step time across the ranks (add_step_time_view): perf/step_time_max, perf/step_time_min and
perf/slowest_rank, the first rank to report the longest step time. Then, per phase
(add_phase_straggler_view):

In synchronous data parallel the step times of all ranks are equal (the fast ranks wait for the
slow one inside a collective), so the slow rank shows in its phases, not its step time. From the
per-rank phase timings the ranks send anyway (no collective, nothing added to the step), over the
phases of PHASES logged by two or more ranks, for the phase most likely to be the cause (below),
a line a dashboard can plot:

    perf/straggler_rank            the slow rank
    perf/straggler_excess_s        its time in that phase minus the other ranks' median (s)
    perf/straggler_median_s        the other ranks' median in that phase (s)
    perf/straggler_phase_index     the phase, as its index in PHASES (0 data_loading, 1 forward,
                                   2 optimizer, 3 backward, 4 optimizer_update, 5 forward_compute,
                                   6 backward_compute)

Which phase is the cause: a slow rank's delay reappears in the other ranks as a wait in the next
phase that holds a collective (DDP: the buffer broadcast at the start of forward, for a model
with buffers, and the gradient all-reduce in backward; DeepSpeed ZeRO 1/2: the gradient reduce in
backward and the parameter all-gather at the end of the optimizer step; ZeRO-3: the parameter
gathers in forward). So a slow forward on rank 1 also shows rank 0 "slow" in the phase where it
waits. CAUSE_ORDER is in order of how rarely a phase holds such a wait (data loading, the
optimizer's own update and the forward's and backward's compute never, backward nearly always):
the first phase whose excess is significant (CAUSE_MIN_FRACTION of the step) is the cause; with
none, the phase with the largest excess.

forward_compute is part of the forward phase: forward minus its waits, which the trainer times
apart (ZeRO-3's parameter all-gathers; DDP's buffer broadcast before it calls the model). A rank
slow in forward (or before it) makes the others wait there, inside their own forward, so every
rank's forward lasts the same; its compute does not. backward_compute is part of the backward
phase (DDP): from its start to DDP's launch of the last gradient bucket's all-reduce; the rest
of backward is the wait for the all-reduces, where the others wait for a rank slow in backward.

optimizer_update is part of the optimizer phase: the time in the optimizer's own update (the
wrapped torch optimizer's step, which the trainer times apart). Under ZeRO 1-3 the optimizer
phase ends in (or is followed by) a collective where the other ranks wait, so every rank's
optimizer phase lasts the same; the update holds no collective, so a slow one shows there.

Across nodes (a head daemon, whose "ranks" are node daemons): a node forwards with each step,
beside the mean of each phase over its ranks, its slowest rank's time in it (add_phase_maxima:
perf/<phase>_time_max, reduced by max at the head), and the head's view compares the nodes by
those: one rank slow of a node's 8 moves the node's mean by an eighth of its excess, under
CAUSE_MIN_FRACTION, while its maximum carries all of it (by the means alone, a rank slow by a
third of a step was named by its node and never by the head). A group head forwards its
nodes' maxima reduced by max, so the job head compares groups the same way.

Cost: per closed step (not per record), in hotpath.loops.phase_straggler (the C loops, or its
Python twin where an install has no C compiler), and 4 values more in the record; measured by
benchmarks/straggler_view_cost.py (figures in benchmarks/RESULTS.md).
"""
from __future__ import annotations

from telemetry.daemon import hotpath
from telemetry.daemon.reductions import MAX, MIN, reduce_column
from telemetry.daemon.steps import STEP_TIME, StepBatch

# The phases, in the order of their perf/straggler_phase_index (new ones are appended).
PHASES = ("data_loading", "forward", "optimizer", "backward", "optimizer_update", "forward_compute",
          "backward_compute")
PHASE_METRICS = tuple(f"perf/{p}_time" for p in PHASES)
# Each phase's slowest rank (add_phase_maxima), what a head's view reads where a node sent it.
PHASE_MAX_METRICS = tuple(f"{m}_max" for m in PHASE_METRICS)
# In order of how rarely the phase holds a collective wait (see the module docstring).
CAUSE_ORDER = ("data_loading", "optimizer_update", "forward_compute", "backward_compute", "forward", "optimizer",
               "backward")
_CAUSE_INDEXES = tuple(map(PHASES.index, CAUSE_ORDER))
# An excess at least this fraction of the step's time names its phase as the cause. Not less:
# on a shared machine an earlier phase of some rank swings by several percent of the step (seen
# on a loaded 2-core box), which would hide a real excess in a later phase.
CAUSE_MIN_FRACTION = 0.15
# What add_step_time_view writes.
STEP_TIME_KEYS = ("perf/step_time_max", "perf/step_time_min", "perf/slowest_rank")
# What phase_straggler writes, in its order: the phase index, the rank, the median, the excess.
OUTPUT_KEYS = ("perf/straggler_phase_index", "perf/straggler_rank", "perf/straggler_median_s",
               "perf/straggler_excess_s")


def add_phase_straggler_view(batch: StepBatch, values: list[dict], loops=hotpath.loops) -> None:
    """Add the per-phase straggler view (module docstring) to each closed step's values.
    `loops`: the inner loops that compute it (loops.phase_straggler or its C twin)."""
    get = batch.columns.get
    columns = [(i, col) for i in _CAUSE_INDEXES
               if (col := get(PHASE_MAX_METRICS[i], get(PHASE_METRICS[i]))) is not None]
    if not columns:
        return
    loops.phase_straggler(columns, get(STEP_TIME), batch.ranks, values, CAUSE_MIN_FRACTION, OUTPUT_KEYS)


def add_phase_maxima(batch: StepBatch, values: list[dict], reduce=reduce_column) -> None:
    """perf/<phase>_time_max, the slowest rank's time in each phase its ranks logged, into each
    closed step's values: what a node daemon forwards for its head's view (module docstring).
    A value already there is kept (a group head's: its nodes' maxima, reduced by max)."""
    get = batch.columns.get
    for metric, key in zip(PHASE_METRICS, PHASE_MAX_METRICS):
        column = get(metric)
        if column is None:
            continue
        for v, slowest in zip(values, reduce(column, MAX)):
            if slowest is not None and key not in v:
                v[key] = slowest


def add_step_time_view(batch: StepBatch, values: list[dict], reduce=reduce_column) -> None:
    """perf/step_time_max, perf/step_time_min and perf/slowest_rank (the first rank to report
    the longest step time) of each step whose ranks logged perf/step_time, into its values.
    `reduce`: reductions.reduce_column or its C twin (hotpath.loops)."""
    times_column = batch.columns.get(STEP_TIME)
    if times_column is None:
        return
    slowest_column, fastest_column = reduce(times_column, MAX), reduce(times_column, MIN)
    for v, times, ranks, slowest, fastest in zip(values, times_column, batch.ranks, slowest_column, fastest_column):
        if slowest is None:                # no rank of this step logged it
            continue
        v["perf/step_time_max"] = slowest
        v["perf/step_time_min"] = fastest
        # max() returns the item itself, so index() finds its rank (a missing time is None, never equal)
        v["perf/slowest_rank"] = ranks[times.index(slowest)]
