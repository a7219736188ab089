"""Plots, a one-page HTML summary and a text summary from a run's metrics.jsonl.

    telemetry report RUN_DIR [--out DIR]

RUN_DIR is the run dir (holding telemetry/metrics.jsonl) or the telemetry dir itself. Rotated
pieces (metrics.jsonl.1, .2, ...) are read oldest first; a torn last line is skipped. Writes,
into --out (default <telemetry dir>/report): loss.png (per dataset), eval.png (eval loss and
accuracy per dataset), training.png (lr, grad norm), throughput.png, mfu.png, step_time.png
(spread across ranks), phases.png (data loading, forward, backward, optimizer, stacked),
gpu.png (utilization, memory, power) or system.png (CPU and memory, when there are no GPU
records), metrics/<n>.png (a plot per metric none of those draws: the run's own keys first, by
prefix, then the catalogue's groups; at most MAX_METRIC_PLOTS), media/ (the run's kept media:
report_media.py), and index.html with the run's name, our summary and the run's own (a W&B
script's run.summary), its config and its diagnosis events. A plot without data is left out and
the page says why. Memory is bounded however long or wide the run (Held, MAX_KEYS). Time plots
leave a gap where the daemon was down. The daemon's counters are summed over every daemon of the
run (a resumed run has one per resume). On a terminal, a line on stderr shows how much of the
metrics is read, then the drawing (nothing when stderr is a pipe or a file).
"""
from __future__ import annotations

import argparse
import html
import json
import math
import os
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from telemetry.consumers.runend import how_ended
from telemetry.consumers.terminal import Progress
from telemetry.shared import files
from telemetry.shared.config import out_dir_arg, writable_dir_problem
from telemetry.shared.bookkeeping import SUMMARY_REMOVE_EVENT, drop_summary_paths, is_bookkeeping
from telemetry.shared.catalogue import OWN_GROUP, grouped
from telemetry.shared.numbers import is_number

# Plots draw at most this many points per line: a week-long run must still plot in seconds.
MAX_POINTS = 4000
# Loss lines are smoothed over about 1/SMOOTH_FRACTION of the run (an EMA with that span):
# a fixed weight would make a short run's curves lag by many steps.
SMOOTH_FRACTION = 50
# The first steps carry warm-up (allocation, compilation) and are left out of the medians.
WARMUP_FRACTION = 0.2
DPI = 110
# Values beyond this magnitude stay out of the plots and the medians (counted, said in the text):
# matplotlib's limit and tick arithmetic overflows on spans near the float range (±1e308 made
# savefig fail), and no metric of a training run is anywhere near it.
MAX_PLOT_ABS = 1e100
# Memory stays bounded however long or wide the run: a series holds at most SERIES_POINTS points
# (past it, every other point is let go and then every 2nd, 4th, ... arriving one is kept: a plot
# needs MAX_POINTS); its count, first, last, min and max stay exact. Points are held for the first
# MAX_SERIES_HELD step series; later ones keep only those figures (counted on the page), and a
# key past the first MAX_KEYS is not read at all (its values counted).
SERIES_POINTS = 2 * MAX_POINTS
MAX_SERIES_HELD = 1000
MAX_KEYS = 20_000
# The page draws one plot per metric no built-in plot draws, for at most this many; the rest are
# named in the table of every metric, their number said beside the plots.
MAX_METRIC_PLOTS = 96
# A metric's plot marks the steps of its first MAX_MARKS NaN/Inf values.
MAX_MARKS = 200
# The run's summary (run.summary, an integration's closing values): at most this many keys shown.
MAX_SUMMARY_KEYS = 200
MAX_SUMMARY_CHARS = 300


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="run dir holding telemetry/metrics.jsonl, or the telemetry dir")
    p.add_argument("--out", type=out_dir_arg, metavar="DIR", help="where the PNGs and index.html go (default <telemetry dir>/report)")


# -- reading -------------------------------------------------------------------------------------
class Held:
    """One series as the report holds it: its points (at most SERIES_POINTS, thinned evenly past
    that; none when `points` is False) and exact figures over every value it had: n, first,
    last, min, max, and how many were not finite (a NaN the daemon wrote as null, an Inf).
    Unpacks as (xs, ys), as the plots read a series."""

    __slots__ = ("xs", "ys", "stride", "num_seen", "n", "first", "last", "min", "max", "num_nonfinite",
                 "nonfinite_at")

    def __init__(self, x_type: str = "d", points: bool = True) -> None:
        from array import array

        self.xs, self.ys = (array(x_type), array("d")) if points else (None, None)
        self.stride, self.num_seen, self.n, self.num_nonfinite = 1, 0, 0, 0
        self.first = self.last = self.min = self.max = None
        self.nonfinite_at = array(x_type) if points else None   # the first MAX_MARKS of them, marked on its plot

    def add_nonfinite(self, x: float) -> None:
        self.num_nonfinite += 1
        if self.nonfinite_at is not None and len(self.nonfinite_at) < MAX_MARKS:
            self.nonfinite_at.append(x)

    def add(self, x: float, y: float) -> None:
        self.n += 1
        self.last = y
        if self.first is None:
            self.first = self.min = self.max = y
        elif y < self.min:
            self.min = y
        elif y > self.max:
            self.max = y
        if self.xs is None:
            return
        if self.num_seen % self.stride == 0:
            if len(self.ys) >= SERIES_POINTS:     # keep every other point, then every 2*stride-th
                del self.xs[1::2]
                del self.ys[1::2]
                self.stride *= 2
            if self.num_seen % self.stride == 0:
                self.xs.append(x)
                self.ys.append(y)
        self.num_seen += 1

    @property
    def held(self) -> bool:
        return self.xs is not None

    def __iter__(self):
        return iter((self.xs if self.xs is not None else [], self.ys if self.ys is not None else []))

    def __getitem__(self, i: int):
        return tuple(self)[i]


@dataclass
class RunData:
    """Everything a report needs, gathered in one pass over the records."""

    steps: dict[str, Held] = field(default_factory=dict)   # aggregated, by name
    step_numbers: set[int] = field(default_factory=set)
    summary: dict[str, Any] = field(default_factory=dict)   # run.summary: the wandb/summary events, merged
    num_summary_not_shown: int = 0
    num_values_not_read: int = 0     # values of keys past the first MAX_KEYS
    num_series_not_held: int = 0     # step series past the first MAX_SERIES_HELD: figures only
    rank_step_time: dict[int, tuple[list[int], list[float]]] = field(default_factory=dict)
    gpus: dict[tuple[str, int], dict[str, tuple[list[float], list[float]]]] = field(default_factory=dict)
    systems: dict[str, dict[str, tuple[list[float], list[float]]]] = field(default_factory=dict)
    events: list[dict] = field(default_factory=list)
    hellos: dict[int, dict] = field(default_factory=dict)
    daemon: dict[str, Any] = field(default_factory=dict)        # counters summed over the run's daemons
    num_daemons: int = 0
    num_steps_incomplete: int = 0
    num_unplottable: int = 0     # numbers left out: NaN, Inf or beyond ±MAX_PLOT_ABS
    t_first: float | None = None
    t_last: float | None = None
    goodput: dict[str, Any] = field(default_factory=dict)      # the goodput ledger (telemetry/shared/goodput.py)

    def series(self, name: str) -> tuple[Any, Any]:
        h = self.steps.get(name)
        return tuple(h) if h is not None else ([], [])


def _is_number(v: Any) -> bool:
    return is_number(v)


def _is_num(v: Any) -> bool:
    """A number a plot can take: finite and within ±MAX_PLOT_ABS."""
    return _is_number(v) and math.isfinite(v) and abs(v) <= MAX_PLOT_ABS


