"""What the per-phase straggler view costs the aggregator per closed step (issue 19).

Three versions side by side in one run, on the same batch (1,000 steps of 8 ranks, 4 phases and
the step time, every value 0.1 s ±5 % noise): "before", the pure-Python function the aggregator
ran up to e46c6ac (copied below as it was); loops.phase_straggler, the Python twin (what an
install without a C compiler runs); and its C twin in _hotpath.c (when built). Each is timed
with timeit, in turn, --repeats times; reported: µs per step, the median and the range over the
repeats, and whether the three wrote the same values.

    .venv/bin/python -m benchmarks.straggler_view_cost [--steps 1000] [--ranks 8] [--repeats 7]
"""
from __future__ import annotations

import argparse
import random
import statistics
import timeit

from telemetry.daemon import hotpath
from telemetry.daemon import loops as python_loops
from telemetry.daemon.steps import STEP_TIME, StepBatch
from telemetry.daemon.straggler_view import (CAUSE_MIN_FRACTION, CAUSE_ORDER, OUTPUT_KEYS, PHASE_METRICS, PHASES,
                                             add_phase_straggler_view)

# -- before: straggler_view.py at e46c6ac, unchanged but for the name of its entry point ---------


def _slowest_and_excess(times: tuple, ranks: tuple) -> tuple[int, float, float]:
    try:
        ordered = sorted(times)
    except TypeError:
        kept = [(t, r) for t, r in zip(times, ranks) if isinstance(t, (int, float))]
        if len(kept) < 2:
            return None
        times, ranks = [t for t, _ in kept], [r for _, r in kept]
        ordered = sorted(times)
    n = len(ordered) - 1
    if n < 1:
        return None
    t_slow = ordered[n]
    mid = n // 2
    median = ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return ranks[times.index(t_slow)], median, t_slow - median


def before(batch: StepBatch, values: list[dict]) -> None:
    get = batch.columns.get
    columns = [(i, col) for i in map(PHASES.index, CAUSE_ORDER) if (col := get(PHASE_METRICS[i])) is not None]
    if not columns:
        return
    step_times = get(STEP_TIME) or [None] * len(values)
    for i, (v, ranks) in enumerate(zip(values, batch.ranks)):
        n = len(ranks) - 1
        if n < 1:
            continue
        times = step_times[i]
        try:
            floor_s = CAUSE_MIN_FRACTION * max(times) if times else 0.0
        except TypeError:
            floor_s = 0.0
        mid = n // 2
        cause = largest = None
        for idx, col in columns:
            phase_times = col[i]
            if phase_times is None:
                continue
            try:
                ordered = sorted(phase_times)
                median = ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2
                excess = ordered[n] - median
            except TypeError:
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
    try:
        return ranks[times.index(max(times))]
    except TypeError:
        kept = [(t, r) for t, r in zip(times, ranks) if t is not None]
        return max(kept, key=lambda tr: tr[0])[1]


# -- the benchmark -----------------------------------------------------------------------------
NUM_PHASES = 4       # data loading, forward, optimizer, backward: what the trainer logs without the update's own time


def make_batch(num_steps: int, num_ranks: int, seed: int = 0) -> StepBatch:
    rng = random.Random(seed)
    noisy = lambda: tuple(0.1 * (1 + rng.uniform(-0.05, 0.05)) for _ in range(num_ranks))  # noqa: E731
    names = [STEP_TIME, *PHASE_METRICS[:NUM_PHASES]]
    columns = {name: [noisy() for _ in range(num_steps)] for name in names}
    return StepBatch(steps=list(range(num_steps)), t_ns=[0] * num_steps, ranks=[tuple(range(num_ranks))] * num_steps,
                     names=[tuple(names)] * num_steps, columns=columns)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--repeats", type=int, default=7)
    a = p.parse_args(argv)
    batch = make_batch(a.steps, a.ranks)
    versions = {"before (pure Python, e46c6ac)": before,
                "python twin (loops.py)": lambda b, v: add_phase_straggler_view(b, v, python_loops)}
    if hotpath.native is not None:
        versions["c twin (_hotpath.c)"] = lambda b, v: add_phase_straggler_view(b, v, hotpath.native)
    # The same picks from all three (on this input: every value logged and finite).
    outs = []
    for run in versions.values():
        values = [{} for _ in range(a.steps)]
        run(batch, values)
        outs.append([tuple(v[k] for k in OUTPUT_KEYS) for v in values])
    same = all(out == outs[0] for out in outs)
    # Fresh dicts for each call (writing 4 keys into a dict that has them is cheaper than into one
    # that has not); their making is timed apart and taken off.
    fresh = lambda: [{} for _ in range(a.steps)]  # noqa: E731
    number = max(1, 20_000 // a.steps)
    times: dict[str, list[float]] = {name: [] for name in versions}
    base: list[float] = []
    for _ in range(a.repeats):
        base.append(timeit.timeit(fresh, number=number))
        for name, run in versions.items():      # in turn, so the box's noise hits each
            times[name].append(timeit.timeit(lambda: run(batch, fresh()), number=number))
    print(f"{a.steps} steps of {a.ranks} ranks, {NUM_PHASES} phases and the step time; {a.repeats} repeats of "
          f"{number} calls; inner loops built: {hotpath.name()}; same picks from all: {same}")
    per_step = lambda t, b: (t - b) / number / a.steps * 1e6  # noqa: E731
    for name, ts in times.items():
        us = sorted(per_step(t, b) for t, b in zip(ts, base))
        print(f"  {name:32s} {statistics.median(us):6.2f} µs/step  (range {us[0]:.2f}-{us[-1]:.2f})")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
