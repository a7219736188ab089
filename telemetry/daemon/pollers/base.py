"""Poller: the lifecycle every daemon poller shares.

A poller samples something outside the training processes (GPUs through NVML, the host through
psutil) on its own daemon thread and its own fixed-rate timer, and hands plain record dicts
(the JSONL contract: docs/metrics.md, "Records") to an `emit` callable that the daemon provides. The trainer
never runs any of this.

Subclasses implement:
    poll_once() -> list[dict]   the pure work; also called directly by tests and benchmarks
    _open() -> bool             one-time setup before the thread starts; False turns the poller off
    _release() -> None          one-time teardown, after the thread has stopped

Lifecycle: start(emit) once; set_rank_pids() any time, from any thread; close() is idempotent and
returns within CLOSE_TIMEOUT_S even if a poll is stuck inside a driver call.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from typing import Callable

from protocol.output import OutputRecord

log = logging.getLogger("telemetry.daemon.pollers")

# close() waits this long for the poll thread; a poll stuck in a driver call must not hang the
# daemon's shutdown (the thread is a daemon thread and dies with the process).
CLOSE_TIMEOUT_S = 2.0


class Poller:
    """Base class: a named sampler on its own thread and timer.

    Args:
        interval_s: seconds between polls (fixed rate; an overrun skips ticks rather than bursting).
    """

    name: str = "poller"

    def __init__(self, interval_s: float) -> None:
        if not (interval_s > 0 and math.isfinite(interval_s)):
            raise ValueError(f"{type(self).__name__}: interval_s must be a positive number, got {interval_s!r}")
        self.interval_s = float(interval_s)
        self._rank_pids: dict[int, int] = {}
        self._pids_lock = threading.Lock()
        # Held for the duration of one poll, so close() never tears resources down mid-poll.
        self._poll_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._close_lock = threading.Lock()
        self.num_polls = 0
        self.num_poll_errors = 0
        self.num_emit_errors = 0
        # CPU seconds this poller's thread spent polling and emitting (time.thread_time deltas).
        self.poll_cpu_s = 0.0

    # ---- the interface the daemon uses -------------------------------------------------------
    def start(self, emit: Callable[[dict], None]) -> None:
        """Start polling on a daemon thread; each record of each poll goes to emit(record).

        Does nothing (and starts no thread) if the poller turns itself off in _open(), e.g. NVML
        absent, or if it was already started or closed.
        """
        if self._thread is not None or self._closed:
            return
        if not self._open():
            return
        self._thread = threading.Thread(target=self._run, args=(emit,), name=f"telemetry-poller-{self.name}",
                                        daemon=True)
        self._thread.start()

    def set_rank_pids(self, pids: dict[int, int]) -> None:
        """Replace the rank -> pid map (from the hello records); thread-safe."""
        snapshot = {int(r): int(p) for r, p in pids.items()}
        with self._pids_lock:
            self._rank_pids = snapshot

    def close(self) -> None:
        """Stop the thread and release resources; idempotent, bounded by CLOSE_TIMEOUT_S."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        if self._thread is not None:
            self._thread.join(timeout=CLOSE_TIMEOUT_S)
        if self._poll_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            try:
                self._release()
            except Exception:  # teardown must never raise into the daemon's shutdown
                log.exception("poller %s: release failed", self.name)
            finally:
                self._poll_lock.release()
        else:
            log.warning("poller %s: a poll is still running after %.1f s; skipping its teardown",
                        self.name, CLOSE_TIMEOUT_S)

    @property
    def running(self) -> bool:
        """True while the poll thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def stats(self) -> dict[str, float | int | str]:
        """Counters for the daemon's status: polls, errors and the CPU seconds polling cost."""
        return {"name": self.name, "interval_s": self.interval_s, "running": int(self.running),
                "num_polls": self.num_polls, "num_poll_errors": self.num_poll_errors,
                "num_emit_errors": self.num_emit_errors, "poll_cpu_s": self.poll_cpu_s}

    def poll_once(self) -> list[OutputRecord]:
        """Sample once and return the records (no emitting). Subclasses implement this."""
        raise NotImplementedError

    # ---- hooks ---------------------------------------------------------------------------------
    def _open(self) -> bool:
        return True

    def _release(self) -> None:
        pass

    def _rank_pids_snapshot(self) -> dict[int, int]:
        with self._pids_lock:
            return self._rank_pids

    # ---- the thread ----------------------------------------------------------------------------
    def _run(self, emit: Callable[[dict], None]) -> None:
        next_t = time.monotonic()
        while True:
            next_t += self.interval_s
            now = time.monotonic()
            if next_t < now:  # an overrun: skip the missed ticks instead of polling in a burst
                next_t += math.ceil((now - next_t) / self.interval_s) * self.interval_s
            if self._stop.wait(next_t - now):
                return
            t0 = time.thread_time()
            records: list[dict] = []
            with self._poll_lock:
                if self._stop.is_set():
                    return
                try:
                    records = self.poll_once()
                except Exception:
                    self.num_poll_errors += 1
                    # The first failure with its traceback, then one line per 100: never a log
                    # line per poll from a poller that is broken for good.
                    if self.num_poll_errors == 1:
                        log.exception("poller %s: poll failed (further failures are counted)", self.name)
                    elif self.num_poll_errors % 100 == 0:
                        log.warning("poller %s: %d polls failed so far", self.name, self.num_poll_errors)
                self.num_polls += 1
            for record in records:
                try:
                    emit(record)
                except Exception:
                    self.num_emit_errors += 1
                    if self.num_emit_errors == 1:
                        log.exception("poller %s: emit failed (further failures are counted)", self.name)
            self.poll_cpu_s += time.thread_time() - t0
