"""The goodput ledger kept live (telemetry/shared/goodput.py), as a stage fed like a sink.

Every output record goes by it on its own thread and bounded queue (never the ingest loop's
time; what a burst leaves it no room for is dropped and counted in its runner's stats, and those
steps are then `unexplained` in the ledger). The daemon puts the running totals in its own
records (goodput/* values: every daemon_record_interval_s and a last one at the drain, so the
JSONL file, W&B's summary, Prometheus and `telemetry tail` have them) and in `telemetry status`:
the ledger so far as gauges (goodput/<bucket>_s: a live launch's hang and unexplained rise, then
shrink when its next step comes), and its settled part as cumulative counters that never go down
(goodput/settled/<bucket>_s: settled_values), the whole ledger in the drain's last record.

A daemon restarted on a log directory continues the run's ledger: the stage first reads what
the files held when the daemon started (every rotated piece, then metrics.jsonl up to its size
then; opened on the daemon's thread, read on the stage's), then the records as they come; held to SEED_SHARE of the time while it reads.

The per-rank ledgers (RankBooks) need each rank's own step records. A daemon that writes them
(`--per-rank`) passes them by like any record; one that does not hands them to this stage alone
(take_rank_records: a list per ingest batch, bounded in bytes by the stage's memory share, what
does not fit dropped and counted in rank_records_dropped). Those are not on file: the stage
writes the per-rank ledgers to goodput_ranks.json beside metrics.jsonl (every RANKS_WRITE_S
while they change, and at the end; what `telemetry goodput` shows of them), and a daemon
restarted on the run continues each from there (RankBooks.prior), the time between the last
write and the rank's next step unexplained. Without that file, a daemon restarted on a run that
had steps begins them anew (RankBooks.begin_partial: each says `since` when).
"""
from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, BinaryIO

from protocol import output
from telemetry.daemon.sinks.base import Out, Sink
from telemetry.shared.goodput import (BATCH_PENDING_STEPS, BUCKETS, RANKS_FILE, Ledger, rank_counters,
                                      ranks_file_data, read_ranks_file)

log = logging.getLogger("telemetry.daemon")

# Reading the files at start shares the GIL with the daemon's ingest: held to this share of the
# time (a week-long run's file is gigabytes; GPU, host and daemon records, most of its lines,
# are told by their first bytes and never decoded).
SEED_SHARE = 0.25
_SKIPPED = (b'{"kind":"gpu"', b'{"kind":"system"', b'{"kind":"daemon"')
_FED = frozenset({"metrics", "event", "hello", "bye"})
LOCK_RECORDS = 256            # records fed per hold of the lock (a short hold)
RANKS_WRITE_S = 5.0           # goodput_ranks.json at most this often (what a SIGKILL loses of them)


SETTLED = "goodput/settled/"    # the cumulative counters' names: goodput/settled/<bucket>_s, .../wall_s


def daemon_values(led: dict[str, Any]) -> dict[str, float]:
    """The ledger as the daemon record's goodput/* values (the catalogue names them)."""
    if not led.get("wall_s"):
        return {}
    out = {f"goodput/{k}_s": round(v, 6) for k, v in led["buckets_s"].items()}
    out["goodput/wall_s"] = round(led["wall_s"], 6)
    out["goodput/fraction"] = round(led["goodput"], 6)
    return out


