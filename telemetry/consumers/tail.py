"""Live view of a running job from the daemon's PUB socket: step, loss, throughput, MFU, GPUs, events.

Attaches and detaches at any time (Ctrl-C) without the run noticing: it only subscribes. On a
terminal it draws a live view (rich); with --plain, or when stdout is not a terminal, it prints
one line per record, for pipes and log files:

    12:00:01 metrics step=120 train/loss=2.3145 perf/tokens_per_second=1.2346e+05 ...
    12:00:01 gpu node0/0 gpu/util_percent=97 gpu/memory_used_gb=40.1 ...
    12:00:02 event diagnosis/straggler rank=3: rank 3 is 18% slower than the median ...

A value that was not finite (NaN, Inf: the daemon writes them as null) shows as nan.

--run-dir DIR follows the run written to DIR across relaunches: each daemon of a run writes its
endpoints there, and a relaunch (a new daemon, new sockets) is followed. Without it the view
follows the run directory its daemon's status names; where it has none (only --pub), a daemon
that is gone for good is said, with what to do.

--filter PREFIX keeps records whose kind starts with PREFIX (e.g. "event", "gpu"), events whose
name does ("diagnosis/"), and of the other records only the values whose names do ("train/").
"""
from __future__ import annotations

import argparse
import collections
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from protocol import output
from telemetry.consumers.events import EventGroup, EventGroups
from telemetry.consumers.runend import RunEnd
from telemetry.consumers.terminal import printable, printable_record
from telemetry.shared.goodput import top_loss as goodput_top_loss
from telemetry.shared.endpoints import endpoint_arg
from telemetry.shared.bookkeeping import is_bookkeeping
from telemetry.shared.catalogue import current_names, grouped
from telemetry.shared.numbers import is_number

# Points kept for the sparklines (one per step).
HISTORY = 120
# Events kept for the view.
NUM_EVENTS = 8
# The view redraws at most this often; records in between only update the state.
REDRAW_S = 0.25
# A rank this much slower than the fastest is shown in red (the straggler rule decides events).
STRAGGLER_PERCENT = 5.0
# Without a record for this long the header says the run has gone quiet.
STALE_S = 10.0
# Line mode holds a new event this long to gather the other ranks' copies into one line.
EVENT_GATHER_S = 1.0

SPARK_CHARS = "▁▂▃▄▅▆▇█"
# The live view's "metrics" panel: the latest of every step metric the training panel does not
# draw, this many rows at most (the rest counted, with the --filter that shows them).
MAX_METRIC_ROWS = 12
# What the training panel draws (eval/* too, per dataset).
DRAWN = frozenset({"train/loss", "train/lr", "train/grad_norm", "train/epoch", "train/step",
                   "perf/tokens_per_second", "perf/mfu", "perf/mfu_percent", "perf/step_time",
                   "perf/step_time_max", "perf/step_time_min", "perf/slowest_rank", "perf/data_loading_ratio",
                   "memory/max_allocated_gb"})


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pub", type=endpoint_arg, metavar="EP", help="the daemon's PUB endpoint (default $TELEMETRY_PUB, else the "
                   "private ipc socket of $TELEMETRY_RUN_NAME / $TELEMETRY_RUNTIME_DIR)")
    p.add_argument("--filter", metavar="PREFIX", default="",
                   help="only kinds, event names or metric names starting with PREFIX")
    p.add_argument("--plain", action="store_true", help="one line per record, even on a terminal")
    p.add_argument("--control", type=endpoint_arg, metavar="EP", help="control endpoint asked once for the run's name "
                   "and directory (default: the daemon's default one when --pub is not given)")
    p.add_argument("--run-dir", metavar="DIR", help="follow the run written to DIR (or DIR/telemetry) across "
                   "relaunches: each of its daemons writes its endpoints there")


# -- formatting --------------------------------------------------------------------------------
def fmt_num(v: Any) -> str:
    """A metric value, short: ints as they are, floats to 5 significant digits."""
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return f"{v:.5g}"          # nan, inf, -inf as such
    return str(v)


