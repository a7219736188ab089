"""Where a dashboard's records come from, and how pages hear of new ones.

History is read from metrics.jsonl before the server answers (readjsonl); a history larger than
--wait-history-mb while it answers (pages show what came so far, then reload once: Hub.reset).
Then one feed thread per run brings what is new:
- PubFeed: the daemon's PUB socket (the live consumers' Subscriber). Its SUB socket is
  connected before the history is read, so nothing written in between is missed; records that
  arrive on both ways are taken once. A daemon restart is a disconnect, then a reconnect: the
  SUB socket reconnects by itself, the page shows "daemon not reachable" in between.
- FileFeed: metrics.jsonl as it grows (several runs side by side: their daemons' sockets are
  not known from a run dir; the JSONL sink writes each batch at once, so this is live too).

Each feed hands what changed to the Hub, which numbers the changes; a page's event stream asks
the Hub for what came after the last number it saw.
"""
from __future__ import annotations

import collections
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from telemetry.consumers.dashboard.store import RunStore
from telemetry.consumers.readjsonl import Follower, ReadStats, read_records
from telemetry.shared import files

# Changes (one per record, its points) kept for pages that lag; a page further behind reloads
# everything. Pages read the stream as it comes, so lag is short. Bounded in number and in
# bytes (Hub's max_log_bytes, from the memory budget; a record of 30 values is ~5 kB of points).
MAX_CHANGES_KEPT = 10_000
DEFAULT_MAX_LOG_BYTES = 16 << 20
# What one change costs: its tuple and lists, and per point its list and numbers (tracemalloc).
CHANGE_BYTES = 200
CHANGE_POINT_BYTES = 150
CHANGE_EVENT_BYTES = 1000
# Signatures of history records that may come again on the SUB socket: at most this many (a
# repeat beyond is one point drawn twice at the same x, which the page's last-per-x hides).
MAX_DEDUP_SIGNATURES = 100_000
FILE_POLL_S = 0.5
SUB_POLL_MS = 250
# History records this close to the moment the SUB socket attached may come again on it.
DEDUP_MARGIN_S = 5.0
DRAIN_FILE = "drain.json"


class Hub:
    """The runs' stores and the numbered log of live changes."""

    def __init__(self, max_log_bytes: int = DEFAULT_MAX_LOG_BYTES) -> None:
        self.stores: dict[str, RunStore] = {}
        # Change numbers are this server's: a page that kept its number across a restart of the
        # dashboard must reload instead of waiting for a number the new server has not reached.
        self.instance = f"{os.getpid()}-{time.time_ns()}"
        self.cond = threading.Condition()
        self.seq = 0
        self._log: collections.deque = collections.deque()
        self.max_log_bytes = max_log_bytes
        self._log_bytes = 0

    def add(self, store: RunStore) -> None:
        self.stores[store.run_id] = store

    def publish(self, run_id: str, points: list, events: list) -> None:
        if not points and not events:
            return
        cost = CHANGE_BYTES + sum(CHANGE_POINT_BYTES + len(p[0]) for p in points) + CHANGE_EVENT_BYTES * len(events)
        with self.cond:
            self.seq += 1
            self._log.append((self.seq, run_id, points, events, cost))
            self._log_bytes += cost
            # The oldest go first; a page that still needed them reloads (changes_since: None).
            while len(self._log) > MAX_CHANGES_KEPT or (self._log_bytes > self.max_log_bytes and len(self._log) > 1):
                self._log_bytes -= self._log.popleft()[4]
            self.cond.notify_all()

    def reset(self) -> None:
        """Every page reloads (a history read while serving is complete): its changes so far are
        in the stores' snapshots, not in the log."""
        with self.cond:
            self._log.clear()
            self._log_bytes = 0
            self.seq += 1
            self.cond.notify_all()

    def changes_since(self, seq: int, timeout_s: float) -> tuple[int, list | None]:
        """(latest seq, the changes after `seq`), waiting up to timeout_s for one.

        None instead of the list when changes after `seq` were already forgotten (reload)."""
        with self.cond:
            self.cond.wait_for(lambda: self.seq > seq, timeout=timeout_s)
            if self.seq <= seq:
                return self.seq, []
            if not self._log or self._log[0][0] > seq + 1:
                return self.seq, None
            return self.seq, [c[:4] for c in self._log if c[0] > seq]

    def statuses(self) -> list[dict[str, Any]]:
        out = []
        for s in self.stores.values():
            out.append(s.status(_drained_at(s.log_dir) if s.log_dir is not None else None))
        return out


# The stop codes (drain.json's stop_code) that end a run; a SIGTERM may come before a restart.
RUN_ENDED = frozenset({"drain_request", "watched_process_exited"})


