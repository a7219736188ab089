"""The straggler series of each aggregated step: which rank is slow, and in what phase.

In synchronous data parallel the step times of all ranks are equal (the fast ranks wait for the
slow one inside a collective), so the slow rank shows in its phases, not its step time. From the
per-rank phase timings the ranks send anyway (no collective, nothing added to the step), over the
phases of PHASES logged by two or more ranks, for the phase most likely to be the cause (below),
a line a dashboard can plot:

    perf/straggler_rank            the slow rank
    perf/straggler_excess_s        its time in that phase minus the other ranks' median (s)
    perf/straggler_median_s        the other ranks' median in that phase (s)
    perf/straggler_phase_index     the phase, as its index in PHASES (0 data_loading, 1 forward,
                                   2 optimizer, 3 backward, 4 optimizer_update)

Which phase is the cause: a slow rank's delay reappears in the other ranks as a wait in the next
phase that holds a collective (DDP: the gradient all-reduce in backward; DeepSpeed ZeRO 1/2: also
the parameter all-gather at the end of the optimizer step; ZeRO-3: the parameter gathers in
forward). So a slow forward on rank 1 also shows rank 0 "slow" in backward. CAUSE_ORDER is in
order of how rarely a phase holds such a wait (data loading and the optimizer's own update never,
backward nearly always): the first phase whose excess is significant (CAUSE_MIN_FRACTION of the
step) is the cause; with none, the phase with the largest excess.

optimizer_update is part of the optimizer phase: the time in the optimizer's own update (the
wrapped torch optimizer's step, which the trainer times apart). Under ZeRO 1-3 the optimizer
phase ends in (or is followed by) a collective where the other ranks wait, so every rank's
optimizer phase lasts the same; the update holds no collective, so a slow one shows there.

Cost: per closed step (not per record), a sort of each phase's few values (C-level builtins), and
4 values more in the record (benchmarks/RESULTS.md, issue 19).
"""
from __future__ import annotations

from telemetry.daemon.steps import STEP_TIME, StepBatch

# The phases, in the order of their perf/straggler_phase_index (new ones are appended).
PHASES = ("data_loading", "forward", "optimizer", "backward", "optimizer_update")
PHASE_METRICS = tuple(f"perf/{p}_time" for p in PHASES)
# In order of how rarely the phase holds a collective wait (see the module docstring).
CAUSE_ORDER = ("data_loading", "optimizer_update", "forward", "optimizer", "backward")
# An excess at least this fraction of the step's time names its phase as the cause.
CAUSE_MIN_FRACTION = 0.05


def _slowest_and_excess(times: tuple, ranks: tuple) -> tuple[int, float, float]:
    """(slowest rank, the others' median, excess) over the ranks that logged a value; None with
    fewer than two values. The fast path (every rank logged a number) is C-level builtins."""
    try:
        ordered = sorted(times)
    except TypeError:                      # some ranks did not log it (None): the others'
        kept = [(t, r) for t, r in zip(times, ranks) if isinstance(t, (int, float))]
        if len(kept) < 2:
            return None
        times, ranks = [t for t, _ in kept], [r for _, r in kept]
        ordered = sorted(times)
    n = len(ordered) - 1                   # the others: all but the slowest
    if n < 1:
        return None
    t_slow = ordered[n]
    mid = n // 2
    median = ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return ranks[times.index(t_slow)], median, t_slow - median


def add_phase_straggler_view(batch: StepBatch, values: list[dict]) -> None:
    """Add the per-phase straggler view (module docstring) to each closed step's values."""
    get = batch.columns.get
    columns = [(i, col) for i in map(PHASES.index, CAUSE_ORDER) if (col := get(PHASE_METRICS[i])) is not None]
    if not columns:
        return
    step_times = get(STEP_TIME) or [None] * len(values)
    for i, (v, ranks) in enumerate(zip(values, batch.ranks)):
        n = len(ranks) - 1                 # the others: all ranks but the slowest
        if n < 1:
            continue
        times = step_times[i]
        try:
            floor_s = CAUSE_MIN_FRACTION * max(times) if times else 0.0
        except TypeError:                  # a rank without a step time: judge by the phases alone
            floor_s = 0.0
        mid = n // 2
        cause = largest = None             # (phase index, phase times, median, excess)
        for idx, col in columns:
            phase_times = col[i]
            if phase_times is None:
                continue
            try:                           # the usual case: every rank logged it (C-level builtins)
                ordered = sorted(phase_times)
                median = ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2
                excess = ordered[n] - median
            except TypeError:              # some ranks did not log it (None)
                found = _slowest_and_excess(phase_times, ranks)
                if found is None:
                    continue
                _, median, excess = found
            if cause is None and floor_s and excess >= floor_s:
                cause = (idx, phase_times, median, excess)
            if largest is None or excess > largest[3]:
                largest = (idx, phase_times, median, excess)
        pick = cause or largest
        if pick is not None:
            idx, phase_times, median, excess = pick
            v["perf/straggler_phase_index"] = idx
            v["perf/straggler_rank"] = _slowest_rank(phase_times, ranks)
            v["perf/straggler_median_s"] = median
            v["perf/straggler_excess_s"] = excess


def _slowest_rank(times: tuple, ranks: tuple) -> int:
    """The first rank with the longest time (None values skipped)."""
    try:
        return ranks[times.index(max(times))]
    except TypeError:
        kept = [(t, r) for t, r in zip(times, ranks) if t is not None]
        return max(kept, key=lambda tr: tr[0])[1]
