"""The goodput ledger kept live (telemetry/shared/goodput.py), as a stage fed like a sink.

Every output record goes by it on its own thread and bounded queue (never the ingest loop's
time; what a burst leaves it no room for is dropped and counted in its runner's stats, and those
steps are then `unexplained` in the ledger). The daemon puts the running totals in its own
records (goodput/* values: every daemon_record_interval_s and a last one at the drain, so the
JSONL file, W&B's summary, Prometheus and `telemetry tail` have them) and in `telemetry status`.

A daemon restarted on a log directory continues the run's ledger: the stage first reads what
the files held when the daemon started (every rotated piece, then metrics.jsonl up to its size
then; opened on the daemon's thread, read on the stage's), then the records as they come; held to SEED_SHARE of the time while it reads.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from telemetry.daemon.sinks.base import Out, Sink
from telemetry.shared.goodput import BUCKETS, Ledger

log = logging.getLogger("telemetry.daemon")

# Reading the files at start shares the GIL with the daemon's ingest: held to this share of the
# time (a week-long run's file is gigabytes; GPU, host and daemon records, most of its lines,
# are told by their first bytes and never decoded).
SEED_SHARE = 0.25
_SKIPPED = (b'{"kind":"gpu"', b'{"kind":"system"', b'{"kind":"daemon"')
_FED = frozenset({"metrics", "event", "hello", "bye"})
LOCK_RECORDS = 256            # records fed per hold of the lock (~1 ms)


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

    def __init__(self, log_dir: Path | None = None, file_name: str = "metrics.jsonl") -> None:
        self.ledger = Ledger()
        self._lock = threading.Lock()
        self.num_seeded = 0            # records read from the files at start
        self.num_bad = 0               # lines there that were not a record
        self._seed: list[tuple[BinaryIO, int]] = []
        if log_dir is not None:
            self._open_seed(Path(log_dir), file_name)

    def _open_seed(self, log_dir: Path, file_name: str) -> None:
        """Open what the files hold now (the daemon's thread, before it writes anything)."""
        from telemetry.daemon.sinks.jsonl import rotated_files
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
        if self.num_seeded:
            led = self.result()
            log.info("goodput: continuing the run's ledger from %d record(s) on file (%d launch(es), %d step(s))",
                     self.num_seeded, led["launches"], led["steps"])

    def _read(self, f: BinaryIO, size: int) -> None:
        from telemetry.shared.jsonlines import MAX_LINE_BYTES, READ_CHUNK_BYTES, Lines

        lines, left = Lines(self, MAX_LINE_BYTES), size      # counts a line too long in num_bad
        decode = msgspec.json.decode
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
                try:
                    recs.append(decode(line))
                except (msgspec.DecodeError, ValueError):
                    self.num_bad += 1
            self._feed(recs)
            self.num_seeded += len(recs)
            time.sleep((time.perf_counter() - t0) * (1 - SEED_SHARE) / SEED_SHARE)

    def consume(self, batch: list[Out]) -> None:
        self._feed([o.record for o in batch if o.kind in _FED])

    def _feed(self, recs: list[dict]) -> None:
        """Feed records, a few at a time under the lock: the daemon's thread takes it to read the
        ledger (status, its daemon records) and must never wait long."""
        feed = self.ledger.feed
        for i in range(0, len(recs), LOCK_RECORDS):
            with self._lock:
                for rec in recs[i:i + LOCK_RECORDS]:
                    feed(rec)

    def result(self) -> dict[str, Any]:
        """The ledger so far; thread-safe (the daemon's thread asks while this one feeds)."""
        with self._lock:
            return self.ledger.result()

    def stats(self) -> dict:
        try:
            led = self.result()
        except Exception:   # stats must never fail a status request
            log.exception("goodput: the ledger failed")
            return {}
        out = {k: led[k] for k in ("launches", "steps", "steps_missing", "wall_s", "goodput") if k in led}
        out["buckets_s"] = {k: round(led["buckets_s"][k], 3) for k in BUCKETS}
        if led.get("ranks"):     # per rank (the daemon's --per-rank records): its goodput
            out["ranks"] = {str(r): round(rl["goodput"], 4) if rl["goodput"] is not None else None
                            for r, rl in led["ranks"].items()}
        out["records_seeded"] = self.num_seeded
        if self.num_bad:
            out["seed_lines_bad"] = self.num_bad
        return out