def _append(d: RunData, store: dict, key: Any, x: float, y: Any) -> None:
    if _is_num(y):
        h = store.get(key)
        if h is None:
            h = store[key] = Held()
        h.add(x, float(y))
    elif _is_number(y):
        d.num_unplottable += 1


def _append_step(d: RunData, key: str, step: int, y: Any) -> None:
    """A step value: held (up to MAX_KEYS keys, the first MAX_SERIES_HELD of them with their
    points); a NaN (null in the JSONL) or Inf counted against its key."""
    h = d.steps.get(key)
    if h is None:
        if y is not None and not _is_number(y):
            return       # text (W&B keeps strings in its history): nothing to plot
        if len(d.steps) >= MAX_KEYS:
            d.num_values_not_read += 1
            return
        held = len(d.steps) - d.num_series_not_held < MAX_SERIES_HELD
        d.num_series_not_held += not held
        h = d.steps[key] = Held("q", points=held)
    if _is_num(y):
        h.add(step, float(y))
    elif y is None or _is_number(y):
        h.add_nonfinite(step)
        d.num_unplottable += 1


def collect(records: Any) -> RunData:
    from telemetry.consumers.daemontotals import DaemonTotals

    from telemetry.shared.goodput import Ledger

    d = RunData()
    totals = DaemonTotals()
    ledger = Ledger()
    for rec in records:
        ledger.feed(rec)
        kind = rec.get("kind")
        t = rec.get("t")
        if _is_num(t):
            d.t_first = t if d.t_first is None else min(d.t_first, t)
            d.t_last = t if d.t_last is None else max(d.t_last, t)
        values = rec.get("values") if isinstance(rec.get("values"), dict) else {}
        if kind == "metrics":
            step = rec.get("step")
            if not isinstance(step, int):
                continue
            if "rank" in rec:
                if isinstance(rec["rank"], int):
                    _append(d, d.rank_step_time, rec["rank"], step, values.get("perf/step_time"))
                continue
            if not -2**63 <= step < 2**63:
                continue
            if rec.get("missing_ranks"):
                d.num_steps_incomplete += 1
            d.step_numbers.add(step)
            for k, v in values.items():
                _append_step(d, k, step, v)
        elif kind == "gpu" and _is_num(t):
            g = d.gpus.setdefault((str(rec.get("host", "?")), rec.get("gpu") if isinstance(rec.get("gpu"), int) else 0), {})
            for k, v in values.items():
                _append(d, g, k, t, v)
        elif kind == "system" and _is_num(t):
            s = d.systems.setdefault(str(rec.get("host", "?")), {})
            for k in ("system/cpu_percent", "system/memory_percent", "system/rss_gb"):
                _append(d, s, k, t, values.get(k))
        elif kind == "event":
            if rec.get("name") == SUMMARY_EVENT:
                _take_summary(d, rec.get("data"))
            elif rec.get("name") == SUMMARY_REMOVE_EVENT:
                drop_summary_paths(d.summary, rec.get("data"))
            elif not is_bookkeeping(rec.get("name")):
                d.events.append(rec)
        elif kind == "hello":
            if isinstance(rec.get("rank"), int) and isinstance(rec.get("info"), dict):
                d.hellos[rec["rank"]] = rec["info"]
        elif kind == "daemon":
            totals.consume(values, t)
    d.daemon = totals.totals()
    d.num_daemons = totals.num_daemons
    d.goodput = ledger.result()
    return d


# A W&B script's run.summary (the drop-in, the integrations): telemetry/integrations/wandb_run.py.
SUMMARY_EVENT = "wandb/summary"


def _take_summary(d: RunData, data: Any) -> None:
    """Merge one summary event (a later value of a key replaces an earlier one)."""
    if not isinstance(data, dict):
        return
    for k, v in data.items():
        if k in d.summary or len(d.summary) < MAX_SUMMARY_KEYS:
            d.summary[str(k)] = v
        else:
            d.num_summary_not_shown += 1


def run_name(d: RunData, fallback: str) -> str:
    """The run's name as its script named it: the hello's run_name, config.run_name, or
    wandb.init(name=...); else `fallback` (the run dir's name)."""
    for rank in sorted(d.hellos):
        info = d.hellos[rank]
        name = info.get("run_name")
        if not name and isinstance(info.get("config"), dict):
            name = info["config"].get("run_name")
        if not name and isinstance(info.get("wandb"), dict):
            name = info["wandb"].get("name")
        if name:
            return str(name)
    return fallback


# -- numbers -------------------------------------------------------------------------------------
def _steady(ys: list[float]) -> list[float]:
    return ys[int(len(ys) * WARMUP_FRACTION):] or ys


def summarize(d: RunData) -> dict[str, Any]:
    loss = d.steps.get("train/loss")
    first_step = min(d.step_numbers) if d.step_numbers else None
    last_step = max(d.step_numbers) if d.step_numbers else None
    tps = d.series("perf/tokens_per_second")[1]
    mfu = d.series("perf/mfu")[1]
    if not mfu and d.series("perf/mfu_percent")[1]:
        mfu = [m / 100 for m in d.series("perf/mfu_percent")[1]]
    st_max, st_min = d.series("perf/step_time_max")[1], d.series("perf/step_time_min")[1]
    if not st_max:
        st_max = d.series("perf/step_time")[1]
    spreads = [(a - b) / a for a, b in zip(st_max, st_min) if a > 0] if len(st_max) == len(st_min) else []
    diagnosis = [e for e in d.events if str(e.get("name", "")).startswith("diagnosis/")]
    return {
        "num_steps": len(d.step_numbers),
        "first_step": first_step,
        "last_step": last_step,
        "first_loss": loss.first if loss else None,
        "final_loss": loss.last if loss else None,
        "min_loss": loss.min if loss else None,
        "tokens_per_second_median": statistics.median(_steady(tps)) if tps else None,
        "mfu_median": statistics.median(_steady(mfu)) if mfu else None,
        "step_time_median_s": statistics.median(_steady(st_max)) if st_max else None,
        "step_time_spread_median": statistics.median(_steady(spreads)) if spreads else None,
        "num_steps_incomplete": d.num_steps_incomplete,
        "num_gpus": len(d.gpus),
        "num_events": len(d.events),
        "num_diagnosis_events": len(diagnosis),
        "num_daemons": d.num_daemons,
        # The last eval loss of each dataset (eval/<name>/loss; "eval" for a plain eval/loss).
        "eval_loss": {(k.split("/")[1] if k.count("/") == 2 else "eval"): d.steps[k].last
                      for k in sorted(d.steps) if k.startswith("eval/") and k.endswith("/loss") and d.steps[k].n},
        "records_in": d.daemon.get("telemetry/records_in"),
        "dropped": d.daemon.get("telemetry/records_lost"),
        "sink_dropped": d.daemon.get("telemetry/sink_dropped"),
        "duration_s": (d.t_last - d.t_first) if d.t_first is not None and d.t_last is not None else None,
    }


# -- plots ---------------------------------------------------------------------------------------
def _thin(xs: list, ys: list) -> tuple[list, list]:
    if len(xs) <= MAX_POINTS:
        return xs, ys
    stride = math.ceil(len(xs) / MAX_POINTS)
    return xs[::stride], ys[::stride]


def time_line(xs: list[float], ys: list[float]) -> tuple[list[float], list[float]]:
    """A time series ready to draw: thinned, and broken (NaN) where the records stop for longer
    than the poll interval allows (the daemon was down: no line across what nobody measured)."""
    import numpy as np

    from telemetry.consumers.series import insert_gaps

    xs, ys = _thin(xs, ys)
    gx, gy = insert_gaps(np.asarray(xs, dtype=float), np.asarray(ys, dtype=float))
    return gx.tolist(), gy.tolist()