def fmt_value(v: Any) -> str:
    """A metric's value: fmt_num, and null as nan. The daemon writes every non-finite value
    (NaN, Inf, -Inf) as null, JSON having no such numbers (protocol/README.md), so on the PUB
    socket a diverged loss is a null, which is "not a number" here as in `report` (its NaN/Inf
    count), never Python's None."""
    return "nan" if v is None else fmt_num(v)


def sparkline(xs: list[float], width: int = 32) -> str:
    """Unicode block sparkline of the last `width` finite values (min..max scaled)."""
    xs = [x for x in xs[-width:] if isinstance(x, (int, float)) and math.isfinite(x)]
    if not xs:
        return ""
    lo, hi = min(xs), max(xs)
    if hi - lo <= 1e-12 * max(1.0, abs(hi)):
        return SPARK_CHARS[3] * len(xs)
    n = len(SPARK_CHARS) - 1
    return "".join(SPARK_CHARS[round((x - lo) / (hi - lo) * n)] for x in xs)


class RecordFilter:
    """--filter PREFIX: which records and which of their values pass."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix

    def apply(self, kind: str, rec: dict) -> dict | None:
        """The record (values narrowed to the prefix when only some match), or None."""
        p = self.prefix
        if not p or kind.startswith(p):
            return rec
        if kind == "event":
            return rec if str(rec.get("name", "")).startswith(p) else None
        values = rec.get("values")
        if not isinstance(values, dict):
            return None
        kept = {k: v for k, v in values.items() if k.startswith(p)}
        return output.with_values(rec, kept) if kept else None


def format_line(kind: str, rec: dict) -> str:
    """One plain line for a record: time, kind, where it is from, then key=value pairs."""
    t = rec.get("t")
    stamp = time.strftime("%H:%M:%S", time.localtime(t)) if isinstance(t, (int, float)) else "--:--:--"
    head = [stamp, kind]
    if kind == "metrics":
        head.append(f"step={rec.get('step')}")
        if "rank" in rec:
            head.append(f"rank={rec['rank']}")
        if rec.get("missing_ranks"):
            head.append("missing_ranks=" + ",".join(str(r) for r in rec["missing_ranks"]))
    elif kind == "gpu":
        head.append(f"{rec.get('host', '?')}/{rec.get('gpu', '?')}")
    elif kind == "system":
        head.append(str(rec.get("host", "?")))
    elif kind == "event":
        data = rec.get("data") if isinstance(rec.get("data"), dict) else {}
        who = f" rank={rec['rank']}" if rec.get("rank") is not None else ""
        msg = data.get("message")
        if msg:
            # A hang or crash (diagnosis/hang, diagnosis/rank_exited): say where its evidence is.
            where = f" [forensics: {data['bundle']}]" if data.get("bundle") else ""
            return f"{stamp} event {rec.get('name')}{who}: {msg}{where}"
        extra = " ".join(f"{k}={fmt_num(v)}" for k, v in data.items())
        return f"{stamp} event {rec.get('name')}{who} {extra}".rstrip()
    elif kind == "hello":
        info = rec.get("info") if isinstance(rec.get("info"), dict) else {}
        parts = [f"rank={rec.get('rank')}"] + [f"{k}={info[k]}" for k in ("host", "pid", "world_size", "run_name")
                                               if k in info]
        return f"{stamp} hello " + " ".join(parts)
    values = rec.get("values") if isinstance(rec.get("values"), dict) else {}
    return " ".join(head + [f"{k}={fmt_value(v)}" for k, v in values.items()])


# -- the state the live view draws ---------------------------------------------------------------
class TailState:
    """The latest of everything, fed (kind, record) pairs that passed the filter."""

    def __init__(self) -> None:
        self.num_records = 0
        self.last_record_mono: float | None = None
        self.step: int | None = None
        self.values: dict[str, Any] = {}            # latest aggregated metrics values, merged
        self.missing_ranks: list[int] = []
        self.loss_history: collections.deque = collections.deque(maxlen=HISTORY)
        self.tps_history: collections.deque = collections.deque(maxlen=HISTORY)
        self.gpus: dict[tuple[str, int], dict] = {}
        self.systems: dict[str, dict] = {}
        self.rank_step_time_s: dict[int, float] = {}
        self.daemon: dict[str, Any] = {}
        self.events: collections.deque = collections.deque(maxlen=NUM_EVENTS)   # EventGroups, newest last
        self.event_groups = EventGroups()
        self.num_events = 0
        self.hellos: dict[int, dict] = {}
        self.status: dict[str, Any] = {}  # the daemon's status, when its control socket answered
        self.end = RunEnd()
        self.connected: bool | None = None   # the PUB socket's link to the daemon (None: not watched)
        self.following = False               # a new daemon of the run will be followed (a run dir known)
        self.notice = ""                     # the latest word from the subscriber (RunFollower.news)
        self.eval: dict[str, dict[str, float]] = {}   # dataset ("" = none named) -> {"loss": .., "accuracy": ..}
        self.eval_step: int | None = None
        self._metric_rows: tuple[int, list] = (-1, [])   # (len(values) then, the rows' order)

    def metric_rows(self) -> list[tuple[str, str, Any, str]]:
        """(group, name, value, unit) of every numeric step metric (or null: a non-finite one,
        shown as nan) the training panel does not draw, grouped as the catalogue says
        (catalogue.grouped: the run's own names first). The lookups and the sort are redone
        only when a new name came (values only grow), not at every redraw (4 a second): a run
        that logs thousands of names pays for them once."""
        n, rows = self._metric_rows
        if n != len(self.values):
            rows = grouped([k for k in self.values if k not in DRAWN and not k.startswith("eval/")])
            self._metric_rows = (len(self.values), rows)
        values = self.values
        return [(group, k, values[k], unit) for group, k, unit in rows if values[k] is None or is_number(values[k])]

    def consume(self, kind: str, rec: dict) -> None:
        self.num_records += 1
        self.last_record_mono = time.monotonic()
        self.end.consume(kind, rec)
        values = rec.get("values") if isinstance(rec.get("values"), dict) else {}
        if kind == "metrics":
            if "rank" in rec:
                st = values.get("perf/step_time")
                if isinstance(st, (int, float)) and isinstance(rec.get("rank"), int):
                    self.rank_step_time_s[rec["rank"]] = float(st)
                return
            step = rec.get("step")
            if isinstance(step, int) and (self.step is None or step >= self.step):
                self.step = step
            self.values.update(values)
            self.missing_ranks = list(rec.get("missing_ranks") or [])
            loss = values.get("train/loss")
            if isinstance(loss, (int, float)):
                self.loss_history.append(float(loss))
            tps = values.get("perf/tokens_per_second")
            if isinstance(tps, (int, float)):
                self.tps_history.append(float(tps))
            for k, x in values.items():
                # eval/<dataset>/<metric>, or eval/<metric> from trainers that name no dataset
                parts = k.split("/")
                if parts[0] != "eval" or len(parts) not in (2, 3) or not isinstance(x, (int, float)):
                    continue
                dataset, metric = (parts[1], parts[2]) if len(parts) == 3 else ("", parts[1])
                self.eval.setdefault(dataset, {})[metric] = float(x)
                self.eval_step = step if isinstance(step, int) else self.eval_step
        elif kind == "gpu":
            key = (str(rec.get("host", "?")), int(rec.get("gpu", 0)) if isinstance(rec.get("gpu"), int) else 0)
            self.gpus.setdefault(key, {}).update(values)
        elif kind == "system":
            self.systems.setdefault(str(rec.get("host", "?")), {}).update(values)
        elif kind == "daemon":
            self.daemon.update(current_names(values))    # an older daemon's names as they are now
        elif kind == "event":
            if is_bookkeeping(rec.get("name")):
                return
            group, new = self.event_groups.add(rec)
            if new:  # the same event from the other ranks only adds their rank to it
                self.num_events += 1
                self.events.append(group)
        elif kind == "hello":
            if isinstance(rec.get("rank"), int) and isinstance(rec.get("info"), dict):
                self.hellos[rec["rank"]] = rec["info"]

    def run_name(self) -> str | None:
        for info in self.hellos.values():
            name = info.get("run_name")
            if not name and isinstance(info.get("config"), dict):
                name = info["config"].get("run_name")
            if name:
                return str(name)
        name = self.status.get("run_name")
        return str(name) if name else None


# -- the live view (rich) ------------------------------------------------------------------------
def _bar(frac: float | None, width: int = 16) -> Any:
    """A fixed-width bar, green -> yellow -> red as it fills."""
    from rich.text import Text

    if frac is None or not math.isfinite(frac):
        return Text("·" * width, style="dim")
    frac = min(1.0, max(0.0, frac))
    n = round(frac * width)
    style = "green" if frac < 0.7 else "yellow" if frac < 0.9 else "red"
    return Text("█" * n, style=style) + Text("░" * (width - n), style="grey35")


def _num(d: dict, key: str) -> float | None:
    v = d.get(key)
    return float(v) if is_number(v) else None


def _fmt(v: float | None, spec: str, unit: str = "") -> str:
    return "—" if v is None else format(v, spec) + unit


def render(state: TailState, endpoint: str, filter_prefix: str = "", width: int = 120) -> Any:
    """The whole view as one rich renderable, laid out for a terminal `width` columns wide."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    v = state.values
    # Header: what we are attached to and whether anything is arriving.
    head = Text(no_wrap=True, overflow="ellipsis")  # one line, whatever the terminal's width
    head.append("telemetry tail", style="bold")
    name = state.run_name()
    if name:
        head.append(f"  run {name}", style="bold cyan")
    head.append(f"  {endpoint}", style="dim")
    if filter_prefix:
        head.append(f"  filter {filter_prefix!r}", style="magenta")
    ended = state.end.how()
    if ended:
        head.append(f"  run ended: {ended}", style="bold magenta")
    elif state.connected is False:
        head.append("  daemon not reachable (stopped or restarting; "
                    + ("follows the run's next daemon)" if state.following else "waiting for it)"), style="bold red")
    if state.notice:
        head.append(f"  {state.notice}", style="yellow")
    if state.last_record_mono is None:
        head.append("  waiting for records… (Ctrl-C detaches)", style="yellow")
    else:
        age = time.monotonic() - state.last_record_mono
        head.append(f"  last record {age:.1f} s ago", style="red" if age > STALE_S else "dim")
        head.append(f"  {state.num_records} records", style="dim")

    # Training: one label column, one value column, sparklines to the right.
    # The numbers never shrink; the sparklines and notes to their right are cropped instead.
    train = Table.grid(padding=(0, 2))
    train.add_column(style="bold", no_wrap=True, min_width=13)
    train.add_column(justify="right", no_wrap=True, min_width=9)
    train.add_column(no_wrap=True, overflow="crop", ratio=1)
    epoch = _num(v, "train/epoch")
    train.add_row("step", "—" if state.step is None else str(state.step),
                  Text(f"epoch {epoch:.2f}" if epoch is not None else "", style="dim"))
    loss_hist = list(state.loss_history)
    loss_range = f"  {min(loss_hist):.4g} … {max(loss_hist):.4g}" if len(loss_hist) > 1 else ""
    loss = "nan" if "train/loss" in v and v["train/loss"] is None else _fmt(_num(v, "train/loss"), ".4f")
    train.add_row("loss", loss,
                  Text(sparkline(loss_hist), style="cyan") + Text(loss_range, style="dim"))
    for dataset in sorted(state.eval):
        ev = state.eval[dataset]
        note = [f"accuracy {ev['accuracy']:.4g}"] if "accuracy" in ev else []
        note += [f"{m} {x:.4g}" for m, x in sorted(ev.items()) if m not in ("loss", "accuracy")]
        if state.eval_step is not None:
            note.append(f"at step {state.eval_step}")
        train.add_row(Text(f"eval {dataset}".rstrip()), _fmt(ev.get("loss"), ".4f"), Text("  ".join(note), style="dim"))
    extras = []
    if _num(v, "train/lr") is not None:
        extras.append(f"lr {_num(v, 'train/lr'):.2e}")
    if _num(v, "train/grad_norm") is not None:
        extras.append(f"grad norm {_num(v, 'train/grad_norm'):.3g}")
    if extras:
        train.add_row("", "", Text("   ".join(extras), style="dim"))
    train.add_row("tokens/s", _fmt(_num(v, "perf/tokens_per_second"), ",.0f"),
                  Text(sparkline(list(state.tps_history)), style="green"))
    mfu = _num(v, "perf/mfu_percent")
    if mfu is None and _num(v, "perf/mfu") is not None:
        mfu = _num(v, "perf/mfu") * 100
    train.add_row("MFU", _fmt(mfu, ".1f", " %"), _bar(None if mfu is None else mfu / 100, 20))
    st, st_max, st_min = _num(v, "perf/step_time"), _num(v, "perf/step_time_max"), _num(v, "perf/step_time_min")
    spread = minmax = ""
    if st_max and st_min is not None and st_max != st_min:  # one rank: no spread to show
        # The spread first: on a narrow terminal the notes are cropped from the right.
        spread = f"spread {(st_max - st_min) / st_max * 100:.1f} %"
        if _num(v, "perf/slowest_rank") is not None:
            spread += f", slowest rank {int(v['perf/slowest_rank'])}"
        minmax = f"min {st_min:.3f} s  max {st_max:.3f} s"
    train.add_row("step time", _fmt(st_max or st, ".3f", " s"), Text(spread, style="dim"))
    if minmax:
        train.add_row("", "", Text(minmax, style="dim"))
    dl = _num(v, "perf/data_loading_ratio")
    if dl is not None:
        train.add_row("data loading", f"{dl * 100:.1f} %", _bar(dl, 20))
    mem = _num(v, "memory/max_allocated_gb")
    if mem is not None:
        train.add_row("max allocated", f"{mem:.2f} GB", "")

    # Telemetry's own health: is anything being lost?
    d = state.daemon
    health = Table.grid(padding=(0, 2))
    health.add_column(style="bold")
    health.add_column(justify="right")
    for label, key in (("records in", "telemetry/records_in"), ("dropped", "telemetry/records_lost"),
                       ("lost in transit", "telemetry/records_lost_in_transit"),
                       ("sink dropped", "telemetry/sink_dropped"),
                       ("ranks", "telemetry/num_ranks")):
        val = _num(d, key)
        style = "red" if val and key in ("telemetry/records_lost", "telemetry/records_lost_in_transit",
                                         "telemetry/sink_dropped") else ""
        health.add_row(label, Text("—" if val is None else f"{int(val):,}", style=style))
    health.add_row("events", str(state.num_events))
    frac = _num(d, "goodput/fraction")
    if frac is not None:                  # the goodput ledger so far (telemetry/shared/goodput.py)
        health.add_row("goodput", f"{frac * 100:.1f} %")
        loss = goodput_top_loss(d)
        if loss:
            health.add_row(Text(loss[0], style="dim"), Text(f"{loss[1]:,.0f} s", style="dim"))
    if state.missing_ranks:
        health.add_row("missing ranks", Text(",".join(map(str, state.missing_ranks)), style="red"))

    top = Table.grid(padding=(0, 1), expand=True)
    top.add_column(ratio=1)
    top.add_column(width=26)
    top.add_row(Panel(train, title="training", title_align="left", border_style="cyan"),
                Panel(health, title="telemetry", title_align="left", border_style="grey50"))
    parts: list[Any] = [head, top]

    if state.gpus:
        # Numbers keep their width; the bars get what the terminal has left (6..16 cells).
        bar_w = max(6, min(16, (width - 52) // 3))
        gpus = Table(box=None, padding=(0, 1), header_style="bold")
        gpus.add_column("gpu", no_wrap=True)
        for col, num_w in (("util", 5), ("memory", 11), ("power", 9)):
            gpus.add_column(col, no_wrap=True, overflow="crop", width=bar_w)
            gpus.add_column("", no_wrap=True, justify="right", min_width=num_w)
        gpus.add_column("temp", no_wrap=True, justify="right", min_width=5)
        for (host, idx), g in sorted(state.gpus.items()):
            util = _num(g, "gpu/util_percent")
            used, total = _num(g, "gpu/memory_used_gb"), _num(g, "gpu/memory_total_gb")
            power, limit = _num(g, "gpu/power_w"), _num(g, "gpu/power_limit_w")
            temp = _num(g, "gpu/temperature_c")
            label = f"{host}/{idx}" if len({h for h, _ in state.gpus}) > 1 else str(idx)
            gpus.add_row(Text(label), _bar(None if util is None else util / 100, bar_w), _fmt(util, ".0f", " %"),
                         _bar(used / total if used is not None and total else None, bar_w),
                         f"{_fmt(used, '.1f')}/{_fmt(total, '.0f', ' GB')}",
                         _bar(power / limit if power is not None and limit else None, bar_w),
                         f"{_fmt(power, '.0f')}/{_fmt(limit, '.0f', ' W')}",
                         _fmt(temp, ".0f", " °C"))
        parts.append(Panel(gpus, title="GPUs", title_align="left", border_style="green"))
    elif state.systems:
        host_t = Table(box=None, padding=(0, 1), header_style="bold")
        for col in ("host", "cpu", "", "memory", ""):
            host_t.add_column(col, no_wrap=True)
        for host, s in sorted(state.systems.items()):
            cpu, memp = _num(s, "system/cpu_percent"), _num(s, "system/memory_percent")
            host_t.add_row(Text(host), _bar(None if cpu is None else cpu / 100), _fmt(cpu, ".0f", " %"),
                           _bar(None if memp is None else memp / 100), _fmt(memp, ".0f", " %"))
        parts.append(Panel(host_t, title="host (no GPU records)", title_align="left", border_style="green"))

    if len(state.rank_step_time_s) > 1:
        ranks = Table(box=None, padding=(0, 1), header_style="bold")
        for col in ("rank", "step time", "", "vs fastest"):
            ranks.add_column(col, no_wrap=True, justify="right" if col != "" else "left")
        times = state.rank_step_time_s
        slowest, fastest = max(times.values()), min(times.values())
        for r, t in sorted(times.items()):
            behind = (t - fastest) / fastest * 100 if fastest > 0 else 0.0
            # A rank more than STRAGGLER_PERCENT behind the fastest holds every other rank back.
            style = "red" if behind > STRAGGLER_PERCENT else ""
            ranks.add_row(str(r), Text(f"{t:.3f} s", style=style), _bar(t / slowest if slowest > 0 else None, 24),
                          Text(f"+{behind:.1f} %", style=style or "dim"))
        parts.append(Panel(ranks, title="step time per rank", title_align="left", border_style="grey50"))

    others = [] if filter_prefix else state.metric_rows()
    if others:
        # The run's own metrics and the rest of the catalogue's, grouped, with their units.
        mt = Table(box=None, padding=(0, 2), show_header=False)
        mt.add_column(style="dim", no_wrap=True)
        mt.add_column(no_wrap=True)
        mt.add_column(justify="right", no_wrap=True)
        last_group = None
        for group, k, x, unit in others[:MAX_METRIC_ROWS]:
            mt.add_row(group if group != last_group else "", Text(k), Text(fmt_value(x) + (f" {unit}" if unit else "")))
            last_group = group
        more = others[MAX_METRIC_ROWS:]
        if more:
            prefixes = sorted({k.split("/")[0] + "/" if "/" in k else k for _, k, _, _ in more})
            mt.add_row("", Text(f"+{len(more)} more", style="dim"),
                       Text("--filter PREFIX: " + ", ".join(prefixes[:3]) + (", ..." if len(prefixes) > 3 else ""),
                            style="dim"))
        parts.append(Panel(mt, title="metrics", title_align="left", border_style="grey50"))

    if filter_prefix and state.values:
        vt = Table(box=None, padding=(0, 2), header_style="bold")
        vt.add_column("metric")
        vt.add_column("latest", justify="right")
        for k in sorted(state.values):
            vt.add_row(Text(k), Text(fmt_value(state.values[k])))
        parts.append(Panel(vt, title=Text(f"metrics matching {filter_prefix!r}"), title_align="left"))

    ev = Table(box=None, padding=(0, 1), expand=True, show_header=False)
    ev.add_column(no_wrap=True, style="dim")
    ev.add_column(no_wrap=True)
    ev.add_column(overflow="fold", ratio=1)
    for g in reversed(state.events):
        sev = g.data.get("severity")
        style = "bold red" if sev == "critical" else "yellow" if sev == "warning" else "cyan"
        stamp = time.strftime("%H:%M:%S", time.localtime(g.t)) if g.t is not None else ""
        msg = g.data.get("message") or " ".join(f"{k}={fmt_num(x)}" for k, x in g.data.items())
        if g.data.get("bundle"):
            msg = f"{msg} [forensics: {g.data['bundle']}]"
        who = g.ranks_text()
        ev.add_row(stamp, Text(g.name, style=style) + Text(f" {who}" if who else "", style="dim"), Text(msg))
    if not state.events:
        ev.add_row("", Text("no events yet", style="dim"), "")
    parts.append(Panel(ev, title="latest events", title_align="left", border_style="yellow"))
    return Group(*parts)


# -- the two modes -------------------------------------------------------------------------------
def format_event(group: EventGroup) -> str:
    """One line for an event, once for all the ranks that sent it."""
    stamp = time.strftime("%H:%M:%S", time.localtime(group.t)) if group.t is not None else "--:--:--"
    r = sorted(group.ranks)
    who = "" if not r else f" rank={r[0]}" if len(r) == 1 else " ranks=" + group.ranks_text().split(" ", 1)[1]
    msg = group.data.get("message")
    if msg:
        return f"{stamp} event {group.name}{who}: {msg}"
    extra = " ".join(f"{k}={fmt_num(v)}" for k, v in group.data.items())
    return f"{stamp} event {group.name}{who} {extra}".rstrip()


def _now() -> str:
    return time.strftime("%H:%M:%S")


def _run_plain(sub: Any, flt: RecordFilter) -> None:
    out = sys.stdout
    groups = EventGroups()
    pending: list[tuple[float, EventGroup]] = []   # (first seen, group): printed once its ranks are in
    end = RunEnd()
    said_ended = ""
    link = ""   # "up" once connected, "down" after losing the daemon
    try:
        while True:
            lines = []
            for kind, rec in sub.records():
                # Names and strings from the wire reach a terminal: no escape sequence of theirs may.
                kind, rec = printable(kind), printable_record(rec)
                end.consume(kind, rec)
                rec = flt.apply(kind, rec)
                if rec is None:
                    continue
                if kind == "event":
                    if is_bookkeeping(rec.get("name")):
                        continue
                    group, new = groups.add(rec)
                    if new:
                        pending.append((time.monotonic(), group))
                else:
                    lines.append(format_line(kind, rec))
            now = time.monotonic()
            while pending and now - pending[0][0] >= EVENT_GATHER_S:
                lines.append(format_event(pending.pop(0)[1]))
            # The first connection is the normal start; only a loss, and a return after one, are news.
            if sub.connected and link != "up":
                if link == "down":
                    lines.append(f"{_now()} daemon reachable again")
                link = "up"
            elif not sub.connected and link == "up":
                lines.append(f"{_now()} daemon not reachable (stopped or restarting); waiting for it")
                link = "down"
            for news in sub.news():       # about the link itself: stderr, as errors are
                print(printable(news), file=sys.stderr, flush=True)
            how = end.how()
            if how != said_ended and not pending:   # after the events that led to it
                if how:
                    lines.append(f"{_now()} run ended: {how}")
                said_ended = how
            if lines:
                out.write("\n".join(map(printable, lines)) + "\n")
                out.flush()  # a log file or a pipe must see records as they come
    finally:
        if pending:  # detaching: what was gathered is still worth a line
            out.write("\n".join(printable(format_event(g)) for _, g in pending) + "\n")
            out.flush()


def _run_live(sub: Any, flt: RecordFilter) -> None:
    from rich.console import Console
    from rich.live import Live

    state = TailState()
    console = Console()
    with Live(render(state, sub.endpoint, flt.prefix, console.width), console=console, auto_refresh=False,
              vertical_overflow="crop") as live:
        last_draw = 0.0
        while True:
            for kind, rec in sub.records(timeout_ms=int(REDRAW_S * 1000)):
                kind, rec = printable(kind), printable_record(rec)   # as in _run_plain
                shown = flt.apply(kind, rec)
                if shown is not None:
                    state.consume(kind, shown)
                else:
                    state.end.consume(kind, rec)   # the run's end, whatever the filter shows
            state.connected = sub.connected
            state.following = sub.log_dir is not None
            if sub.status and not state.status:
                state.status = printable_record(sub.status)
            for news in sub.news():     # shown until a daemon is there (the header names its endpoint)
                state.notice = printable(news.split(": ", 1)[-1])
            if sub.connected:
                state.notice = ""
            now = time.monotonic()
            if now - last_draw >= REDRAW_S:
                live.update(render(state, sub.endpoint, flt.prefix, console.width), refresh=True)
                last_draw = now


def run(args: argparse.Namespace) -> int:
    from telemetry.consumers.subscribe import AttachError, RunFollower, detach_on_signals, resolve_pub
    from telemetry.shared import endpoints

    prog = "telemetry tail"
    log_dir = None
    if args.run_dir is not None:
        log_dir = _log_dir(args.run_dir)
        if log_dir is None:
            print(f"{prog}: --run-dir {printable(args.run_dir)!r}: not a directory", file=sys.stderr)
            return 2
    explicit = args.pub or os.environ.get(endpoints.ENV_PUB)
    try:
        pub = None if log_dir is not None and not explicit else resolve_pub(prog, args.pub)
    except AttachError as exc:
        print(exc, file=sys.stderr)
        return 2
    control_ep = args.control
    if control_ep is None and log_dir is None and not args.pub:
        try:
            control_ep = endpoints.resolve("control")
        except endpoints.EndpointError:
            control_ep = None     # asked only for the run's name and directory
    if control_ep is None and log_dir is not None:
        from telemetry.shared import run_endpoints

        control_ep = (run_endpoints.read(log_dir) or {}).get("control")
    detach_on_signals()
    sub = RunFollower(prog, pub, log_dir=log_dir, control_ep=control_ep,
                      where=endpoints.where("pub", args.pub, "--pub") if pub else "")
    flt = RecordFilter(args.filter)
    plain = args.plain or not sys.stdout.isatty()
    try:
        if plain:
            _run_plain(sub, flt)
        else:
            _run_live(sub, flt)
    except KeyboardInterrupt:
        return 0  # detaching is the normal way to leave
    # `telemetry tail | head`: the reader left. telemetry.cli.main ends it as it ends every
    # command whose reader left (quietly, exit 141), not as a success.
    finally:
        sub.close()
    return 0


def _log_dir(run_dir: str) -> Path | None:
    """The directory a run's daemon writes (its endpoints.json): DIR, or DIR/telemetry (a run
    of launch/run.sh) when that is where they are; None when DIR is not a directory."""
    from telemetry.shared.run_endpoints import FILE_NAME

    path = Path(os.path.abspath(run_dir)) if run_dir.strip() else None
    if path is None or not path.is_dir():
        return None
    inner = path / "telemetry"
    if not (path / FILE_NAME).exists() and inner.is_dir() and (
            (inner / FILE_NAME).exists() or not (path / "metrics.jsonl").exists()):
        return inner
    return path
