"""A head's view of each node's clock: the times of a node whose clock is minutes off are corrected.

Every time in a record is the sender's wall clock. One node of a job 5 minutes ahead made the
head's steps 5 minutes late (a step's time is the latest of its records': aggregator), and the
goodput ledger counted those minutes as start-up. A head compares
each node's clock with its own on the records a node sends as soon as it makes them: its hellos
(at start and on each connect) and its daemon's heartbeat events (`node_daemon`, `group_daemon`,
every few seconds). For such a record, t - (when the head takes it in) = the node's offset - the
delay, and the delay is milliseconds unless the record waited (a head outage, a backlog): so only
AGREE_N observations in a row within AGREE_S of each other count (replayed records, stale by
different amounts, do not agree), and their largest is the estimate. An offset of at least
SKEW_MIN_S is corrected: from then on that node's records' times (and its hellos' `started_at`)
are moved by it, and an event `clock_offset` says so; one that falls back under it is no longer
corrected. A smaller offset is left as it is: it cannot be told from a head's own backlog.

Nothing here costs anything while no node's clock is off: the correction runs on a batch only
when some node has an offset.
"""
from __future__ import annotations

from collections import deque

import msgspec

from protocol import Hello
from protocol.output import EventRecord
from telemetry.shared.numbers import is_number

SKEW_MIN_S = 30.0
AGREE_S = 5.0
AGREE_N = 2
# The records a node sends as soon as it makes them.
CLOCK_EVENTS = frozenset({"node_daemon", "group_daemon"})
# Sources whose observations are kept (a bound like the world's).
MAX_SOURCES = 1 << 16


class NodeClocks:
    def __init__(self) -> None:
        self.offset_ns: dict[int, int] = {}     # src -> the correction applied (its clock - ours)
        self._seen: dict[int, deque] = {}       # src -> its last observations (s)
        self.num_corrected = 0                  # records whose times were moved

    def observe(self, src: int, rank: int, t_ns: int, now_ns: int) -> EventRecord | None:
        """One observation of `src`'s clock; the event record to write if its correction changed."""
        seen = self._seen.get(src)
        if seen is None:
            if len(self._seen) >= MAX_SOURCES:
                return None
            seen = self._seen[src] = deque(maxlen=AGREE_N)
        seen.append((t_ns - now_ns) / 1e9)
        if len(seen) < AGREE_N or max(seen) - min(seen) > AGREE_S:
            return None
        estimate_s = max(seen)
        new_ns = int(estimate_s * 1e9) if abs(estimate_s) >= SKEW_MIN_S else 0
        old_ns = self.offset_ns.get(src, 0)
        if abs(new_ns - old_ns) <= AGREE_S * 1e9 and (new_ns == 0) == (old_ns == 0):
            return None
        if new_ns:
            self.offset_ns[src] = new_ns
        else:
            self.offset_ns.pop(src, None)
        return EventRecord(now_ns / 1e9, rank, "clock_offset",
                           {"offset_s": round(new_ns / 1e9, 3), "observed_s": round(estimate_s, 3), "src": src})

    def correct(self, recs: list) -> list:
        """`recs` with the times of the records of sources whose clock is off moved to this daemon's."""
        offsets = self.offset_ns
        out = []
        for rec in recs:
            off = offsets.get(rec.src)
            if off is not None:
                rec = self.correct_one(rec, off)
            out.append(rec)
        return out

    def correct_one(self, rec, off: int):
        self.num_corrected += 1
        if type(rec) is Hello and is_number(rec.info.get("started_at")):
            info = {**rec.info, "started_at": rec.info["started_at"] - off / 1e9}
            return msgspec.structs.replace(rec, t_ns=rec.t_ns - off, info=info)
        return msgspec.structs.replace(rec, t_ns=rec.t_ns - off)

    def stats(self) -> dict:
        return {"offsets_s": {str(src): round(off / 1e9, 3) for src, off in self.offset_ns.items()},
                "records_corrected": self.num_corrected}
