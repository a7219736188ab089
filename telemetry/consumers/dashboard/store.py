"""What the dashboard holds for one run: every value as a series, the events, the run's state.

Fed records in order (history from metrics.jsonl, then live ones) by one thread; read by the
HTTP threads under the store's lock. Series are kept whole (float arrays, 16 bytes a point);
only what is sent to a browser is downsampled.

Series keys (what the page's charts select):
    <name>                   aggregated `metrics` values, x = step     (train/loss, perf/mfu, ...)
    <name>@<host>/<gpu>      `gpu` values, x = unix time               (gpu/util_percent@node0/0)
    <name>@<host>            `system` values, x = unix time            (system/cpu_percent@node0)
    <name>                   `daemon` values, x = unix time            (telemetry/records_in)
    perf/step_time@rank<r>   per-rank `metrics` step time, x = step   (with the daemon's --per-rank)
"""
from __future__ import annotations

import bisect
import math
import threading
import time
from array import array
from pathlib import Path
from typing import Any

import numpy as np

from telemetry.consumers.daemontotals import DaemonTotals
from telemetry.consumers.events import EventGroups
from telemetry.consumers.runend import RunEnd
from telemetry.consumers.series import gap_threshold, insert_gaps, last_per_x, minmax_downsample

STEP, TIME = "step", "time"
# Events sent to a page: the latest ones (the list scrolls; markers beyond it add nothing).
MAX_EVENTS_SENT = 500
# Per-core CPU values are one series per core and per second: not charted, not kept.
_SKIPPED_SYSTEM = ("system/cpu_percent_core",)


def _num(v: Any) -> float | None:
    """A value as a float to draw; NaN for null (the daemon writes non-finite values as null:
    a gap in the line); None for what is not a number at all (skipped)."""
    if v is None:
        return math.nan
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


class Series:
    __slots__ = ("axis", "xs", "ys")

    def __init__(self, axis: str) -> None:
        self.axis = axis
        self.xs = array("d")
        self.ys = array("d")

    def add(self, x: float, y: float) -> None:
        self.xs.append(x)
        self.ys.append(y)

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


def _json_list(a: np.ndarray) -> list:
    return [None if math.isnan(v) else v for v in a.tolist()]


class RunStore:
    """One run's series, events and state. consume(rec) returns what changed, for live pages."""

    def __init__(self, run_id: str, name: str, log_dir: Path | None, name_from_hello: bool = True) -> None:
        self.run_id = run_id
        self.name = name
        # Side by side, runs keep their directory's name: resumed or copied runs can share a run_name.
        self.name_from_hello = name_from_hello
        self.log_dir = log_dir
        self.lock = threading.Lock()
        self.series: dict[str, Series] = {}
        self.events = EventGroups()
        self._event_steps: dict[int, int | None] = {}
        # (t, step) of aggregated steps, to put an event that names no step on the step axis.
        self._step_t: list[float] = []
        self._step_of_t: list[int] = []
        self.latest: dict[str, float | None] = {}
        self.daemon = DaemonTotals()   # its counters over the whole run, across daemon restarts
        self.end = RunEnd()
        self.run_config: dict | None = None
        self.last_step: int | None = None
        self.num_records = 0
        self.num_bad = 0
        self.t_first: float | None = None
        self.last_record_t: float | None = None
        self.source = "none"            # "pub <endpoint>" or "file <path>"
        self.connected: bool | None = None   # None: no PUB socket to be connected to
        self.num_reconnects = 0

    # -- feeding -------------------------------------------------------------------------------
    def _add(self, key: str, axis: str, x: float, y: float, out: list) -> None:
        s = self.series.get(key)
        if s is None:
            s = self.series[key] = Series(axis)
        s.add(x, y)
        out.append([key, axis, x, None if math.isnan(y) else y])

    def consume(self, rec: dict) -> tuple[list, list]:
        """Take one record; return (points, events) it added: [key, axis, x, y] and event dicts."""
        points: list = []
        events: list = []
        kind = rec.get("kind")
        t = rec.get("t")
        t = float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else None
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
                    # Per-rank records (--per-rank): only each rank's step time is drawn (one line per
                    # rank); the aggregate carries the rest, and min/max/slowest.
                    y = _num(values.get("perf/step_time"))
                    if isinstance(rec["rank"], int) and y is not None:
                        self._add(f"perf/step_time@rank{rec['rank']}", STEP, float(step), y, points)
                    return points, events
                self.last_step = step if self.last_step is None else max(self.last_step, step)
                if t is not None and (not self._step_t or t >= self._step_t[-1]):
                    self._step_t.append(t)
                    self._step_of_t.append(step)
                for k, v in values.items():
                    y = _num(v)
                    if y is not None:
                        self._add(k, STEP, float(step), y, points)
                        self.latest[k] = None if math.isnan(y) else y
            elif kind in ("gpu", "system", "daemon") and t is not None:
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
            elif kind == "event":
                g, _new = self.events.add(rec)
                if g.id not in self._event_steps:
                    self._event_steps[g.id] = self._step_for(g.data, g.t)
                events.append(self._event_dict(g))
            elif kind == "hello":
                info = rec.get("info")
                if isinstance(info, dict):
                    # The client's own hello comes first; the trainer's, with its config, after it.
                    if self.run_config is None or "config" in info:
                        self.run_config = info
                    cfg = info.get("config") if isinstance(info.get("config"), dict) else {}
                    name = info.get("run_name") or cfg.get("run_name")
                    if name and self.name_from_hello:
                        self.name = str(name)
        return points, events

    def _step_for(self, data: dict, t: float | None) -> int | None:
        step = data.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            return step
        if t is None or not self._step_t:
            return self.last_step
        i = bisect.bisect_right(self._step_t, t)
        return self._step_of_t[i - 1] if i else self._step_of_t[0]

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
                    "num_records": self.num_records, "num_bad": self.num_bad, "now": time.time(),
                    "daemon": {k: v for k, v in self.daemon.totals().items()
                               if isinstance(v, (int, float)) and math.isfinite(v)},
                    "num_daemons": self.daemon.num_daemons}

    def snapshot(self, width_px: int) -> dict[str, Any]:
        """Everything a page draws, each series downsampled to the chart width."""
        num_buckets = max(16, width_px // 2)
        with self.lock:
            items = [(k, s.axis, s.for_display(num_buckets), len(s.xs)) for k, s in self.series.items()]
            groups = self.events.groups[-MAX_EVENTS_SENT:]
            events = [self._event_dict(g) for g in groups]
            out = {"id": self.run_id, "name": self.name, "log_dir": str(self.log_dir) if self.log_dir else None,
                   "t0": self.t_first, "latest": dict(self.latest),
                   "config": self.run_config, "num_events": len(self.events.groups)}
        out["series"] = [{"key": k, "axis": axis, "x": _json_list(xs), "y": _json_list(ys), "n": n, "gap": gap}
                         for k, axis, (xs, ys, gap), n in items]
        out["events"] = events
        return out
