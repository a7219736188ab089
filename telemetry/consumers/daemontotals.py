"""The daemon's own counters over a whole run, across daemon restarts.

Each daemon counts from zero (records in, dropped, lost, ...). A run resumed into the same dir
(or a daemon restarted mid-run) appends a second daemon's records to the same metrics.jsonl, so
the last `daemon` record alone tells only the last daemon's part. A daemon is known by its start
time (the record's `t` minus its uptime, the same in all its records); a counter going back
also means a new daemon. The totals add each finished daemon's last values to the current one's.
"""
from __future__ import annotations

from typing import Any

from telemetry.shared.catalogue import current_names
from telemetry.shared.numbers import is_number

# Counters that only grow within one daemon's life; the rest (queued, num_ranks, uptime) are levels.
COUNTERS = ("telemetry/records_in", "telemetry/records_malformed", "telemetry/records_lost",
            "telemetry/records_dropped_by_clients", "telemetry/records_lost_in_transit", "telemetry/sink_dropped",
            "telemetry/diagnosis_skipped", "telemetry/steps_incomplete", "telemetry/records_late",
            "telemetry/records_in_by_kind/hello", "telemetry/records_in_by_kind/event",
            "telemetry/records_in_by_kind/bye", "telemetry/steps_out")
UPTIME = "telemetry/uptime_s"
# Two daemon records are from the same daemon when their start times agree to within the
# drift of the wall clock against the monotonic uptime (NTP slews at most 500 ppm) plus the
# moment between reading the two clocks. A daemon that follows another starts after the first
# one's last record, so its start differs by at least that record's uptime: far more.
SAME_START_BASE_S = 0.05
SAME_START_PER_S = 1e-3


def _num(v: Any) -> float | None:
    return float(v) if is_number(v) else None


class DaemonTotals:
    """Feed each daemon record (values, t) in file order; totals() sums across daemons."""

    def __init__(self) -> None:
        self.num_daemons = 0
        self._finished: dict[str, float] = {}
        self._current: dict[str, Any] = {}
        self._start_t: float | None = None

    def _is_new_daemon(self, values: dict, start_t: float | None) -> bool:
        if not self._current:
            return True
        if start_t is not None and self._start_t is not None:
            up = max(_num(values.get(UPTIME)) or 0.0, _num(self._current.get(UPTIME)) or 0.0)
            if abs(start_t - self._start_t) > SAME_START_BASE_S + SAME_START_PER_S * up:
                return True
        return any(_num(values.get(k)) is not None and _num(self._current.get(k)) is not None
                   and values[k] < self._current[k] for k in COUNTERS)

    def consume(self, values: dict, t: Any = None) -> None:
        """One daemon record's values, and its `t` (unix seconds); an older daemon's names are
        taken as the names now (catalogue.current_names)."""
        values = current_names(values)
        up, t = _num(values.get(UPTIME)), _num(t)
        start_t = t - up if up is not None and t is not None else None
        if self._is_new_daemon(values, start_t):
            for k in COUNTERS:
                v = _num(self._current.get(k))
                if v is not None:
                    self._finished[k] = self._finished.get(k, 0.0) + v
            self._current = {}
            self.num_daemons += 1
            self._start_t = start_t
        self._current.update(values)

    def totals(self, last_final: dict[str, Any] | None = None) -> dict[str, Any]:
        """The counters summed over every daemon of the run, the levels of the last one.

        last_final: the last daemon's final counters when known better than its last record
        (run.sh's drain.json), by the same names.
        """
        out = dict(self._current)
        if last_final:
            out.update({k: v for k, v in last_final.items() if _num(v) is not None})
        for k in COUNTERS:
            if k in self._finished:
                out[k] = self._finished[k] + (_num(out.get(k)) or 0.0)
        for k, v in list(out.items()):   # whole counts stay ints in what people read
            if k in COUNTERS and isinstance(v, float) and v.is_integer():
                out[k] = int(v)
        return out