def _span(n: int) -> int:
    return max(1, n // SMOOTH_FRACTION)


def _ema(ys: list[float], span: int) -> list[float]:
    """Bias-corrected exponential moving average over about `span` points (span 1 = as is)."""
    w = 1 - 2 / (span + 1)
    out, acc, norm = [], 0.0, 0.0
    for y in ys:
        acc = w * acc + (1 - w) * y
        norm = w * norm + (1 - w)
        out.append(acc / norm if norm else y)
    return out


def _figure(nrows: int = 1, height: float = 3.6, width: float = 9):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, 1, figsize=(width, height * nrows), squeeze=False, sharex=True)
    for ax in axes[:, 0]:
        ax.grid(True, alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
    return fig, list(axes[:, 0])


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    with os.fdopen(files.create_output(path), "wb") as f:    # never through a symlink at its name
        fig.savefig(f, format="png", dpi=DPI)
    plt.close(fig)
    return path


def plot_loss(d: RunData, out: Path) -> Path | None:
    steps, losses = d.series("train/loss")
    datasets = sorted(k for k in d.steps if k.startswith("dataset/") and k.endswith("/loss"))
    evals = sorted(k for k in d.steps if k.startswith("eval/") and k.endswith("loss"))
    if not steps and not datasets:
        return None
    fig, (ax,) = _figure(height=4.2)
    if steps:
        xs, ys = _thin(steps, losses)
        span = _span(len(ys))
        ax.plot(xs, ys, color="tab:blue", alpha=0.3 if span > 1 else 1.0, lw=1,
                label="train/loss" if span == 1 else "train/loss (raw)")
        if span > 1:
            ax.plot(xs, _ema(ys, span), color="tab:blue", lw=2, label=f"train/loss (smoothed over {span} points)")
    colors = {}
    for i, name in enumerate(datasets):
        xs, ys = _thin(*d.series(name))
        ys = _ema(ys, _span(len(ys)))
        ds = name.split("/")[1]
        colors[ds] = f"C{(i + 1) % 10}"
        ax.plot(xs, ys, lw=1.4, color=colors[ds], label=ds)
    for j, name in enumerate(evals):
        # An eval series takes its dataset's colour (eval/<name>/loss), as dashed line + points.
        xs, ys = d.series(name)
        parts = name.split("/")
        ds = parts[1] if len(parts) == 3 else None
        color = colors.get(ds, f"C{(len(datasets) + j + 1) % 10}")
        ax.plot(xs, ys, "o--", color=color, ms=5, lw=1, mec="black", mew=0.6,
                label=f"{ds} (eval)" if ds else name)
    ax.set_title("Loss" + (" per dataset" if datasets else ""), loc="left", fontweight="bold")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=8, ncol=2 if len(datasets) > 4 else 1, frameon=False)
    return _save(fig, out / "loss.png")


def _rolling_median(ys: list[float], window: int) -> list[float]:
    return [statistics.median(ys[max(0, i - window + 1):i + 1]) for i in range(len(ys))]


def plot_throughput(d: RunData, out: Path) -> Path | None:
    for name, label in (("perf/tokens_per_second", "tokens/s"), ("perf/samples_per_second", "samples/s"),
                        ("perf/steps_per_second", "steps/s")):
        steps, ys = d.series(name)
        if steps:
            break
    else:
        return None
    fig, (ax,) = _figure()
    xs, ys = _thin(steps, ys)
    ax.plot(xs, ys, color="tab:green", alpha=0.35, lw=1, label=label)
    if len(ys) > 10:
        ax.plot(xs, _rolling_median(ys, 10), color="tab:green", lw=2, label=f"{label}, rolling median of 10")
    med = statistics.median(_steady(ys))
    ax.axhline(med, color="grey", ls="--", lw=1)
    _label_line(ax, xs[-1], med, f"median {med:,.0f}")
    ax.set_title(f"Throughput ({label}, all ranks)", loc="left", fontweight="bold")
    ax.set_xlabel("step")
    ax.set_ylabel(label)
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(_si_formatter())
    ax.legend(fontsize=8, frameon=False, loc="lower right")
    return _save(fig, out / "throughput.png")


def _label_line(ax: Any, x: float, y: float, text: str) -> None:
    """A label on a horizontal reference line, on a white box so the data never hides it."""
    ax.annotate(text, (x, y), textcoords="offset points", xytext=(-4, 6), ha="right", fontsize=8, color="dimgrey",
                bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.85})


def _si_formatter():
    from matplotlib.ticker import FuncFormatter

    def fmt(x: float, _pos: Any) -> str:
        for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
            if abs(x) >= div:
                return f"{x / div:g}{suffix}"
        return f"{x:g}"

    return FuncFormatter(fmt)


def plot_mfu(d: RunData, out: Path) -> Path | None:
    steps, pct = d.series("perf/mfu_percent")
    if not steps:
        steps, frac = d.series("perf/mfu")
        pct = [f * 100 for f in frac]
    if not steps:
        return None
    fig, (ax,) = _figure()
    xs, ys = _thin(steps, pct)
    ax.plot(xs, ys, color="tab:purple", lw=1.2)
    med = statistics.median(_steady(ys))
    ax.axhline(med, color="grey", ls="--", lw=1)
    _label_line(ax, xs[-1], med, f"median {med:.1f} %")
    ax.set_title("Model FLOPs utilization (analytic)", loc="left", fontweight="bold")
    ax.set_xlabel("step")
    ax.set_ylabel("MFU (%)")
    ax.set_ylim(0, max(5.0, max(ys) * 1.2))
    return _save(fig, out / "mfu.png")


def plot_step_time(d: RunData, out: Path) -> Path | None:
    import matplotlib.pyplot as plt

    steps, st_max = d.series("perf/step_time_max")
    _, st_min = d.series("perf/step_time_min")
    if not steps:
        steps, st_max = d.series("perf/step_time")
        st_min = []
    if not steps:
        return None
    if len(st_min) != len(st_max) or all(a == b for a, b in zip(st_max, st_min)):
        st_min = []  # one rank: there is no spread to show
    # With per-rank records, a bar per rank beside the band says who the straggler is.
    per_rank = {r: statistics.fmean(ys) for r, (_, ys) in d.rank_step_time.items() if ys}
    if len(per_rank) > 1:
        fig, (ax, bars) = plt.subplots(1, 2, figsize=(9, 3.8), gridspec_kw={"width_ratios": [4, 1]})
    else:
        fig, (ax,) = _figure(height=3.8)
        bars = None
    for a in (ax, bars) if bars is not None else (ax,):
        a.grid(True, alpha=0.3)
        a.spines[["top", "right"]].set_visible(False)
    xs, ys = _thin(steps, st_max)
    if len(st_min) == len(st_max):
        _, lo = _thin(steps, st_min)
        ax.fill_between(xs, lo, ys, color="tab:orange", alpha=0.3, lw=0, label="spread across ranks")
        ax.plot(xs, lo, color="tab:blue", lw=0.8, label="fastest rank")
    ax.plot(xs, ys, color="tab:red", lw=1.0, label="slowest rank" if st_min else "step time")
    ax.set_title("Step time" + (" across ranks" if st_min else ""), loc="left", fontweight="bold")
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.legend(fontsize=8, frameon=False, loc="upper right", ncol=3)
    lo_y, hi_y = ax.get_ylim()
    ax.set_ylim(lo_y, hi_y + (hi_y - lo_y) * 0.15)  # room for the legend above the lines
    if bars is not None:
        ranks = sorted(per_rank)
        meds = [per_rank[r] for r in ranks]
        worst = max(meds)
        bars.barh([str(r) for r in ranks], meds, color=["tab:red" if m == worst else "tab:grey" for m in meds])
        bars.set_xlim(min(meds) * 0.9, worst * 1.05)
        bars.invert_yaxis()
        bars.set_title("mean per rank (s)", loc="left", fontsize=9)
        bars.set_ylabel("rank")
        bars.grid(True, axis="x", alpha=0.3)
    return _save(fig, out / "step_time.png")


