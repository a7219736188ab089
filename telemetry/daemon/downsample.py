"""Per-sink downsampling of aggregated metrics records, keeping the reductions.

A window closes after `every_n_steps` steps and, when `max_per_second` is set, no sooner than
1/max_per_second after the previous one (a window held back by the rate goes out on the sink's
next flush tick once its time has come, so the last steps of a pause are not held forever). The window's record carries the last step and each
metric reduced over the window (reductions.WINDOW_RULES: a loss is the mean of its window, token
counts are summed, maxima stay maxima). Other kinds (events, gpu, system, per-rank) pass through.
"""
from __future__ import annotations

import time

import msgspec

from telemetry.daemon.reductions import WINDOW_RULES, Reducer
from telemetry.sinks.base import Out

_json = msgspec.json.Encoder()


class Downsampler:
    def __init__(self, every_n_steps: int = 1, max_per_second: float = 0.0,
                 overrides: dict[str, str] | None = None, clock=time.monotonic) -> None:
        self.clock = clock
        self.every_n_steps = every_n_steps
        self.min_interval_s = 1.0 / max_per_second if max_per_second > 0 else 0.0
        self.reducer = Reducer(WINDOW_RULES, overrides)
        self._values: dict[str, list] = {}
        self._num_steps = 0
        self._last: dict | None = None
        self._last_emit = -float("inf")

    def feed(self, batch: list[Out]) -> list[Out]:
        out: list[Out] = []
        for o in batch:
            rec = o.record
            if o.kind != "metrics" or "rank" in rec:
                out.append(o)
                continue
            for k, v in rec["values"].items():
                self._values.setdefault(k, []).append(v)
            self._num_steps += 1
            self._last = rec
            if self._num_steps >= self.every_n_steps:
                now = self.clock()
                if now - self._last_emit >= self.min_interval_s:
                    self._last_emit = now
                    out.append(self._close())
        return out

    def poll(self, now: float | None = None) -> list[Out]:
        """A window held back only by the rate limit goes out once its time has come, even if
        no further step arrives (training paused or ended)."""
        if self._num_steps >= self.every_n_steps and self.min_interval_s:
            now = self.clock() if now is None else now
            if now - self._last_emit >= self.min_interval_s:
                self._last_emit = now
                return [self._close()]
        return []

    def flush(self) -> list[Out]:
        return [self._close()] if self._num_steps else []

    def _close(self) -> Out:
        last = self._last
        rec = {"kind": "metrics", "t": last["t"], "step": last["step"], "values": self.reducer.reduce(self._values)}
        if self._num_steps > 1:
            rec["window_steps"] = self._num_steps
        self._values = {}
        self._num_steps = 0
        return Out("metrics", rec, _json.encode(rec))