class GoodputStage(Sink):
    name = "goodput"

    def __init__(self, log_dir: Path | None = None, file_name: str = "metrics.jsonl",
                 rank_bytes_max: int = 0) -> None:
        """rank_bytes_max: the per-rank records handed to it (take_rank_records) it may hold
        waiting; 0 when the daemon writes them (--per-rank) and hands it none."""
        self.ledger = Ledger()
        self._lock = threading.Lock()
        self.num_seeded = 0            # records read from the files at start
        self.num_bad = 0               # lines there that were not a record
        self._seed: list[tuple[BinaryIO, int]] = []
        self.rank_bytes_max = rank_bytes_max
        self._ranks_in: deque[tuple[list, int]] = deque()   # (per-rank Metrics, their bytes)
        self._rank_bytes_in = 0        # written by the daemon's thread only
        self._rank_bytes_out = 0       # written by this stage's thread only
        self.num_rank_dropped = 0      # per-rank records that did not fit (the daemon's thread)
        self._ranks_path = Path(log_dir) / RANKS_FILE if log_dir is not None and rank_bytes_max else None
        if rank_bytes_max:             # a batch's per-rank records come before its steps
            self.ledger.ranks.max_pending = BATCH_PENDING_STEPS
        self._ranks_written_at = 0.0   # time.monotonic() of the last write
        self._ranks_fed = -1           # records the ledger had been fed at the last write
        self.num_rank_fed = 0          # per-rank records handed to it and fed
        self._ranks_warned = False
        # The counters' values so far (settled_values: never lower than they were), whether the
        # ledger is final (the stage closed), and what the counters showed that it re-booked since.
        self._settled: dict[str, float] = {}
        self._final = False
        self.settled_ahead_s = 0.0
        if log_dir is not None:
            self._open_seed(Path(log_dir), file_name)

    def _open_seed(self, log_dir: Path, file_name: str) -> None:
        """Open what the files hold now (the daemon's thread, before it writes anything)."""
        from telemetry.shared.jsonlines import rotated_files
        from telemetry.shared import files

        for path in rotated_files(log_dir):
            try:
                f = files.open_regular(path)
            except (OSError, files.NotRegularFile):
                continue
            self._seed.append((f, os.fstat(f.fileno()).st_size))

    def start(self) -> None:
        seed, self._seed = self._seed, []
        for f, size in seed:
            with f:
                try:
                    self._read(f, size)
                except OSError as exc:
                    log.warning("goodput: reading %s: %s (the ledger goes on without the rest)", f.name, exc)
        ranks = self.ledger.ranks
        if self._ranks_path is not None and not ranks.books:   # per-rank records were not on file
            prior, why = read_ranks_file(self._ranks_path)
            if why:
                log.warning("goodput: %s; the per-rank ledgers begin anew", why)
            if prior:
                ranks.prior = prior
            if prior or any(la.num_steps for la in self.ledger.launches):
                ranks.begin_partial(time.time())
        if self.num_seeded:
            led = self.result()
            log.info("goodput: continuing the run's ledger from %d record(s) on file (%d launch(es), %d step(s))",
                     self.num_seeded, led["launches"], led["steps"])

    def _read(self, f: BinaryIO, size: int) -> None:
        from telemetry.shared.jsonlines import MAX_LINE_BYTES, READ_CHUNK_BYTES, Lines

        lines, left = Lines(self, MAX_LINE_BYTES), size      # counts a line too long in num_bad
        decode = output.decode
        while left > 0:
            t0 = time.perf_counter()
            chunk = f.read(min(READ_CHUNK_BYTES, left))
            if not chunk:
                break
            left -= len(chunk)
            recs = []
            for line in lines.feed(chunk):
                if not line or line.startswith(_SKIPPED):
                    continue
                rec = decode(line)
                if rec is None:
                    self.num_bad += 1
                else:
                    recs.append(rec)
            self._feed(recs)
            self.num_seeded += len(recs)
            time.sleep((time.perf_counter() - t0) * (1 - SEED_SHARE) / SEED_SHARE)

    def take_rank_records(self, recs: list, num_bytes: int) -> None:
        """From the daemon's thread, a daemon not writing per-rank records: an ingest batch's
        per-rank Metrics (not late), for the per-rank ledgers. Handed before the batch's closed
        steps go out, so consume() feeds them before their step. O(1) here."""
        if self._rank_bytes_in - self._rank_bytes_out + num_bytes > self.rank_bytes_max:
            self.num_rank_dropped += len(recs)
            return
        self._rank_bytes_in += num_bytes
        self._ranks_in.append((recs, num_bytes))

    def _take_ranks(self, through_step: float) -> None:
        """The per-rank records handed over, to the per-rank ledgers alone (the job's ledger is
        what the files give: it never sees them): each ingest batch's that may hold a record of
        a step up to `through_step` (its lowest step is not beyond it), before the steps close.
        Those beyond wait their turn (a stage that lags holds them in the bounded queue, not in
        the ledgers' pending steps)."""
        q, rank_step = self._ranks_in, self.ledger.ranks.rank_step
        while q:
            recs, num_bytes = q[0]
            if recs and min(r.step for r in recs) > through_step:
                break
            q.popleft()
            self.num_rank_fed += len(recs)
            for i in range(0, len(recs), LOCK_RECORDS):
                with self._lock:
                    for r in recs[i:i + LOCK_RECORDS]:
                        rank_step(r.rank, r.step, r.t_ns / 1e9, r.values)
            self._rank_bytes_out += num_bytes

    def consume(self, batch: list[Out]) -> None:
        recs = [o.record for o in batch if o.kind in _FED]
        if self._ranks_in:
            steps = [r["step"] for r in recs if r["kind"] == "metrics" and "rank" not in r and type(r.get("step")) is int]
            if steps:
                self._take_ranks(max(steps))
        self._feed(recs)

    def _feed(self, recs: list[dict]) -> None:
        """Feed records, a few at a time under the lock: the daemon's thread takes it to read the
        ledger (status, its daemon records) and must never wait long."""
        feed = self.ledger.feed
        for i in range(0, len(recs), LOCK_RECORDS):
            with self._lock:
                for rec in recs[i:i + LOCK_RECORDS]:
                    feed(rec)

    def flush(self) -> None:
        if (self._ranks_path is not None and self.num_rank_fed and self.ledger.num_records != self._ranks_fed
                and time.monotonic() - self._ranks_written_at >= RANKS_WRITE_S):
            self._write_ranks()

    def close(self) -> None:
        if self._ranks_in:
            self._take_ranks(math.inf)     # steps that never closed: counted unmatched
        with self._lock:
            self._final = True             # nothing more comes: the counters take the whole ledger
        if self._ranks_path is not None and self.num_rank_fed and self.ledger.num_records != self._ranks_fed:
            self._write_ranks()

    def settled_values(self) -> dict[str, float]:
        """The settled ledger as cumulative counters (goodput/settled/<bucket>_s, .../wall_s:
        Prometheus and OTLP counters in seconds, so a cluster sums them across jobs): the time no
        later record can re-book (Ledger.settled), all of the ledger once the stage closed (the
        drain: nothing more comes). Never lower than a value given before: a bucket the ledger
        re-booked after it was settled (a launch that resumed from a checkpoint older than its
        predecessor's last save) holds, and settled_ahead_s in the stage's stats says by how much.
        Thread-safe."""
        with self._lock:
            if self._final:
                led = self.ledger.result()
                cur = {**led["buckets_s"], "wall": led["wall_s"]} if led.get("wall_s") else {}
            else:
                cur = self.ledger.settled()
            out = {}
            for k, v in cur.items():
                name = f"{SETTLED}{k}_s"
                v = round(max(0.0, v), 6)
                was = self._settled.get(name, 0.0)
                if v < was:
                    if self._final:
                        self.settled_ahead_s += was - v
                    v = was
                out[name] = self._settled[name] = v
            return out

    def _write_ranks(self) -> None:
        """goodput_ranks.json, replaced atomically (module docstring)."""
        from telemetry.shared import files

        with self._lock:
            self._ranks_written_at, self._ranks_fed = time.monotonic(), self.ledger.num_records
            ranks = self.ledger.ranks.result()
            counters = {"rank_records_dropped": self.num_rank_dropped,
                        "rank_records_not_kept": self.ledger.ranks.num_ranks_not_kept,
                        "rank_steps_unmatched": self.ledger.ranks.num_steps_unmatched}
        if not ranks:
            return
        try:
            files.write_file(self._ranks_path, ranks_file_data(ranks, time.time(), rank_counters(counters)))
        except OSError as exc:
            if not self._ranks_warned:
                self._ranks_warned = True
                log.warning("goodput: writing %s: %s (said once)", self._ranks_path, exc)

    def result(self) -> dict[str, Any]:
        """The ledger so far; thread-safe (the daemon's thread asks while this one feeds)."""
        with self._lock:
            out = self.ledger.result()
        if self.num_rank_dropped:
            out["rank_records_dropped"] = self.num_rank_dropped
        return out

    def stats(self) -> dict:
        try:
            led = self.result()
        except Exception:   # stats must never fail a status request
            log.exception("goodput: the ledger failed")
            return {}
        out = {k: led[k] for k in ("launches", "steps", "steps_missing", "wall_s", "goodput") if k in led}
        out["buckets_s"] = {k: round(led["buckets_s"][k], 3) for k in BUCKETS}
        if led.get("ranks"):     # per rank: its goodput
            out["ranks"] = {str(r): round(rl["goodput"], 4) if rl["goodput"] is not None else None
                            for r, rl in led["ranks"].items()}
        out.update(rank_counters(led))   # per-rank records the per-rank ledgers could not take, counted
        out["records_seeded"] = self.num_seeded
        if self.settled_ahead_s:
            out["settled_ahead_s"] = round(self.settled_ahead_s, 3)
        if self.num_bad:
            out["seed_lines_bad"] = self.num_bad
        return out
