"""What the dashboard holds for one run: every value as a series, the events, the run's state.

Fed records in order (history from metrics.jsonl, then live ones) by one thread; read by the
HTTP threads under the store's lock. Series are float arrays (16 bytes a point), kept whole
while they fit the store's share of the dashboard's memory budget (StoreLimits):
- series: the first max_series keys to come are kept; a value of a new key beyond that (or
  beyond max_series_bytes) is dropped and counted (num_values_dropped);
- points: beyond max_points, the longest series is thinned to about half its points, each
  bucket of 8 keeping its first, last, minimum and maximum (a one-step spike stays), counted
  (num_points_thinned); so is a series longer than max_points_per_series (what one answer
  copies and downsamples at a time; a chart is at most a few thousand pixels wide);
- events: beyond max_event_groups or max_event_bytes the oldest quarter is forgotten, counted
  (num_events_forgotten).
The page shows the counts (status()["budget"]). Only what is sent to a browser is downsampled
otherwise.

Series keys (what the page's charts select):
    <name>                   aggregated `metrics` values, x = step     (train/loss, perf/mfu, ...)
    <name>@<host>/<gpu>      `gpu` values, x = unix time               (gpu/util_percent@node0/0)
    <name>@<host>            `system` values, x = unix time            (system/cpu_percent@node0)
    <name>                   `daemon` values, x = unix time            (telemetry/records_in)
    <name>@rank<r>           per-rank `metrics` values, x = step       (with the daemon's --per-rank)
"""
from __future__ import annotations

import bisect
import functools
import json
import math
import threading
import time
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from telemetry.consumers.daemontotals import DaemonTotals
from telemetry.consumers.events import EventGroups
from telemetry.consumers.runend import RunEnd
from telemetry.consumers.series import gap_threshold, insert_gaps, last_per_x, minmax_downsample
from telemetry.shared import catalogue
from telemetry.shared.goodput import BUCKETS as GOODPUT_BUCKETS
from telemetry.shared.bookkeeping import SUMMARY_REMOVE_EVENT, drop_summary_paths, is_bookkeeping
from telemetry.shared.numbers import is_int, is_number

STEP, TIME = "step", "time"
# A change that is no series' point: a step and its record's wall time, for the page's step -> time x axis.
STEP_TIME = "steptime"
# Another: a value of the run's summary (W&B's run.summary[key] = value), x unused.
SUMMARY = "summary"
# The summary events the W&B drop-in and the HF integration send (telemetry/integrations).
SUMMARY_EVENT = "wandb/summary"
# The run's summary: the first MAX_SUMMARY_KEYS keys are kept (the values of others are counted,
# num_summary_dropped, as are keys longer than MAX_SUMMARY_TEXT); a text value is cut to that.
MAX_SUMMARY_KEYS = 1000
MAX_SUMMARY_TEXT = 200
# Events sent to a page: the latest ones (the list scrolls; markers beyond it add nothing).
MAX_EVENTS_SENT = 500
# Per-core CPU values are one series per core and per second: not charted, not kept.
_SKIPPED_SYSTEM = ("system/cpu_percent_core",)
# What a series costs besides its points: the Series, its two arrays, its key (in the series
# dict and in `latest`), dict slots (tracemalloc: ~700 bytes with a 20-character key).
SERIES_BYTES = 800
POINT_BYTES = 16
# An event group: the EventGroup, its dicts, the page's copy of its step; plus its data's JSON.
EVENT_BYTES = 600
# Thinning never takes a series below this many points (a chart of it stays a line).
MIN_POINTS_THINNED = 64
# (t, step) pairs kept to place an event that names no step; halved (every other kept) beyond.
MAX_STEP_TIMES = 1 << 18


@functools.lru_cache(maxsize=1 << 16)
def meta_of(key: str) -> tuple[str, str]:
    """A series' unit and display group from the metric catalogue ("s", "GB", "%", ...; "" for
    a name it does not know, the run's own): the page's axis title, and the section a chart no
    built-in one draws goes in (the run's own names by their prefix)."""
    name = key.split("@")[0]
    m = catalogue.lookup(name)
    group = m.group if m is not None else ""
    if m is not None and m.name.startswith("*") and not m.unit and name.endswith(m.name[1:]):
        # perf/step_time_max: the unit of what it is the largest of
        m = catalogue.lookup(name[:-(len(m.name) - 1)]) or m
    return (m.unit if m is not None else ""), group