def _time_axis(d: RunData) -> tuple[float, float, str]:
    """(t0, divisor, label): seconds for a short run, minutes, or hours for a long one."""
    t0 = d.t_first or 0.0
    span = (d.t_last or t0) - t0
    if span < 180:
        return t0, 1.0, "seconds since the first record"
    if span < 3 * 3600:
        return t0, 60.0, "minutes since the first record"
    return t0, 3600.0, "hours since the first record"


def _rel(ts: list[float], t0: float, div: float) -> list[float]:
    return [(t - t0) / div for t in ts]


def plot_gpus(d: RunData, out: Path) -> Path | None:
    if not d.gpus:
        return None
    t0, div, xlabel = _time_axis(d)
    has_power = any("gpu/power_w" in g for g in d.gpus.values())
    panels = [("gpu/util_percent", "utilization (%)"), ("gpu/memory_used_gb", "memory used (GB)")]
    if has_power:
        panels.append(("gpu/power_w", "power (W)"))
    fig, axes = _figure(len(panels), height=2.8)
    multi_host = len({h for h, _ in d.gpus}) > 1
    for i, ((host, idx), g) in enumerate(sorted(d.gpus.items())):
        label = f"{host}/{idx}" if multi_host else f"GPU {idx}"
        for ax, (key, _) in zip(axes, panels):
            if key in g:
                xs, ys = time_line(*g[key])
                ax.plot(_rel(xs, t0, div), ys, lw=1, color=f"C{i % 10}", label=label)
    for ax, (key, ylabel) in zip(axes, panels):
        ax.set_ylabel(ylabel)
    axes[0].set_ylim(0, 105)
    totals = [max(g["gpu/memory_total_gb"][1]) for g in d.gpus.values() if "gpu/memory_total_gb" in g]
    if totals:
        axes[1].axhline(max(totals), color="grey", ls="--", lw=1)
        _label_line(axes[1], axes[1].get_xlim()[1], max(totals), f"total {max(totals):.0f} GB")
        axes[1].set_ylim(0, max(totals) * 1.08)
    axes[0].set_title("GPUs", loc="left", fontweight="bold")
    axes[-1].set_xlabel(xlabel)
    if len(d.gpus) <= 16:
        axes[0].legend(fontsize=7, frameon=False, ncol=min(8, len(d.gpus)), loc="lower left")
    return _save(fig, out / "gpu.png")


def plot_system(d: RunData, out: Path) -> Path | None:
    if not d.systems:
        return None
    t0, div, xlabel = _time_axis(d)
    fig, axes = _figure(2, height=2.6)
    for i, (host, s) in enumerate(sorted(d.systems.items())):
        for ax, key in zip(axes, ("system/cpu_percent", "system/memory_percent")):
            if key in s:
                xs, ys = time_line(*s[key])
                ax.plot(_rel(xs, t0, div), ys, lw=1, color=f"C{i % 10}", label=host)
    axes[0].set_ylabel("CPU (%)")
    axes[1].set_ylabel("memory (%)")
    for ax in axes:
        ax.set_ylim(0, 105)
    axes[0].set_title("Host (no GPU records in this run)", loc="left", fontweight="bold")
    axes[-1].set_xlabel(xlabel)
    axes[0].legend(fontsize=8, frameon=False, loc="lower left")
    return _save(fig, out / "system.png")


def plot_eval(d: RunData, out: Path) -> Path | None:
    """Eval loss and accuracy per dataset (eval/<name>/loss, eval/<name>/accuracy; eval/loss)."""
    def names(metric: str) -> list[str]:
        return sorted(k for k in d.steps if k.startswith("eval/") and k.split("/")[-1] == metric)

    panels = [(m, names(m)) for m in ("loss", "accuracy") if names(m)]
    if not panels:
        return None
    fig, axes = _figure(len(panels), height=3.0)
    for ax, (metric, keys) in zip(axes, panels):
        for i, key in enumerate(keys):
            parts = key.split("/")
            label = parts[1] if len(parts) == 3 else "eval"
            ax.plot(*d.series(key), "o-", ms=4, lw=1.2, color=f"C{i % 10}", label=label)
        ax.set_ylabel(metric)
        ax.legend(fontsize=8, frameon=False, ncol=min(4, len(keys)))
    axes[0].set_title("Eval per dataset", loc="left", fontweight="bold")
    axes[-1].set_xlabel("step")
    return _save(fig, out / "eval.png")


def plot_training(d: RunData, out: Path) -> Path | None:
    """Learning rate and gradient norm against the step."""
    panels = [(k, label) for k, label in (("train/lr", "learning rate"), ("train/grad_norm", "grad norm"))
              if d.series(k)[0]]
    if not panels:
        return None
    fig, axes = _figure(len(panels), height=2.6)
    for ax, (key, label), color in zip(axes, panels, ("tab:olive", "tab:brown")):
        xs, ys = _thin(*d.series(key))
        ax.plot(xs, ys, lw=1.2, color=color)
        ax.set_ylabel(label)
    axes[0].set_title("Optimizer: " + " and ".join(label for _, label in panels), loc="left", fontweight="bold")
    axes[-1].set_xlabel("step")
    return _save(fig, out / "training.png")


PHASES = (("perf/data_loading_time", "data loading"), ("perf/forward_time", "forward"),
          ("perf/backward_time", "backward"), ("perf/optimizer_time", "optimizer"))


def plot_phases(d: RunData, out: Path) -> Path | None:
    """Where a step's time goes, stacked: data loading, forward, backward, optimizer."""
    present = [(k, label) for k, label in PHASES if d.series(k)[0]]
    if not present:
        return None
    # Steps where every present phase has a value, so the bands stack on the same steps.
    by_key = {k: dict(zip(*d.series(k))) for k, _ in present}
    steps = sorted(set.intersection(*(set(v) for v in by_key.values())))
    if not steps:
        return None
    steps = _thin(steps, steps)[0]
    fig, (ax,) = _figure(height=3.4)
    ax.stackplot(steps, [[by_key[k][s] for s in steps] for k, _ in present],
                 labels=[label for _, label in present], colors=["#93c5fd", "#fca5a5", "#86efac", "#fcd34d"],
                 alpha=0.9)
    st = d.series("perf/step_time")
    if st[0]:
        xs, ys = _thin(*st)
        ax.plot(xs, ys, color="black", lw=0.8, label="step time")
    ax.set_title("Step phases (stacked)", loc="left", fontweight="bold")
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, frameon=False, loc="upper right", ncol=5)
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi * 1.15)   # room for the legend
    return _save(fig, out / "phases.png")


PLOTS = (("loss", plot_loss, "no train/loss or dataset/*/loss values"),
         ("eval", plot_eval, "no eval/*/loss or eval/*/accuracy values"),
         ("training", plot_training, "no train/lr or train/grad_norm values"),
         ("throughput", plot_throughput, "no perf/tokens_per_second (the ranks sent no perf/tokens)"),
         ("mfu", plot_mfu, "no perf/mfu (no model config in the hello, or an unknown GPU peak)"),
         ("step_time", plot_step_time, "no perf/step_time values"),
         ("phases", plot_phases, "no perf/forward_time, backward, optimizer or data_loading times"),
         ("gpu", plot_gpus, "no GPU records (no NVML on this machine)"),
         ("system", plot_system, None))