def _drained_at(log_dir) -> float | None:
    """When the daemon of this run was drained, or None. The daemon writes drain.json whenever it
    stops; only a drain request (run.sh's, after the trainer) ends a run: a SIGTERM may come
    before a restart. A file without a stop reason is from an older daemon: run.sh's drain."""
    path = log_dir / DRAIN_FILE
    try:
        mtime = path.stat().st_mtime
        # A regular file of at most 1 MB (a FIFO there never blocks the dashboard, /dev/zero is
        # never read without end); anything else reads as "" and so as not drained.
        final = json.loads(files.read_small(path, 1 << 20))
    except (OSError, ValueError, RecursionError):   # RecursionError: nested past json's limit
        return None
    if not isinstance(final, dict):
        return None
    code = final.get("stop_code")
    if code is None:      # an older daemon's: its words, or none at all (run.sh's drain)
        reason = str(final.get("stop_reason", "drain request"))
        code = ("drain_request" if reason == "drain request" else "watched_process_exited"
                if reason.startswith("the process it was started for exited") else "")
    # A drain request (run.sh's), or the end of the script a daemon was started for (--watch-pid).
    return mtime if isinstance(code, str) and code in RUN_ENDED else None


def _signature(rec: dict) -> tuple:
    return (rec.get("kind"), rec.get("t"), rec.get("step"), rec.get("rank"), rec.get("host"), rec.get("gpu"),
            rec.get("name"))


class Feed(threading.Thread):
    def __init__(self, hub: Hub, store: RunStore) -> None:
        super().__init__(name=f"dashboard-feed-{store.run_id}", daemon=True)
        self.hub = hub
        self.store = store
        self.stop_event = threading.Event()
        self._said_unreadable = False

    def unreadable(self, exc: OSError) -> None:
        """The run's metrics could not be read (made unreadable, replaced, their directory gone
        after the start): said once on stderr; the page keeps what it has and the feed goes on,
        taking what can be read again."""
        if self._said_unreadable:
            return
        self._said_unreadable = True
        from telemetry.consumers.terminal import printable

        print(f"telemetry dashboard: run {printable(self.store.name)}: its metrics cannot be read any more "
              f"({printable(exc)}); the page keeps what it has, and shows what comes if they can be read again",
              file=sys.stderr, flush=True)

    def take(self, rec: dict) -> None:
        points, events = self.store.consume(rec)
        self.hub.publish(self.store.run_id, points, events)

    def stop(self, timeout_s: float = 2.0) -> None:
        self.stop_event.set()
        if self.is_alive():
            self.join(timeout_s)


class FileFeed(Feed):
    """Follows a run's metrics.jsonl. load_history() in the caller's thread, then start()."""

    def __init__(self, hub: Hub, store: RunStore, log_dir: Path) -> None:
        super().__init__(hub, store)
        self.stats = ReadStats()
        self.follower = Follower(log_dir, self.stats)
        store.source = f"file {log_dir / 'metrics.jsonl'}"

    def load_history(self) -> None:
        try:
            for rec in self.follower.records():
                self.store.consume(rec)
        except OSError as exc:
            self.unreadable(exc)
        self.store.num_bad = self.stats.num_bad

    def run(self) -> None:
        try:
            while not self.stop_event.wait(FILE_POLL_S):
                try:
                    for rec in self.follower.records():
                        self.take(rec)
                except OSError as exc:     # Unreadable: tried again at the next poll
                    self.unreadable(exc)
                self.store.num_bad = self.stats.num_bad
        finally:
            self.follower.close()


class PubFeed(Feed):
    """History from `log_dir` (if any), then the daemon's PUB socket through `sub`."""

    def __init__(self, hub: Hub, store: RunStore, sub: Any, log_dir: Path | None) -> None:
        super().__init__(hub, store)
        self.sub = sub
        self.log_dir = log_dir
        self._history: set[tuple] = set()
        self._history_t_max = float("-inf")
        store.source = f"pub {sub.endpoint}"
        store.connected = False

    def load_history(self) -> None:
        """Read metrics.jsonl; the SUB socket is already connected and queues what comes meanwhile."""
        if self.log_dir is None:
            return
        attached_t = time.time() - DEDUP_MARGIN_S
        stats = ReadStats()
        try:
            for rec in read_records(self.log_dir, stats):
                self.store.consume(rec)
                t = rec.get("t")
                if isinstance(t, (int, float)) and t >= attached_t and len(self._history) < MAX_DEDUP_SIGNATURES:
                    self._history.add(_signature(rec))
                    self._history_t_max = max(self._history_t_max, t)
        except OSError as exc:     # the live records still come from the PUB socket
            self.unreadable(exc)
        self.store.num_bad = stats.num_bad

    def _seen_in_history(self, rec: dict) -> bool:
        if not self._history:
            return False
        t = rec.get("t")
        if isinstance(t, (int, float)) and t > self._history_t_max:
            self._history.clear()   # past the history's end: nothing more can be a repeat
            return False
        return _signature(rec) in self._history

    def run(self) -> None:
        sub = self.sub
        try:
            while not self.stop_event.is_set():
                for _kind, rec in sub.records(timeout_ms=SUB_POLL_MS):
                    if not self._seen_in_history(rec):
                        self.take(rec)
                with self.store.lock:
                    self.store.connected = sub.connected
                    self.store.num_reconnects = sub.num_reconnects
        finally:
            sub.close()
