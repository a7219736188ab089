"""Where a run's wall-clock time went: the goodput ledger, from what the daemon wrote.

    telemetry goodput RUN_DIR [--json FILE]

Reads the run's metrics.jsonl (every launch of the job on that run dir, every daemon that wrote
it) and splits the job's wall time, from the first process's start to the last record of the
last launch, into buckets that sum to it:

    productive          Σ over steps of step time - data loading - straggler wait
    startup             first launch: process start -> its first step began (imports, model,
                        engine, data loader), less a checkpoint restore in it
    data_loading        Σ perf/data_loading_time: what the steps waited for data
    eval                Σ perf/eval_time (the trainer times its evaluation)
    checkpoint_save     Σ over saves of the slowest rank's checkpoint_saved duration_s
    checkpoint_restore  Σ over launches of the slowest rank's checkpoint_restored duration_s
    straggler           Σ perf/straggler_excess_s: per step, how much longer the slowest rank's
                        phase ran than the others' median (the time the others waited); when
                        that phase is data loading, the data bucket takes the others' median
                        (perf/straggler_median_s) rather than the ranks' mean, so the excess is
                        counted once
    hang                a launch that ended without train_end or a bye (killed, or crashed
                        without closing its client): its last step -> its end, the
                        last record of its ranks or, when a rank was killed or crashed, when the
                        daemon first saw its process gone (diagnosis/rank_exited, gone_for_s
                        before the event; the daemon looks once a tick, 1 s), less the saves
                        after that step
    redone              the steps a failed launch made after the checkpoint the next launch
                        resumed from, at their measured step time: work done twice
    recovery            a failed launch's end -> the next launch's first step, less its restore
    unexplained         the rest: wall - all of the above (loop overhead, logging, anything the
                        trainer does not time), shown as such

goodput = productive / wall. Steps are the daemon's aggregated step records (across ranks: the
step time is the slowest rank's, data loading the ranks' mean); a launch is the processes whose
hello says they started after the previous launch's last step (hello `started_at`, sent by
every client). A step the daemon never wrote (it was down) is in `unexplained`; `steps_missing`
counts them.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

BUCKETS = ("productive", "startup", "data_loading", "eval", "checkpoint_save", "checkpoint_restore", "straggler",
           "hang", "redone", "recovery", "unexplained")
DATA_PHASE = 0.0      # perf/straggler_phase_index of data loading (the catalogue's doc lists them)
# What to do about each kind of loss, the report's line under the biggest.
ADVICE = {
    "startup": "start-up: cache the model and data locally, fewer imports, a warm container; it is paid per launch",
    "data_loading": "data loading: more DataLoader workers, pinned memory, prefetch, data on local disk",
    "eval": "evaluation: fewer eval batches or less often, or evaluate asynchronously",
    "checkpoint_save": "checkpoint saves: less often, asynchronous or sharded saves, a faster file system",
    "checkpoint_restore": "checkpoint restores: a faster file system, sharded checkpoints",
    "straggler": "stragglers: see diagnosis/straggler events (telemetry tail) for the rank and phase",
    "hang": "hangs: set a collective timeout; the daemon's hang bundle names the rank and where it waits",
    "redone": "work redone: checkpoint more often (each lost step is paid twice)",
    "recovery": "recovery: restart faster (a job supervisor that relaunches at once, a warm node pool)",
    "unexplained": "unexplained: time outside the timed phases (logging, host syncs, the loop's own work)",
}


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


@dataclass
class _Launch:
    started_at: float
    steps: dict[int, dict] = field(default_factory=dict)    # step -> the aggregated record's values
    step_t: dict[int, float] = field(default_factory=dict)  # step -> the record's t (the step's end)
    saves: dict[int, float] = field(default_factory=dict)   # step -> slowest rank's save duration
    save_t: dict[int, float] = field(default_factory=dict)
    restore_s: float = 0.0
    restored_step: int | None = None
    ended: bool = False          # a train_end event or a bye: the launch left, it was not killed
    last_t: float = 0.0          # its last record of any kind


def _launches(records: Iterable[dict]) -> tuple[list[_Launch], int]:
    """The job's launches in time order, each with its steps, saves and restores; and the number
    of records read."""
    launches: list[_Launch] = []
    n = 0
    for rec in records:
        n += 1
        kind = rec.get("kind")
        t = _num(rec.get("t"))
        if t is None:
            continue
        if kind == "hello":
            info = rec.get("info") if isinstance(rec.get("info"), dict) else {}
            started = _num(info.get("started_at"))
            if started is None:
                continue
            cur = launches[-1] if launches else None
            if cur is None or (cur.steps and started > max(cur.step_t.values())):
                launches.append(_Launch(started_at=started, last_t=t))
            else:
                cur.started_at = min(cur.started_at, started)
            continue
        if not launches:
            continue
        cur = launches[-1]
        name = rec.get("name") if kind == "event" else None
        if kind in ("metrics", "bye") or (kind == "event" and not str(name).startswith("diagnosis/")):
            cur.last_t = max(cur.last_t, t)     # the ranks' own records: the launch was alive then
        elif name == "diagnosis/rank_exited":
            # The daemon saw a rank's process gone (killed, crashed): the launch ended when it was
            # first seen gone, gone_for_s before the event.
            data = rec.get("data") if isinstance(rec.get("data"), dict) else {}
            cur.last_t = max(cur.last_t, t - max(0.0, _num(data.get("gone_for_s")) or 0.0))
        if kind == "metrics" and "rank" not in rec:
            step = rec.get("step")
            values = rec.get("values")
            if isinstance(step, int) and isinstance(values, dict) and _num(values.get("perf/step_time")) is not None:
                cur.steps[step] = values
                cur.step_t[step] = t
        elif kind == "event":
            data = rec.get("data") if isinstance(rec.get("data"), dict) else {}
            step, dur = data.get("step"), _num(data.get("duration_s"))
            if name == "checkpoint_saved" and isinstance(step, int) and dur is not None:
                cur.saves[step] = max(cur.saves.get(step, 0.0), dur)
                cur.save_t[step] = max(cur.save_t.get(step, 0.0), t)
            elif name == "checkpoint_restored" and dur is not None:
                cur.restore_s = max(cur.restore_s, dur)
                cur.restored_step = step if isinstance(step, int) else cur.restored_step
            elif name == "train_end":
                cur.ended = True
        if kind == "bye":
            cur.ended = True      # a rank closed its client: it left, it was not killed mid-step
    return launches, n


def ledger(records: Iterable[dict]) -> dict[str, Any]:
    """The ledger of a run's records (see the module docstring): seconds per bucket, wall,
    goodput, and what was counted."""
    launches, n = _launches(records)
    buckets = dict.fromkeys(BUCKETS, 0.0)
    out: dict[str, Any] = {"records": n, "launches": len(launches), "steps": 0, "steps_missing": 0}
    if not launches or not any(la.steps for la in launches):
        out.update(wall_s=0.0, goodput=None, buckets_s=buckets, note="no step records with perf/step_time")
        return out
    for i, la in enumerate(launches):
        nxt = launches[i + 1] if i + 1 < len(launches) else None
        # Steps this launch made after the checkpoint the next launch resumed from: done again.
        lost_after = None
        if nxt is not None and la.steps:
            lost_after = nxt.restored_step if nxt.restored_step is not None else 0
        for step, v in la.steps.items():
            st = _num(v.get("perf/step_time")) or 0.0
            if lost_after is not None and step > lost_after:
                buckets["redone"] += st
                continue
            data = _num(v.get("perf/data_loading_time")) or 0.0
            excess = max(0.0, _num(v.get("perf/straggler_excess_s")) or 0.0)
            if excess and _num(v.get("perf/straggler_phase_index")) == DATA_PHASE:
                # The slow rank's data loading is in the ranks' mean: what the others waited for
                # data is their median; its excess is the straggler's, counted once.
                data = _num(v.get("perf/straggler_median_s")) or 0.0
            data = min(st, data)
            strag = min(st - data, excess)
            buckets["productive"] += st - data - strag
            buckets["data_loading"] += data
            buckets["straggler"] += strag
            buckets["eval"] += _num(v.get("perf/eval_time")) or 0.0
        out["steps"] += len(la.steps)
        if la.steps:
            lo, hi = min(la.steps), max(la.steps)
            out["steps_missing"] += (hi - lo + 1) - len(la.steps)
        buckets["checkpoint_save"] += sum(la.saves.values())
        buckets["checkpoint_restore"] += la.restore_s
        if la.steps:
            first = min(la.steps)
            first_began = la.step_t[first] - (_num(la.steps[first].get("perf/step_time")) or 0.0)
            if i == 0:
                buckets["startup"] += max(0.0, first_began - la.started_at - la.restore_s)
            else:
                prev = launches[i - 1]
                buckets["recovery"] += max(0.0, first_began - prev.last_t - la.restore_s)
            if not la.ended:
                last = max(la.steps)
                after = sum(d for s, d in la.saves.items() if la.save_t[s] > la.step_t[last])
                buckets["hang"] += max(0.0, la.last_t - la.step_t[last] - after)
    wall = launches[-1].last_t - launches[0].started_at
    buckets["unexplained"] = wall - sum(v for k, v in buckets.items() if k != "unexplained")
    out.update(wall_s=wall, goodput=buckets["productive"] / wall if wall > 0 else None, buckets_s=buckets)
    return out


def text(led: dict[str, Any], name: str = "") -> str:
    """The ledger as a table, the biggest loss first, with what to do about it."""
    wall = led.get("wall_s") or 0.0
    if not wall:
        return f"goodput{' of ' + name if name else ''}: nothing to account ({led.get('note', 'no steps')})"
    b = led["buckets_s"]
    lines = [f"goodput{' of ' + name if name else ''}: {100 * led['goodput']:.1f} % of {wall:,.1f} s wall time "
             f"was training ({led['steps']:,} steps, {led['launches']} launch(es)"
             + (f", {led['steps_missing']:,} step(s) the daemon did not write" if led["steps_missing"] else "") + ")",
             f"  {'productive':<20} {b['productive']:>11,.2f} s  {100 * b['productive'] / wall:6.2f} %"]
    losses = sorted((k for k in BUCKETS if k != "productive"), key=lambda k: -abs(b[k]))
    for k in losses:
        lines.append(f"  {k:<20} {b[k]:>11,.2f} s  {100 * b[k] / wall:6.2f} %")
    top = losses[0]
    if b[top] > 0:
        lines.append(f"biggest loss: {ADVICE[top]}")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from telemetry.shared.config import nonempty_arg

    p.add_argument("run_dir", type=nonempty_arg, help="the run dir (holding telemetry/metrics.jsonl) or the telemetry dir")
    p.add_argument("--json", type=nonempty_arg, metavar="FILE", help="also write the ledger as JSON to FILE")


def run(args: argparse.Namespace) -> int:
    from telemetry.consumers.readjsonl import ReadStats, find_log_dir, read_records
    from telemetry.consumers.terminal import printable

    if not os.path.exists(args.run_dir):
        print(f"telemetry goodput: {args.run_dir}: no such file or directory", file=sys.stderr)
        return 2
    if args.json:
        from telemetry.shared.config import writable_dir_problem

        why = ("a directory, not a file" if os.path.isdir(args.json)
               else writable_dir_problem(os.path.dirname(os.path.abspath(args.json))))
        if why:
            print(f"telemetry goodput: --json {args.json}: {why}", file=sys.stderr)
            return 2
    try:
        log_dir = find_log_dir(args.run_dir)
    except FileNotFoundError as exc:
        print(f"telemetry goodput: {exc}", file=sys.stderr)
        return 2
    stats = ReadStats()
    led = ledger(read_records(log_dir, stats))
    print("\n".join(printable(line) for line in text(led, Path(args.run_dir).name).split("\n")))
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(led, indent=1) + "\n")
        except OSError as exc:
            print(f"telemetry goodput: --json {args.json}: {exc.strerror or exc}", file=sys.stderr)
            return 1
    return 0