def builtin_drawn(d: RunData) -> set[str]:
    """The step metrics the built-in plots above draw (PLOTS): they get no plot of their own."""
    keys = {"train/loss", "train/lr", "train/grad_norm", "perf/mfu_percent", "perf/mfu", "perf/step_time",
            "perf/step_time_max", "perf/step_time_min"} | {k for k, _ in PHASES}
    keys |= {k for k in d.steps if (k.startswith("dataset/") and k.endswith("/loss"))
             or (k.startswith("eval/") and (k.endswith("loss") or k.split("/")[-1] == "accuracy"))}
    for k in ("perf/tokens_per_second", "perf/samples_per_second", "perf/steps_per_second"):
        if d.series(k)[0]:      # the throughput plot draws the first of these the run has
            keys.add(k)
            break
    return keys


def metric_sections(d: RunData) -> list[tuple[str, list[str], bool]]:
    """The step metrics no built-in plot draws, in sections as the dashboard has them: the run's
    own names first, a section per prefix (the part before the first "/"; names without one
    last, under "other metrics"), then the catalogue's groups in its order (training and perf
    first, GPU, host and the daemon's own last)."""
    drawn = builtin_drawn(d)
    own: dict[str, list[str]] = {}
    builtin: dict[str, list[str]] = {}
    for group, k, _unit in grouped(d.steps):
        if k in drawn:
            continue
        if group == OWN_GROUP:
            own.setdefault(k.split("/")[0] + "/" if "/" in k else "", []).append(k)
        else:
            builtin.setdefault(group, []).append(k)
    sections = [(f"{p} (logged by the run)" if p else "other metrics (logged by the run)", keys, True)
                for p, keys in sorted(own.items(), key=lambda pk: (pk[0] == "", pk[0]))]
    return sections + [(group, keys, False) for group, keys in builtin.items()]


def plot_metric(d: RunData, key: str, unit: str, path: Path) -> Path | None:
    """One metric against the step: a line (markers for a few points), its unit on the axis."""
    xs, ys = d.series(key)
    if not len(xs):
        return None
    fig, (ax,) = _figure(height=2.8, width=4.6)
    xs, ys = _thin(xs, ys)
    ax.plot(xs, ys, "o-" if len(xs) <= 12 else "-", ms=3.5, lw=1.2, color="tab:blue")
    h = d.steps[key]
    for i, x in enumerate(h.nonfinite_at or ()):     # where the value was NaN or Inf: a red mark
        ax.axvline(x, color="tab:red", alpha=0.5, lw=0.8, ls=":", label="NaN/Inf" if i == 0 else None)
    if h.nonfinite_at:
        ax.legend(fontsize=7, frameon=False)
    ax.set_title(key, loc="left", fontsize=10, fontweight="bold")
    ax.set_xlabel("step", fontsize=8)
    if unit:
        ax.set_ylabel(unit, fontsize=8)
    ax.tick_params(labelsize=8)
    ax.yaxis.set_major_formatter(_si_formatter())
    return _save(fig, path)


Section = tuple[str, list[tuple[str, "Path | None"]], bool]   # title, (key, its plot), the run's own


def plot_metrics(d: RunData, out: Path) -> tuple[list[Section], dict[bool, int]]:
    """A plot per metric of metric_sections, into out/metrics/<n>.png (numbered: names are the
    run's data, never a path), at most MAX_METRIC_PLOTS; returns the sections with each key's
    plot (None: not plotted, no finite value or no points held) and how many were left out
    ({True: of the run's own, False: of the catalogue's})."""
    from telemetry.shared.catalogue import lookup

    sections, n, left_out = [], 0, {True: 0, False: 0}
    for title, keys, own in metric_sections(d):
        shown = []
        for k in keys:
            if n >= MAX_METRIC_PLOTS:
                left_out[own] += 1
                continue
            if n == 0:
                files.output_dir(out / "metrics")
            m = lookup(k)
            path = plot_metric(d, k, m.unit if m is not None else "", out / "metrics" / f"{n}.png")
            n += path is not None
            shown.append((k, path))
        if shown:
            sections.append((title, shown, own))
    return sections, left_out


