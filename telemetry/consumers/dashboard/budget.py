"""The dashboard's memory budget (--memory-mb) divided among what it holds.

One process, one budget: what the interpreter and its libraries take (BASELINE_BYTES) comes
first; the rest is shared out in fixed parts, each bounded in bytes by the code that holds it:
    the runs' series (points and per-series overhead)  store.StoreLimits, divided among the runs
    their events                                        store.StoreLimits
    the live changes kept for lagging pages             live.Hub(max_log_bytes)
    one /api/data answer being built                    server (max_points_sent, one at a time)
The figures per point, series and answer are measured by benchmarks/consumer_memory.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from telemetry.consumers.dashboard.store import POINT_BYTES, SERIES_BYTES, StoreLimits

DEFAULT_MEMORY_MB = 256
DEFAULT_MAX_SERIES = 10_000
# The process with no run loaded: interpreter, numpy, pyzmq, the HTTP server (~50 MB RSS
# measured), with room for the SUB socket's queue.
BASELINE_BYTES = 80 << 20
# Parts of the rest.
POINTS_SHARE = 0.45
SERIES_SHARE = 0.10
EVENTS_SHARE = 0.05
CHANGES_SHARE = 0.10
ANSWER_SHARE = 0.30
# One point of an /api/data answer while it is built: two Python floats in lists, the JSON text
# and its bytes, numpy's copies.
POINT_SENT_BYTES = 160


@dataclass(frozen=True)
class Budget:
    store: StoreLimits
    max_log_bytes: int
    max_points_sent: int


def plan(memory_mb: int = DEFAULT_MEMORY_MB, max_series: int = DEFAULT_MAX_SERIES, num_runs: int = 1) -> Budget:
    """The limits for `num_runs` runs side by side under `memory_mb` MB (each run gets an equal
    part of the series, points and events)."""
    total = memory_mb << 20
    rest = max(8 << 20, total - BASELINE_BYTES)
    runs = max(1, num_runs)
    series_bytes = int(rest * SERIES_SHARE / runs)
    max_points = max(4096, int(rest * POINTS_SHARE / runs) // POINT_BYTES)
    store = StoreLimits(max_series=max(1, min(max_series // runs, series_bytes // SERIES_BYTES)),
                        max_series_bytes=series_bytes,
                        max_points=max_points,
                        # One answer copies a series a few times over while it downsamples it.
                        max_points_per_series=max(65_536, max_points // 16),
                        max_event_groups=max(100, 20_000 // runs),
                        max_event_bytes=int(rest * EVENTS_SHARE / runs))
    return Budget(store=store, max_log_bytes=int(rest * CHANGES_SHARE),
                  max_points_sent=max(10_000, int(rest * ANSWER_SHARE) // POINT_SENT_BYTES))
