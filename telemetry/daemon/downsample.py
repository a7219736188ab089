"""Per-sink downsampling of aggregated metrics records, keeping the reductions.

Windows are over training steps. A window closes after `every_n_steps` of them and, when
`max_per_second` is set, no sooner than 1/max_per_second after the previous one (a window held
back by the rate goes out on the sink's next flush tick once its time has come, so the last
steps of a pause are not held forever). The window's record carries its last step and each
metric reduced over the window (reductions.WINDOW_RULES, applied to the window's columns: a
loss is the mean of its window, token counts are summed, maxima stay maxima).

Evaluation metrics (names under `eval/`) are no training step: the trainer logs them at the
step they were computed, after that step's training metrics, and the aggregator sends them out
as the step logged again. They pass through at their own step, never counted in a window (a
window of 10 steps stays 10 training steps when eval runs every 10). Other kinds (events, gpu,
system, per-rank records) pass through too.
"""
from __future__ import annotations

import time

import msgspec

from protocol import output
from protocol.output import UNSET, MetricsRecord
from telemetry.daemon.reductions import WINDOW_RULES, Reducer
from telemetry.daemon.sinks.base import Out

# Metrics under these prefixes are not training steps (see the module docstring).
PASS_THROUGH_PREFIXES = ("eval/",)


class Downsampler:
    def __init__(self, every_n_steps: int = 1, max_per_second: float = 0.0,
                 overrides: dict[str, str] | None = None, clock=time.monotonic) -> None:
        self.clock = clock
        self.every_n_steps = every_n_steps
        self.min_interval_s = 1.0 / max_per_second if max_per_second > 0 else 0.0
        self.reducer = Reducer(WINDOW_RULES, overrides)
        self._window: list[dict] = []          # the values of each training step in the window
        self._last: MetricsRecord | None = None
        self._last_emit = -float("inf")

    def feed(self, batch: list[Out]) -> list[Out]:
        out: list[Out] = []
        for o in batch:
            rec = o.record
            if o.kind != "metrics" or rec.rank is not UNSET:
                out.append(o)
                continue
            values = rec.values
            passing = [k for k in values if k.startswith(PASS_THROUGH_PREFIXES)]
            if passing:
                if len(passing) == len(values):          # nothing but eval metrics: not a step
                    out.append(o)
                    continue
                # Training and eval metrics in one record (a rank's eval came in before another
                # rank's training metrics of that step): the eval part goes out at its step now.
                out.append(_out(msgspec.structs.replace(rec, values={k: values[k] for k in passing})))
                values = {k: v for k, v in values.items() if not k.startswith(PASS_THROUGH_PREFIXES)}
            self._window.append(values)
            self._last = rec
            if len(self._window) >= self.every_n_steps:
                now = self.clock()
                if now - self._last_emit >= self.min_interval_s:
                    self._last_emit = now
                    out.append(self._close())
        return out

    def poll(self, now: float | None = None) -> list[Out]:
        """A window held back only by the rate limit goes out once its time has come, even if
        no further step arrives (training paused or ended)."""
        if len(self._window) >= self.every_n_steps and self.min_interval_s:
            now = self.clock() if now is None else now
            if now - self._last_emit >= self.min_interval_s:
                self._last_emit = now
                return [self._close()]
        return []

    def flush(self) -> list[Out]:
        return [self._close()] if self._window else []

    def _close(self) -> Out:
        window, last = self._window, self._last
        names = dict.fromkeys(name for values in window for name in values)
        # One column per metric, one cell: the window's values, step by step (None: not logged).
        columns = {name: [tuple(values.get(name) for values in window)] for name in names}
        reduced = self.reducer.reduce_columns(columns)
        rec = MetricsRecord(last.t, last.step, {name: cell[0] for name, cell in reduced.items()},
                            window_steps=len(window) if len(window) > 1 else UNSET)
        self._window = []
        return _out(rec)


def _out(rec: MetricsRecord) -> Out:
    return Out("metrics", rec, output.encode(rec))
