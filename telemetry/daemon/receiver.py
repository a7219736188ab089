"""Receiver: decodes and validates frames from the PULL socket and keeps the loss accounting.

Per client instance (`src`): records received, the lowest and highest sequence numbers seen
and the client's own cumulative drop count. Loss is exact even when records arrive out of order
(deferred tensor records): a src whose records min..max reached this daemon `received` times
lost (max - min + 1 - received), of which the client counted (dropped - dropped as of min)
itself and the rest vanished in transit (a daemon killed with records in its queue). A fresh
client starts at seq 0, so min is 0 for it; a daemon restarted mid-run accounts from the first
record it sees of each surviving client, never for what its predecessor received.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from itertools import repeat
from typing import Callable

from protocol import Bye, MalformedRecord, Metrics
from protocol.codec import check_names, decoder_parts
from telemetry.daemon import hotpath

log = logging.getLogger("telemetry.receiver")


@dataclass(slots=True)
class SourceStats:
    rank: int
    min_seq: int
    dropped_at_min: int       # the client's drop count when it sent record min_seq
    received: int = 0
    max_seq: int = -1
    dropped: int = 0          # the client's own count (in-band, cumulative)

    def lost(self) -> int:
        return max(0, self.max_seq - self.min_seq + 1 - self.received)

    def dropped_in_window(self) -> int:
        return max(0, self.dropped - self.dropped_at_min)


class Receiver:
    def __init__(self, native=hotpath.native) -> None:
        # The C loops (hotpath.native) or None: the pure-Python ones below. Same results.
        self.native = native
        self.sources: dict[int, SourceStats] = {}
        self.num_in = 0
        self.num_malformed = 0
        self.num_byes = 0
        self.last_malformed = ""

    def accept(self, frame: bytes):
        """Return the decoded record, or None (counted) if the frame is not a valid record."""
        recs, _, _ = self.accept_many([frame])
        return recs[0] if recs else None

    def accept_many(self, frames: list) -> tuple[list, list, bool]:
        """`take` over a list of frames."""
        recs, key_orders, all_metrics, _ = self.take(iter(frames).__next__, StopIteration, len(frames))
        return recs, key_orders, all_metrics

    def take(self, next_frame: Callable[[], bytes], empty: type[BaseException],
             max_frames: int) -> tuple[list, list, bool, int]:
        """Read up to `max_frames` frames with next_frame() (until it raises `empty`), then
        decode, validate and account each (frames are bounded by the socket's MAXMSGSIZE).

        Returns the valid records in order; beside them, for a metrics record, its key order
        (the same tuple object for the same keys in the same order: the aggregator compares
        them by identity; None for other kinds); whether they are all metrics records; and
        how many frames were read. The daemon's hot path: one loop, no call per record but the
        socket's and the decoder's (or the same in C, see hotpath.py).
        """
        if self.native is not None:
            frames = self.native.read_frames(next_frame, empty, max_frames)
            done = self._take_native(frames)
            if done is not None:
                return (*done, len(frames))
            next_frame, empty, max_frames = iter(frames).__next__, StopIteration, len(frames)
        decode, errors, good_names = decoder_parts()
        sources = self.sources
        out: list = []
        key_orders: list = []
        append, append_keys = out.append, key_orders.append
        all_metrics = True
        n = 0
        for _ in repeat(None, max_frames):
            try:
                frame = next_frame()
            except empty:
                break
            n += 1
            try:
                rec = decode(frame)
                kind = type(rec)
                if kind is Metrics:
                    keys = tuple(rec.values)
                    keys = good_names.get(keys) or check_names(keys)
                else:
                    keys = None
                    all_metrics = False
            except (*errors, MalformedRecord) as exc:
                self._reject(exc)
                continue
            src = sources.get(rec.src)
            if src is None:
                src = sources[rec.src] = SourceStats(rank=rec.rank, min_seq=rec.seq, dropped_at_min=rec.dropped)
            src.received += 1
            seq = rec.seq
            if seq > src.max_seq:
                src.max_seq = seq
            elif seq < src.min_seq:
                src.min_seq = seq
                src.dropped_at_min = rec.dropped
            if rec.dropped > src.dropped:
                src.dropped = rec.dropped
            if kind is Bye:
                self.num_byes += 1
            append(rec)
            append_keys(keys)
        self.num_in += len(out)
        return out, key_orders, all_metrics, n

    def _take_native(self, frames: list) -> tuple[list, list, bool] | None:
        """`take` in C for a batch of valid records whose key orders are all known good; None
        for any other batch (a malformed frame, names not checked yet), which `take` then does
        record by record."""
        decode, errors, good_names = decoder_parts()
        try:
            recs = list(map(decode, frames))
        except errors:
            return None
        key_orders, all_metrics, num_byes, per_src, unknown = self.native.tally(recs, Metrics, Bye, good_names)
        if unknown:
            return None
        sources = self.sources
        for src_id, rank, count, min_seq, dropped_at_min, max_seq, dropped in per_src:
            src = sources.get(src_id)
            if src is None:
                sources[src_id] = SourceStats(rank, min_seq, dropped_at_min, count, max_seq, dropped)
                continue
            src.received += count
            if max_seq > src.max_seq:
                src.max_seq = max_seq
            if min_seq < src.min_seq:
                src.min_seq = min_seq
                src.dropped_at_min = dropped_at_min
            if dropped > src.dropped:
                src.dropped = dropped
        self.num_byes += num_byes
        self.num_in += len(recs)
        return recs, key_orders, all_metrics

    def _reject(self, exc: Exception) -> None:
        if isinstance(exc, RecursionError):   # deeply nested maps/arrays inside an event's data
            exc = MalformedRecord("nesting too deep")
        self.num_malformed += 1
        if self.num_malformed == 1 or self.num_malformed % 10_000 == 0:  # never log per item
            log.warning("rejected malformed record (%d so far): %s", self.num_malformed, exc)
        self.last_malformed = str(exc)[:200]

    def malformed(self, n: int = 1, reason: str = "") -> None:
        """Count frames refused before decoding (multipart, oversized)."""
        self.num_malformed += n
        if reason:
            self.last_malformed = reason

    def totals(self) -> dict:
        lost = dropped = transit = 0
        for s in self.sources.values():
            n_lost, n_dropped = s.lost(), s.dropped_in_window()
            lost += n_lost
            dropped += n_dropped
            transit += max(0, n_lost - n_dropped)
        return {
            "records_in": self.num_in,
            "records_malformed": self.num_malformed,
            "records_dropped_by_clients": dropped,
            # Counted by no one: sent (seq assigned, not dropped by the client) and never received.
            "records_lost_in_transit": transit,
            "records_lost": lost,
            "num_sources": len(self.sources),
        }

    def per_rank(self) -> dict[int, dict]:
        out: dict[int, dict] = {}
        for s in self.sources.values():
            r = out.setdefault(s.rank, {"received": 0, "lost": 0, "dropped_by_client": 0, "sources": 0})
            r["received"] += s.received
            r["lost"] += s.lost()
            r["dropped_by_client"] += s.dropped_in_window()
            r["sources"] += 1
        return out