# The catalogue's display groups in its order: the page's sections of charts no built-in one draws.
GROUP_ORDER = catalogue.groups()


@dataclass(frozen=True)
class StoreLimits:
    """What one run's store may hold. The defaults fit one run in the default budget (the
    dashboard's run() divides --memory-mb among its runs: budget.py)."""

    max_series: int = 10_000
    max_series_bytes: int = 20 << 20
    max_points: int = 4_000_000
    max_points_per_series: int = 262_144
    max_event_groups: int = 20_000
    max_event_bytes: int = 8 << 20


def _num(v: Any) -> float | None:
    """A value as a float to draw; NaN for null (the daemon writes non-finite values as null:
    a gap in the line); None for what is not a number at all (skipped)."""
    if v is None:
        return math.nan
    if not is_number(v):
        return None
    return float(v)


class Series:
    __slots__ = ("axis", "xs", "ys", "thinned")

    def __init__(self, axis: str) -> None:
        self.axis = axis
        self.xs = array("d")
        self.ys = array("d")
        self.thinned = False       # some of its points went (the files still have them: ranges.py)

    def __len__(self) -> int:
        return len(self.xs)

    def add(self, x: float, y: float) -> None:
        self.xs.append(x)
        self.ys.append(y)

    def thin(self) -> int:
        """Keep about half the points: per bucket of ~8, the first, last, minimum, maximum and
        a gap (minmax_downsample). Return how many points went."""
        n = len(self.xs)
        xs, ys = last_per_x(np.frombuffer(self.xs, dtype=np.float64).copy(),
                            np.frombuffer(self.ys, dtype=np.float64).copy())
        xs, ys = minmax_downsample(xs, ys, max(1, len(xs) // 8))
        if len(xs) > n * 3 // 4:   # buckets of equal x width can be uneven: every other point then
            xs, ys = xs[::2], ys[::2]
        self.xs, self.ys = array("d", xs.tobytes()), array("d", ys.tobytes())
        self.thinned = True
        return n - len(self.xs)

    def for_display(self, num_buckets: int) -> tuple[np.ndarray, np.ndarray, float | None]:
        xs = np.frombuffer(self.xs, dtype=np.float64).copy()
        ys = np.frombuffer(self.ys, dtype=np.float64).copy()
        xs, ys = last_per_x(xs, ys)
        gap = None
        if self.axis == TIME:
            gap = gap_threshold(xs)
            xs, ys = insert_gaps(xs, ys, gap)
        xs, ys = minmax_downsample(xs, ys, num_buckets)
        return xs, ys, gap


def buckets_within(sizes: list[int], num_buckets: int, max_points: int) -> int:
    """The most buckets (at most num_buckets, at least 4) for which series of these sizes,
    downsampled (a series of more than 2 buckets' points sends at most 4 a bucket), send at
    most max_points points together."""
    def cost(b: int) -> int:
        return sum(n if n <= 2 * b else min(n, 4 * b) for n in sizes)

    lo, hi = 4, max(4, num_buckets)
    if cost(hi) <= max_points:
        return hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if cost(mid) <= max_points:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _json_list(a: np.ndarray) -> list:
    return [None if math.isnan(v) else v for v in a.tolist()]


class RunStore:
    """One run's series, events and state. consume(rec) returns what changed, for live pages."""

    def __init__(self, run_id: str, name: str, log_dir: Path | None, name_from_hello: bool = True,
                 limits: StoreLimits | None = None) -> None:
        self.run_id = run_id
        self.name = name
        # Side by side, runs keep their directory's name: resumed or copied runs can share a run_name.
        self.name_from_hello = name_from_hello
        self.log_dir = log_dir
        self.lock = threading.Lock()
        self.series: dict[str, Series] = {}
        self.limits = limits or StoreLimits()
        self.num_series_bytes = 0
        self.num_points = 0
        self.num_values_dropped = 0     # values of new series beyond the limits
        self.num_points_thinned = 0
        self.num_events_forgotten = 0
        self.on_first_drop: Callable[[RunStore], None] | None = None   # told once, under the lock
        self.events = EventGroups()
        self._event_steps: dict[int, int | None] = {}
        self._event_bytes: dict[int, int] = {}
        self.num_event_bytes = 0
        # (t, step) of aggregated steps, to put an event that names no step on the step axis.
        self._step_t = array("d")
        self._step_of_t = array("d")
        self.latest: dict[str, float | None] = {}
        self.daemon = DaemonTotals()   # its counters over the whole run, across daemon restarts
        self.end = RunEnd()
        self.run_config: dict | None = None
        self.summary: dict[str, Any] = {}   # the run's summary, flat keys (SUMMARY_EVENT)
        self.num_summary_dropped = 0
        self.last_step: int | None = None
        self.num_records = 0
        self.num_bad = 0
        self.t_first: float | None = None
        self.last_record_t: float | None = None
        self.source = "none"            # "pub <endpoint>" or "file <path>"
        self.connected: bool | None = None   # None: no PUB socket to be connected to
        self.num_reconnects = 0
        self.loading_history = False    # its history is being read while the server answers

    # -- feeding -------------------------------------------------------------------------------
    def _add(self, key: str, axis: str, x: float, y: float, out: list) -> bool:
        """Add a point; False when it was dropped (a new series beyond the limits)."""
        s = self.series.get(key)
        new = s is None
        if new:
            cost = SERIES_BYTES + 2 * len(key)
            if (len(self.series) >= self.limits.max_series
                    or self.num_series_bytes + cost > self.limits.max_series_bytes):
                self.num_values_dropped += 1
                if self.num_values_dropped == 1 and self.on_first_drop is not None:
                    self.on_first_drop(self)
                return False
            self.num_series_bytes += cost
            s = self.series[key] = Series(axis)
        s.add(x, y)
        self.num_points += 1
        if len(s) > self.limits.max_points_per_series:
            self._thin(s)
        elif self.num_points > self.limits.max_points:
            self._thin(max(self.series.values(), key=len))
        # A new series' first point says its unit and group (a page learns them with it).
        out.append([key, axis, x, None if math.isnan(y) else y, *meta_of(key)] if new else
                   [key, axis, x, None if math.isnan(y) else y])
        return True

    def _thin(self, s: Series) -> None:
        # Half its points go: the next thinning is half its length away.
        if len(s) > MIN_POINTS_THINNED:
            gone = s.thin()
            self.num_points -= gone
            self.num_points_thinned += gone

    def _add_event(self, rec: dict) -> Any:
        g, new = self.events.add(rec)
        if new:
            self._event_steps[g.id] = self._step_for(g.data, g.t)
            cost = EVENT_BYTES + len(json.dumps(g.data, default=str))
            self._event_bytes[g.id] = cost
            self.num_event_bytes += cost
            lim = self.limits
            while self.events.groups and (len(self.events.groups) > lim.max_event_groups
                                          or self.num_event_bytes > lim.max_event_bytes):
                for old in self.events.forget_oldest(max(1, len(self.events.groups) // 4)):
                    self.num_event_bytes -= self._event_bytes.pop(old.id, 0)
                    self._event_steps.pop(old.id, None)
                    self.num_events_forgotten += 1
        return g

    def consume(self, rec: dict) -> tuple[list, list]:
        """Take one record; return (points, events) it added: [key, axis, x, y] and event dicts."""
        points: list = []
        events: list = []
        kind = rec.get("kind")
        t = rec.get("t")
        t = float(t) if is_number(t) else None
        values = rec.get("values") if isinstance(rec.get("values"), dict) else {}
        with self.lock:
            self.num_records += 1
            self.end.consume(str(kind), rec)
            if t is not None:
                self.t_first = t if self.t_first is None else min(self.t_first, t)
                self.last_record_t = t if self.last_record_t is None else max(self.last_record_t, t)
            if kind == "metrics":
                step = rec.get("step")
                if not isinstance(step, int):
                    return points, events
                if "rank" in rec:
                    # Per-rank records (--per-rank): each value as <name>@rank<r>, a line per rank
                    # (within the series budget like any series); the aggregate is drawn apart.
                    if is_int(rec["rank"]):
                        suffix = f"@rank{rec['rank']}"
                        for k, v in values.items():
                            y = _num(v)
                            if y is not None:
                                self._add(k + suffix, STEP, float(step), y, points)
                    return points, events
                self.last_step = step if self.last_step is None else max(self.last_step, step)
                if t is not None and (not self._step_t or t >= self._step_t[-1]):
                    self._step_t.append(t)
                    self._step_of_t.append(float(step))
                    points.append(["", STEP_TIME, float(step), t])   # the page's wall-time x axis
                    if len(self._step_t) > MAX_STEP_TIMES:
                        self._step_t, self._step_of_t = self._step_t[::2], self._step_of_t[::2]
                for k, v in values.items():
                    y = _num(v)
                    if y is not None and self._add(k, STEP, float(step), y, points):
                        self.latest[k] = None if math.isnan(y) else y
            elif kind in ("gpu", "system", "daemon") and t is not None:
                if kind == "daemon":
                    values = catalogue.current_names(values)     # an older daemon's names as they are now
                if kind == "gpu":
                    suffix = f"@{rec.get('host', '?')}/{rec.get('gpu', 0)}"
                elif kind == "system":
                    suffix = f"@{rec.get('host', '?')}"
                else:
                    suffix = ""
                for k, v in values.items():
                    if kind == "system" and k.startswith(_SKIPPED_SYSTEM):
                        continue
                    y = _num(v)
                    if y is not None:
                        self._add(k + suffix, TIME, t, y, points)
                if kind == "daemon":
                    self.daemon.consume(values, t)
            elif kind == "event" and rec.get("name") == SUMMARY_EVENT and isinstance(rec.get("data"), dict):
                self._add_summary(rec["data"], points)
            elif kind == "event" and rec.get("name") == SUMMARY_REMOVE_EVENT:
                drop_summary_paths(self.summary, rec.get("data"))    # a page shows it from its next load
            elif kind == "event" and not is_bookkeeping(rec.get("name")):
                g = self._add_event(rec)
                events.append(self._event_dict(g))
            elif kind == "hello":
                info = rec.get("info")
                if isinstance(info, dict):
                    # The client's own hello comes first; the trainer's, with its config, after it.
                    if self.run_config is None or "config" in info:
                        self.run_config = info
                    cfg = info.get("config") if isinstance(info.get("config"), dict) else {}
                    wandb = info.get("wandb") if isinstance(info.get("wandb"), dict) else {}
                    # Our trainer's run_name, an integration's, or wandb.init(name=...) of the drop-in.
                    name = info.get("run_name") or cfg.get("run_name") or wandb.get("name")
                    if name and self.name_from_hello:
                        self.name = str(name)
        return points, events

    def _add_summary(self, data: dict, out: list) -> None:
        """Values of the run's summary (flat keys; a later value of a key replaces it), each also a
        change for live pages: [key, SUMMARY, 0, value]."""
        for k, v in data.items():
            if not isinstance(k, str) or len(k) > MAX_SUMMARY_TEXT:
                self.num_summary_dropped += 1
                continue
            if k not in self.summary and len(self.summary) >= MAX_SUMMARY_KEYS:
                self.num_summary_dropped += 1
                continue
            if isinstance(v, float) and not math.isfinite(v):
                v = str(v)                                   # NaN / inf: said, not JSON's null
            elif not (v is None or isinstance(v, (bool, int, float, str))):
                v = json.dumps(v, default=str)
            if isinstance(v, str) and len(v) > MAX_SUMMARY_TEXT:
                v = v[:MAX_SUMMARY_TEXT] + "…"
            self.summary[k] = v
            out.append([k, SUMMARY, 0.0, v])

    def _step_for(self, data: dict, t: float | None) -> int | None:
        step = data.get("step")
        if is_int(step):
            return step
        if t is None or not self._step_t:
            return self.last_step
        i = bisect.bisect_right(self._step_t, t)
        return int(self._step_of_t[i - 1] if i else self._step_of_t[0])

    def _event_dict(self, g: Any) -> dict:
        return {**g.as_dict(), "step": self._event_steps.get(g.id), "run": self.run_id}

    # -- reading -------------------------------------------------------------------------------
    def status(self, drain_file_mtime: float | None = None) -> dict[str, Any]:
        """Whether the daemon is there and whether (and how) the run ended."""
        with self.lock:
            how = self.end.how()
            ended = [how] if how else []
            # drain.json is run.sh's record of the daemon's drain; a run resumed into the same
            # dir writes records after it, and is not over.
            if drain_file_mtime is not None and (self.last_record_t is None
                                                 or drain_file_mtime >= self.last_record_t - 1.0):
                ended.append("daemon drained")
            return {"run": self.run_id, "name": self.name, "source": self.source, "connected": self.connected,
                    "num_reconnects": self.num_reconnects, "ended": bool(ended), "ended_how": "; ".join(ended),
                    "last_step": self.last_step, "last_record_t": self.last_record_t,
                    "loading_history": self.loading_history,
                    "num_records": self.num_records, "num_bad": self.num_bad, "now": time.time(),
                    "budget": {"num_series": len(self.series), "max_series": self.limits.max_series,
                               "num_values_dropped": self.num_values_dropped, "num_points": self.num_points,
                               "max_points": self.limits.max_points,
                               "max_points_per_series": self.limits.max_points_per_series,
                               "num_points_thinned": self.num_points_thinned,
                               "num_events_forgotten": self.num_events_forgotten},
                    "daemon": {k: v for k, v in self.daemon.totals().items()
                               if isinstance(v, (int, float)) and math.isfinite(v)},
                    "num_daemons": self.daemon.num_daemons}

    def range_sizes(self, keys: list[str]) -> tuple[list[int], int]:
        """For the answer's reservation (budget.range_bytes): the lengths of the step-axis series
        of `keys` held whole, and how many are held thinned (read from the files)."""
        whole, num_thinned = [], 0
        with self.lock:
            for key in keys:
                s = self.series.get(key)
                if s is None or s.axis != STEP:
                    continue
                if s.thinned:
                    num_thinned += 1
                else:
                    whole.append(len(s))
        return whole, num_thinned

    def zoomed(self, keys: list[str], x0: float, x1: float, num_buckets: int) -> tuple[dict, list[str]]:
        """A step range of these series: {key: (xs, ys)} of those the store holds whole, each
        downsampled to num_buckets pixel columns; and the step-axis keys it holds thinned (for
        ranges.py to read from the files)."""
        out, thinned = {}, []
        for key in keys:
            # One series copied at a time (its copy and working arrays are what an answer holds
            # beyond its output: budget.range_bytes).
            with self.lock:
                s = self.series.get(key)
                if s is None or s.axis != STEP:
                    continue
                if s.thinned:
                    thinned.append(key)
                    continue
                xs = np.frombuffer(s.xs, dtype=np.float64).copy()
                ys = np.frombuffer(s.ys, dtype=np.float64).copy()
            xs, ys = last_per_x(xs, ys)
            inside = (xs >= x0) & (xs <= x1)
            xs, ys = minmax_downsample(xs[inside], ys[inside], num_buckets)
            out[key] = (xs.tolist(), _json_list(ys))
        return out, thinned

    def snapshot(self, width_px: int, max_points: int | None = None) -> dict[str, Any]:
        """Everything a page draws, each series downsampled to the chart width, and to fewer
        buckets when all of them together would send more than about `max_points` points."""
        with self.lock:
            num_buckets = max(16, width_px // 2)
            if max_points is not None:
                num_buckets = buckets_within([len(s) for s in self.series.values()], num_buckets, max_points)
            items = [(k, s.axis, s.for_display(num_buckets), len(s.xs), s.thinned) for k, s in self.series.items()]
            groups = self.events.groups[-MAX_EVENTS_SENT:]
            events = [self._event_dict(g) for g in groups]
            stride = max(1, -(-len(self._step_t) // (4 * num_buckets)))     # a step's wall time, for the x axis
            steps_t = [_json_list(self._step_of_t[::stride]), _json_list(self._step_t[::stride])]
            if self._step_t and (len(self._step_t) - 1) % stride:
                steps_t[0].append(self._step_of_t[-1])
                steps_t[1].append(self._step_t[-1])
            out = {"id": self.run_id, "name": self.name, "log_dir": str(self.log_dir) if self.log_dir else None,
                   "t0": self.t_first, "latest": dict(self.latest), "step_t": steps_t,
                   "config": self.run_config, "num_events": len(self.events.groups),
                   "summary": dict(self.summary), "num_summary_dropped": self.num_summary_dropped}
        out["series"] = [{"key": k, "axis": axis, "x": _json_list(xs), "y": _json_list(ys), "n": n, "gap": gap,
                          "unit": meta_of(k)[0], "group": meta_of(k)[1], "thinned": thinned}
                         for k, axis, (xs, ys, gap), n, thinned in items]
        out["group_order"] = GROUP_ORDER
        out["goodput_buckets"] = list(GOODPUT_BUCKETS)     # the ledger's, in its order (the page's goodput chart)
        out["events"] = events
        return out
