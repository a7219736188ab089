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

from protocol import Bye, MalformedRecord, decode

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
    def __init__(self) -> None:
        self.sources: dict[int, SourceStats] = {}
        self.num_in = 0
        self.num_malformed = 0
        self.num_byes = 0
        self.last_malformed = ""

    def accept(self, frame: bytes):
        """Return the decoded record, or None (counted) if the frame is not a valid record."""
        try:
            rec = decode(frame)
        except MalformedRecord as exc:
            self.num_malformed += 1
            if self.num_malformed == 1 or self.num_malformed % 10_000 == 0:  # never log per item
                log.warning("rejected malformed record (%d so far): %s", self.num_malformed, exc)
            self.last_malformed = str(exc)[:200]
            return None
        self.num_in += 1
        src = self.sources.get(rec.src)
        if src is None:
            src = self.sources[rec.src] = SourceStats(rank=rec.rank, min_seq=rec.seq, dropped_at_min=rec.dropped)
        src.received += 1
        if rec.seq > src.max_seq:
            src.max_seq = rec.seq
        elif rec.seq < src.min_seq:
            src.min_seq = rec.seq
            src.dropped_at_min = rec.dropped
        if rec.dropped > src.dropped:
            src.dropped = rec.dropped
        if type(rec) is Bye:
            self.num_byes += 1
        return rec

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


