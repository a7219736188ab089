"""The dashboard's memory budget (--memory-mb) divided among what it holds.

One process, one budget: what the interpreter and its libraries take (BASELINE_BYTES) comes
first; the rest is shared out in fixed parts, each bounded in bytes by the code that holds it:
    the runs' series (points and per-series overhead)  store.StoreLimits, divided among the runs
    their events                                        store.StoreLimits
    the live changes kept for lagging pages             live.Hub(max_log_bytes)
    one /api/data answer being built                    server (max_points_sent, one at a time)
    the /api/range answers being built                  server (Reservations: each answer's bytes
                                                        reserved before it is built, cut to fit:
                                                        fit_range)
The figures per point, series and answer are measured by benchmarks/consumer_memory.py.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from telemetry.consumers.dashboard.store import POINT_BYTES, SERIES_BYTES, StoreLimits

DEFAULT_MEMORY_MB = 256
DEFAULT_MAX_SERIES = 10_000
# The process with no run loaded: interpreter, numpy, pyzmq, the HTTP server (measured), with
# room for the SUB socket's queue.
BASELINE_BYTES = 80 << 20
# Parts of the rest.
POINTS_SHARE = 0.45
SERIES_SHARE = 0.10
EVENTS_SHARE = 0.05
CHANGES_SHARE = 0.10
ANSWER_SHARE = 0.20
RANGES_SHARE = 0.10
# One point of an /api/data answer while it is built: two Python floats in lists, the JSON text
# and its bytes, numpy's copies.
POINT_SENT_BYTES = 160
# One point of a series the store holds whole, while a range answer is cut from it (one series
# at a time: store.zoomed): its copy (x and y), the step-deduplicated and in-range arrays made
# from it, the mask.
RANGE_WORK_BYTES = 64
# A range read from the files (ranges.py) holds per key up to POINTS_PER_BUCKET_HELD points a
# column as Python numbers in lists (measured). Its block read (4 MB, and its lines) is not
# reserved per answer: the reads from the files go one at a time (the server's range_lock).
RANGE_HELD_POINT_BYTES = 72
# The fewest pixel columns a range answer is cut to, to fit its share of the budget.
MIN_RANGE_BUCKETS = 16


@dataclass(frozen=True)
class Budget:
    store: StoreLimits
    max_log_bytes: int
    max_points_sent: int
    max_range_bytes: int = 8 << 20


def range_bytes(whole_lengths: list[int], num_thinned: int, num_buckets: int, span: float = float("inf")) -> int:
    """What one /api/range answer holds at most while it is built, before it is built: the series
    the store holds whole (their lengths) cut and downsampled in memory, `num_thinned` series
    read from the files, each answered with up to two points a column and no more points than
    the range has steps (`span`)."""
    from telemetry.consumers.dashboard.ranges import POINTS_PER_BUCKET_HELD

    sent = min(2 * num_buckets, span)
    n = sum(min(k, sent) * POINT_SENT_BYTES for k in whole_lengths) + max(whole_lengths, default=0) * RANGE_WORK_BYTES
    held = min(POINTS_PER_BUCKET_HELD * num_buckets, span)
    n += num_thinned * (held * RANGE_HELD_POINT_BYTES + sent * POINT_SENT_BYTES)
    return int(n)


def fit_range(whole_lengths: list[int], num_thinned: int, num_buckets: int, max_bytes: int,
              span: float = float("inf")) -> tuple[int, int]:
    """The pixel columns a range answer gets and its bytes (range_bytes): as asked when that fits
    `max_bytes`; else the most columns, halving, that fit (MIN_RANGE_BUCKETS at least: an answer
    coarser than the page asked, as /api/data's answers are cut to their share); as asked when
    none fits (then it goes alone: Reservations)."""
    cost = range_bytes(whole_lengths, num_thinned, num_buckets, span)
    b = num_buckets
    while cost > max_bytes and b > MIN_RANGE_BUCKETS:
        b = max(MIN_RANGE_BUCKETS, b // 2)
        c = range_bytes(whole_lengths, num_thinned, b, span)
        if c <= max_bytes:
            return b, c
    return num_buckets, cost


class Reservations:
    """Bytes of the answers being built, reserved before they are built, at most `max_bytes` in
    all: an answer that does not fit beside those in flight waits up to `wait_s` for room, then
    is refused (the server answers 503 with Retry-After) and counted (num_refused); one alone
    always goes, whatever it costs, so a big answer is slow, never impossible. Thread-safe."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.num_bytes = 0
        self.num_in_flight = 0
        self.num_refused = 0
        self._cond = threading.Condition()

    def _fits(self, num_bytes: int) -> bool:
        return not self.num_in_flight or self.num_bytes + num_bytes <= self.max_bytes

    def reserve(self, num_bytes: int, wait_s: float = 0.0) -> bool:
        with self._cond:
            if not self._cond.wait_for(lambda: self._fits(num_bytes), timeout=wait_s):
                self.num_refused += 1
                return False
            self.num_bytes += num_bytes
            self.num_in_flight += 1
            return True

    def release(self, num_bytes: int) -> None:
        with self._cond:
            self.num_bytes -= num_bytes
            self.num_in_flight -= 1
            self._cond.notify_all()


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
                  max_points_sent=max(10_000, int(rest * ANSWER_SHARE) // POINT_SENT_BYTES),
                  max_range_bytes=int(rest * RANGES_SHARE))