# -- the page ------------------------------------------------------------------------------------
def _flatten(d: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Nested config as dotted (key, value) rows."""
    if isinstance(d, dict) and d:
        out: list[tuple[str, Any]] = []
        for k, v in d.items():
            out += _flatten(v, f"{prefix}{k}.")
        return out
    return [(prefix.rstrip("."), d)] if prefix else []


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return html.escape(f"{v:.6g}")
    if isinstance(v, (list, dict)):
        return html.escape(json.dumps(v))
    return html.escape(str(v))


def _when(t: Any) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if _is_num(t) else ""


def write_html(out: Path, name: str, log_dir: Path, d: RunData, s: dict, images: list[Path],
               missing: list[str], read_note: str,
               metric_plots: tuple[list[Section], dict[bool, int]] = ([], {True: 0, False: 0}),
               media_html: str = "") -> Path:
    e = html.escape
    rows = [("steps", f"{s['num_steps']} ({s['first_step']} … {s['last_step']})" if s["num_steps"] else "none"),
            ("loss", f"{_f(s['first_loss'], '.4f')} → {_f(s['final_loss'], '.4f')} (min {_f(s['min_loss'], '.4f')})"),
            ("tokens/s (median)", _f(s["tokens_per_second_median"], ",.0f")),
            ("MFU (median)", "—" if s["mfu_median"] is None else f"{s['mfu_median'] * 100:.1f} %"),
            ("step time (median)", _f(s["step_time_median_s"], ".3f", " s")),
            ("step-time spread across ranks (median)",
             "—" if s["step_time_spread_median"] is None else f"{s['step_time_spread_median'] * 100:.1f} %"),
            ("eval loss (last)", ", ".join(f"{k} {v:.4f}" for k, v in s["eval_loss"].items()) or "—"),
            ("steps missing a rank", str(s["num_steps_incomplete"])),
            ("GPUs", str(s["num_gpus"])),
            ("duration", "—" if s["duration_s"] is None else f"{s['duration_s'] / 60:.1f} min"),
            ("records in / dropped / sink dropped",
             f"{_f(s['records_in'])} / {_f(s['dropped'])} / {_f(s['sink_dropped'])}"
             + (f" (over {s['num_daemons']} daemon runs)" if s["num_daemons"] > 1 else "")),
            ("events (diagnosis)", f"{s['num_events']} ({s['num_diagnosis_events']})"),
            *(("at the drain", line) for line in s.get("at_drain", ())),
            ("source", f"{log_dir}{read_note}")]
    # A figure the run has no data for is not a row (a W&B script has no loss or MFU of ours).
    absent = {"loss": s["first_loss"], "tokens/s (median)": s["tokens_per_second_median"],
              "MFU (median)": s["mfu_median"], "step time (median)": s["step_time_median_s"],
              "step-time spread across ranks (median)": s["step_time_spread_median"],
              "eval loss (last)": s["eval_loss"] or None}
    rows = [(k, v) for k, v in rows if k not in absent or absent[k] is not None]
    summary = "\n".join(f"<tr><th>{e(k)}</th><td>{e(str(v))}</td></tr>" for k, v in rows)

    hello = d.hellos.get(min(d.hellos)) if d.hellos else {}
    cfg_rows = []
    for key in ("host", "world_size", "device_name", "python"):
        if key in hello:
            cfg_rows.append((key, hello[key]))
    cfg_rows += _flatten(hello.get("config", {}), "config.")
    wandb_info = hello.get("wandb") if isinstance(hello.get("wandb"), dict) else {}
    cfg_rows += [(f"wandb.{k}", v) for k, v in wandb_info.items()
                 if k in ("project", "name", "entity", "group", "tags", "notes", "job_type", "id")]
    model = hello.get("model") if isinstance(hello.get("model"), dict) else {}
    cfg_rows += [(k, v) for k, v in _flatten({k: v for k, v in model.items() if k != "hf_config"}, "model.")]
    hf = model.get("hf_config") if isinstance(model.get("hf_config"), dict) else {}
    for key in ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "vocab_size", "n_embd", "n_layer", "n_head"):
        if key in hf:
            cfg_rows.append((f"model.hf_config.{key}", hf[key]))
    config = "\n".join(f"<tr><th>{e(k)}</th><td>{_cell(v)}</td></tr>" for k, v in cfg_rows) \
        or '<tr><td class="dim">no hello record: the ranks never described the run</td></tr>'

    def event_rows(evs: list[dict]) -> str:
        out = []
        for ev in evs:
            data = ev.get("data") if isinstance(ev.get("data"), dict) else {}
            sev = str(data.get("severity", ""))
            msg = data.get("message") or ", ".join(f"{k}={_cell(v)}" for k, v in data.items())
            if data.get("bundle"):
                msg = f"{msg} [forensics: {data['bundle']}]"
            out.append(f'<tr class="{e(sev)}"><td>{e(_when(ev.get("t")))}</td><td>{e(str(ev.get("rank", "")))}</td>'
                       f"<td>{e(str(ev.get('name')))}</td><td>{e(sev)}</td><td>{e(str(msg))}</td></tr>")
        return "\n".join(out)

    diag = [ev for ev in d.events if str(ev.get("name", "")).startswith("diagnosis/")]
    diag.sort(key=lambda ev: _data(ev).get("severity") != "critical")   # hangs and crashes first
    other = [ev for ev in d.events if not str(ev.get("name", "")).startswith("diagnosis/")]
    head = "<tr><th>time</th><th>rank</th><th>event</th><th>severity</th><th>message</th></tr>"
    diag_html = f"<table class='ev'>{head}{event_rows(diag)}</table>" if diag else \
        '<p class="dim">No diagnosis events: no rule fired.</p>'
    other_html = f"<h2>Other events ({len(other)})</h2><table class='ev'>{head}{event_rows(other[-200:])}</table>" \
        if other else ""
    goodput_html = _goodput_html(d.goodput)
    sections, left_out = metric_plots
    own_html = _metric_plots_html(d, [x for x in sections if x[2]], left_out[True], "Your metrics")
    more_html = _metric_plots_html(d, [x for x in sections if not x[2]], left_out[False],
                                   "More series (built-in names no plot above draws)")
    if not any(p.stem not in ("gpu", "system") for p in images):
        # A run without the trainer's metric names (a W&B script): one line, not a list of
        # plots it could never have.
        missing = ["the training plots (loss, optimizer, throughput, MFU, step time, phases) draw the trainer's "
                   "metric names (docs/metrics.md); this run logged none of them"]
    run_summary = _summary_html(d)
    missing_html = "".join(f"<li>{e(m)}</li>" for m in missing)
    imgs = "\n".join(f'<figure><img src="{e(p.name)}" alt="{e(p.stem)}"></figure>' for p in images)
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Run {e(name)}: telemetry report</title>
<style>
body {{ font: 14px/1.45 system-ui, sans-serif; max-width: 1000px; margin: 2em auto; padding: 0 1em; color: #222; }}
h1 {{ margin-bottom: 0.1em; }} h2 {{ margin-top: 1.6em; border-bottom: 1px solid #ddd; }}
table {{ border-collapse: collapse; }} th, td {{ text-align: left; padding: 2px 10px 2px 0; vertical-align: top; }}
th {{ font-weight: 600; white-space: nowrap; }} .dim {{ color: #777; }}
table.ev td {{ border-top: 1px solid #eee; }} tr.warning td {{ background: #fff8e1; }}
tr.critical td {{ background: #ffebee; }} figure {{ margin: 1em 0; }} img {{ max-width: 100%; }}
.cols {{ display: flex; gap: 3em; flex-wrap: wrap; }}
.grid {{ display: flex; flex-wrap: wrap; gap: 0 1em; }} figure.metric {{ width: 480px; margin: 0.5em 0; }}
figure.metric figcaption, figcaption {{ color: #777; font-size: 12px; }}
div.media img {{ image-rendering: pixelated; min-width: 96px; }}
</style></head><body>
<h1>Run {e(name)}</h1>
<p class="dim">telemetry report, {e(_when(d.t_first))} – {e(_when(d.t_last))}</p>
<div class="cols"><div><h2>Summary</h2><table>{summary}</table></div>{run_summary}</div>
{own_html}
{media_html}
{goodput_html}
<h2>Diagnosis ({len(diag)})</h2>
{diag_html}
<h2>Plots</h2>
{imgs}
{"<p class='dim'>Not plotted:</p><ul class='dim'>" + missing_html + "</ul>" if missing else ""}
{more_html}
{_metrics_html(d)}
{other_html}
<h2>Config</h2>
<table>{config}</table>
</body></html>
"""
    path = out / "index.html"
    with os.fdopen(files.create_output(path), "w", encoding="utf-8") as f:
        f.write(page)
    return path


# The table of every metric shows at most this many rows (the page of a run with 20,000 keys
# stays readable); the rest are counted under it.
MAX_TABLE_ROWS = 2000


def _metrics_html(d: RunData) -> str:
    """Every metric of the run's steps, grouped and with units as the catalogue says (the run's
    own first): steps seen, first, last, min, max (exact, over every value), NaN/Inf."""
    e = html.escape
    rows, last_group = [], None
    every = grouped(d.steps)
    for group, k, unit in every[:MAX_TABLE_ROWS]:
        h = d.steps[k]
        u = f" {unit}" if unit else ""
        cells = "".join(f"<td>{e(_f(v, '.5g', u))}</td>" for v in (h.first, h.last, h.min, h.max))
        rows.append(f"<tr><th>{e(group) if group != last_group else ''}</th><td>{e(k)}</td><td>{h.n}</td>{cells}"
                    f"<td>{h.num_nonfinite or ''}</td></tr>")
        last_group = group
    if not rows:
        return ""
    head = ("<tr><th>group</th><th>metric</th><th>steps</th><th>first</th><th>last</th><th>min</th><th>max</th>"
            "<th>NaN/Inf</th></tr>")
    notes = []
    if len(every) > MAX_TABLE_ROWS:
        notes.append(f"{len(every) - MAX_TABLE_ROWS:,} more metric(s) not listed (at most {MAX_TABLE_ROWS:,})")
    if d.num_values_not_read:
        notes.append(f"{d.num_values_not_read:,} value(s) of keys past the first {MAX_KEYS:,} not read")
    note = f"<p class='dim'>{e('; '.join(notes))}</p>" if notes else ""
    return f"<h2>Every metric ({len(every)})</h2><table class='ev'>{head}{''.join(rows)}</table>{note}"


def _metric_plots_html(d: RunData, sections: list[Section], left_out: int, heading: str) -> str:
    """A plot per metric no built-in plot draws, in the sections metric_sections gives."""
    e = html.escape
    parts = []
    for title, shown, _own in sections:
        figs = []
        for k, path in shown:
            h = d.steps[k]
            notes = [f"{h.n:,} point(s)"]
            if h.num_nonfinite:
                notes.append(f"{h.num_nonfinite:,} NaN/Inf not drawn")
            if path is None:
                why = "no finite value" if not h.n else "its points were not held (too many series)"
                figs.append(f"<figure class='metric'><p><b>{e(k)}</b></p><figcaption>not plotted: {why}; "
                            f"{e(', '.join(notes))}</figcaption></figure>")
                continue
            rel = f"{path.parent.name}/{path.name}"
            figs.append(f'<figure class="metric"><img src="{e(rel)}" alt="{e(k)}">'
                        f"<figcaption>{e(', '.join(notes))}</figcaption></figure>")
        parts.append(f"<h3>{e(title)}</h3><div class='grid'>{''.join(figs)}</div>")
    more = (f"<p class='dim'>{left_out:,} more metric(s) not plotted (at most {MAX_METRIC_PLOTS} plots); "
            "every metric is in the table below</p>") if left_out else ""
    if not parts and not more:
        return ""
    return f"<h2>{e(heading)}</h2>{more}{''.join(parts)}"


def _summary_html(d: RunData) -> str:
    """The run's own summary (run.summary in a W&B script), beside ours."""
    if not d.summary:
        return ""
    e = html.escape
    rows = "".join(f"<tr><th>{e(k)}</th><td>{_summary_value(v)}</td></tr>" for k, v in d.summary.items())
    more = f"<p class='dim'>{d.num_summary_not_shown} more value(s) not shown</p>" if d.num_summary_not_shown else ""
    return f"<div><h2>Run summary</h2><table>{rows}</table>{more}</div>"


def _summary_text(v: Any) -> str:
    """A summary value as text, at most MAX_SUMMARY_CHARS (a number as the config's are)."""
    if isinstance(v, float):
        text = f"{v:.6g}"
    elif isinstance(v, str):
        text = v
    else:
        text = json.dumps(v, default=str)
    return text if len(text) <= MAX_SUMMARY_CHARS else text[:MAX_SUMMARY_CHARS] + "…"


def _summary_value(v: Any) -> str:
    return html.escape(_summary_text(v))


def _goodput_html(led: dict[str, Any]) -> str:
    """Where the run's wall-clock time went: the goodput ledger's buckets, the biggest loss first,
    with what to do about it."""
    from telemetry.shared.goodput import ADVICE, BUCKETS, lowest_first, rank_counters

    wall = led.get("wall_s") or 0.0
    if not wall:
        return ""
    b = led["buckets_s"]
    e = html.escape
    rows = [("productive", b["productive"], "")] + sorted(
        ((k, b[k], ADVICE.get(k, "")) for k in BUCKETS if k != "productive"), key=lambda r: -abs(r[1]))
    body = "\n".join(f"<tr><th>{e(k)}</th><td>{v:,.1f} s</td><td>{100 * v / wall:.1f} %</td>"
                     f"<td class='dim'>{e(advice) if v > 0 else ''}</td></tr>" for k, v, advice in rows)
    extra = f", {led['steps_missing']:,} step(s) the daemon did not write" if led.get("steps_missing") else ""
    ranks = ""
    if led.get("ranks"):    # each rank's own ledger, the lowest first
        shown = lowest_first(led["ranks"])
        lost = rank_counters(led)
        note = ("<p class='dim'>incomplete: " + e(", ".join(f"{k} {v:,}" for k, v in lost.items()))
                + " (per-rank records the per-rank ledgers could not count)</p>") if lost else ""
        ranks = ("<h3>Per rank (from its own process start), the lowest goodput first</h3>" + note + "<table>"
                 "<tr><th>rank</th><td>goodput</td><td>waited for other ranks</td><td>data loading</td>"
                 "<td>wall time</td></tr>" + "\n".join(
                     f"<tr><th>{e(str(r))}</th><td>{100 * (rl['goodput'] or 0.0):.1f} %</td>"
                     f"<td>{rl['buckets_s']['straggler']:,.2f} s</td><td>{rl['buckets_s']['data_loading']:,.2f} s</td>"
                     f"<td>{rl['wall_s']:,.1f} s</td></tr>" for r, rl in shown) + "</table>")
    return (f"<h2>Where the time went: goodput {100 * led['goodput']:.1f} %</h2>"
            f"<p class='dim'>{wall:,.1f} s of wall time, {led['steps']:,} steps, {led['launches']} launch(es){e(extra)}; "
            f"telemetry goodput RUN_DIR says the same</p><table>{body}</table>{ranks}")


def _f(x: Any, spec: str = "", unit: str = "") -> str:
    return "—" if x is None else format(x, spec) + unit


def text_summary(name: str, s: dict, d: RunData) -> str:
    # A figure the run has no data for is not a line (a W&B script has no loss or MFU of ours).
    figures = [(s["first_loss"], f"  loss               {_f(s['first_loss'], '.4f')} -> {_f(s['final_loss'], '.4f')}"),
               (s["eval_loss"] or None,
                "  eval loss (last)   " + ", ".join(f"{k} {v:.4f}" for k, v in s["eval_loss"].items())),
               (s["tokens_per_second_median"], f"  tokens/s (median)  {_f(s['tokens_per_second_median'], ',.0f')}"),
               (s["mfu_median"], f"  MFU (median)       {format((s['mfu_median'] or 0) * 100, '.1f')} %"),
               (s["step_time_median_s"], f"  step time (median) {_f(s['step_time_median_s'], '.3f', ' s')}"
                + ("" if s["step_time_spread_median"] is None
                   else f"  (spread across ranks {s['step_time_spread_median'] * 100:.1f} %)"))]
    lines = [f"run {name}",
             f"  steps              {s['num_steps']} (last {_f(s['last_step'])})",
             *(line for value, line in figures if value is not None),
             f"  records in         {_f(s['records_in'])}  dropped {_f(s['dropped'])}"
             + (f"  (over {s['num_daemons']} daemon runs)" if s["num_daemons"] > 1 else ""),
             f"  events             {s['num_events']} ({s['num_diagnosis_events']} diagnosis)"]
    ended = how_ended(d.events)
    if ended:
        lines.append(f"  ended              {ended}")
    lines += [f"  at the drain       {line}" for line in s.get("at_drain", ())]
    own = [(k, d.steps[k]) for group, k, _ in grouped(d.steps) if group == OWN_GROUP and d.steps[k].n]
    if own:
        lines.append("  your metrics       " + ", ".join(f"{k} {h.last:.5g}" for k, h in own[:8])
                     + (f" (last values; {len(own) - 8} more on the page)" if len(own) > 8 else " (last values)"))
    if d.summary:
        shown = list(d.summary.items())[:8]
        lines.append("  summary            " + ", ".join(f"{k} {_summary_text(v)[:80]}" for k, v in shown)
                     + (f" (and {len(d.summary) - len(shown)} more)" if len(d.summary) > len(shown) else ""))
    if d.goodput.get("wall_s"):
        from telemetry.shared.goodput import text as goodput_text

        lines += ["  " + line for line in goodput_text(d.goodput).split("\n")]
    diag = [ev for ev in d.events if str(ev.get("name", "")).startswith("diagnosis/")]
    # Hangs and crashes (critical, with a forensics bundle) are listed whatever came after them.
    critical = [ev for ev in diag if _data(ev).get("severity") == "critical"]
    for ev in critical + [ev for ev in diag if ev not in critical][-5:]:
        data = _data(ev)
        bundle = f" [forensics: {data['bundle']}]" if data.get("bundle") else ""
        mark = "!!" if ev in critical else "  "
        lines.append(f"  {mark}{ev.get('name')}: {data.get('message', '')}{bundle}")
    return "\n".join(lines)


def _data(ev: dict) -> dict:
    data = ev.get("data")
    return data if isinstance(data, dict) else {}


# -- the command ---------------------------------------------------------------------------------
def make_report(run_dir: str | Path, out: str | Path | None = None,
                progress: Progress | None = None) -> dict[str, Any]:
    """Read a run's metrics and write the plots and index.html; return what was made.
    progress: where to show how far the reading is, then the drawing (a terminal's stderr)."""
    import matplotlib

    matplotlib.use("Agg")  # never a window, never a display: this runs on servers and in CI
    from telemetry.consumers import report_media
    from telemetry.consumers.readjsonl import (FILE_NAME, ReadStats, find_log_dir, history_bytes, read_records,
                                               run_dir_of)
    from telemetry.shared.goodput import with_ranks_file

    log_dir = find_log_dir(run_dir)
    out_dir = Path(out) if out else log_dir / "report"
    if out:
        # Ours, and no one else's to write: every file goes in new (files.create_output), never
        # through a symlink someone put at its name.
        files.output_dir(out_dir)
    else:
        # Inside the run: as private as its files (0700 unless configured), and ours (run() has
        # refused a symlink there and another user's run).
        files.make_dir(out_dir, own=True)
    stats = ReadStats()
    on_chunk = None
    if progress is not None and progress.on:
        total_mb = max(history_bytes(log_dir), 1) / 2**20

        def on_chunk() -> None:
            done_mb = stats.num_bytes / 2**20
            mb = ",.1f" if total_mb < 10 else ",.0f"
            progress.show(f"reading {FILE_NAME} {min(100, 100 * done_mb / total_mb):3.0f} % "
                          f"({done_mb:{mb}} of {total_mb:{mb}} MB)")
    d = collect(read_records(log_dir, stats, on_chunk))
    if progress is not None:
        progress.show("drawing the plots", now=True)
    d.goodput = with_ranks_file(d.goodput, log_dir)     # per rank, where the daemon kept them apart
    name = run_name(d, run_dir_of(log_dir).name)
    s = summarize(d)
    s["at_drain"] = drain_problems(log_dir)
    images, missing = [], []
    # Names are data: a dataset called "$x^2$" is drawn as written, never parsed as mathtext
    # (an unbalanced "$" made savefig raise) nor handed to LaTeX.
    with matplotlib.rc_context({"text.parse_math": False, "text.usetex": False}):
        for key, fn, why in PLOTS:
            if key == "system" and d.gpus:
                continue
            path = fn(d, out_dir)
            if path is not None:
                images.append(path)
            elif why:
                missing.append(f"{key}: {why}")
        metric_plots = plot_metrics(d, out_dir)
        media_html = report_media.html_section(report_media.read_index(log_dir), log_dir, out_dir)
    notes = []
    if stats.num_files > 1:
        notes.append(f"{stats.num_files} files (rotated)")
    if stats.num_torn:
        notes.append("a torn last line skipped")
    if stats.num_bad:
        notes.append(f"{stats.num_bad} unreadable lines skipped")
    if stats.num_not_regular:
        notes.append(f"{stats.num_not_regular} metrics file(s) not read: not a regular file")
    read_note = f" ({', '.join(notes)})" if notes else ""
    page = write_html(out_dir, name, log_dir, d, s, images, missing, read_note, metric_plots, media_html)
    return {"name": name, "log_dir": log_dir, "out": out_dir, "html": page, "images": images,
            "metric_plots": [p for _, shown, _ in metric_plots[0] for _, p in shown if p is not None],
            "missing": missing, "summary": s, "data": d, "read": stats}


def drain_problems(log_dir: Path) -> list[str]:
    """What the last daemon's final counters (drain.json) say was lost or not made, in words (the
    W&B run refused, records unread at the deadline, sinks closed short): metrics.jsonl does not
    say it. [] without a drain.json (a daemon killed, an older run); a drain.json that cannot be
    read is one line saying so and why (what it would have said is not known)."""
    from telemetry.consumers.drain import problem_lines, read_final

    final, why = read_final(log_dir / "drain.json")
    if why:
        return [f"drain.json could not be read: {why}; the daemon's final counters are not in this report"]
    return problem_lines(final)


def _default_out_problem(log_dir: Path) -> str | None:
    """Why the report may not go to its default place, <log_dir>/report: another user's run (they
    could put a symlink of theirs there, or at index.html, and have the report overwrite a file
    of the reader's), or a symlink at report/ (never followed). None if it may."""
    out = log_dir / "report"
    if out.is_symlink():
        return f"{out} is a symlink (not followed)"
    owner = log_dir.stat().st_uid
    if owner != os.geteuid():
        return f"{log_dir} is another user's run (uid {owner})"
    return None


def _out_problem(out: str) -> str | None:
    """Why the report may not go to `--out DIR`, or None: the directory (made when missing) must
    be ours and writable by no other user, who could otherwise have put a symlink at index.html
    (to a file of the reader's) or swap the report's files after it (files.output_dir); and a
    file must be writable in it (root and /proc)."""
    try:
        files.output_dir(out)
    except OSError as exc:
        return f"{out}: {exc.strerror or exc}"
    return writable_dir_problem(out)


def run(args: argparse.Namespace) -> int:
    from telemetry.consumers.readjsonl import Unreadable, find_log_dir
    from telemetry.consumers.terminal import printable

    if not os.path.exists(args.run_dir):
        print(f"telemetry report: {args.run_dir or repr(args.run_dir)}: no such file or directory", file=sys.stderr)
        return 2
    try:
        log_dir = find_log_dir(args.run_dir)
    except (FileNotFoundError, Unreadable) as exc:     # not a run, or not ours to read: bad input, as a typo is
        print(f"telemetry report: {exc}", file=sys.stderr)
        return 2
    files.apply_like(log_dir)   # the report is as private as the run it reads
    why = _out_problem(args.out) if args.out else None
    if why:
        print(f"telemetry report: --out {why}", file=sys.stderr)
        return 2
    why = None if args.out else _default_out_problem(Path(log_dir))
    if why:
        print(f"telemetry report: {why}; write the report into a directory of yours with --out DIR",
              file=sys.stderr)
        return 2
    progress = Progress("telemetry report")      # on stderr, when it is a terminal
    try:
        r = make_report(args.run_dir, args.out, progress)
    except OSError as exc:   # a directory that could not be made or written after all
        progress.clear()
        print(f"telemetry report: {exc.strerror or exc}: {exc.filename or args.out}", file=sys.stderr)
        return 1
    finally:
        progress.clear()
    lines = [text_summary(r["name"], r["summary"], r["data"])]
    st = r["read"]
    if st.num_torn or st.num_bad or st.num_not_regular:
        lines.append(f"  read               {st.num_lines} records from {st.num_files} file(s); skipped "
                     f"{st.num_torn} torn and {st.num_bad} unreadable line(s)"
                     + (f", {st.num_not_regular} file(s) that are not regular files (a FIFO, a device)"
                        if st.num_not_regular else ""))
    if r["data"].num_unplottable:
        lines.append(f"  not plotted        {r['data'].num_unplottable} value(s): NaN, Inf or beyond "
                     f"±{MAX_PLOT_ABS:g}")
    lines.append(f"  plots              {', '.join(p.name for p in r['images']) or 'none'}"
                 + (f"; {len(r['metric_plots'])} metric plot(s) in metrics/" if r["metric_plots"] else ""))
    lines.append(f"  report             {r['html']}")
    # Run, metric, dataset and event names are data from the ranks: no escape sequence of theirs.
    print("\n".join(printable(x) for text in lines for x in text.split("\n")))
    return 0
