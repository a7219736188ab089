"""A rank that stopped reporting: silent for rank_silence_s (tick), or missing from
rank_missing_steps consecutive aggregated steps (the daemon's "missing_ranks"); on a head, a node
whose link closed without its goodbye (the head's "link_closed" event: telemetry/daemon/node_links.py),
named at once rather than a step timeout and three missing steps later.

Silence is measured on the daemon's own monotonic clock, read when the rule takes a record,
never from a record's "t": that is the sending rank's wall clock, which may be minutes off (a
rank 600 s behind would look silent while it logs every 10 ms), and the daemon's wall clock
may step. The findings' "t" is the daemon's wall clock too (tick's `now`, or time.time()), so
the Diagnoser's rate limit compares times of one clock.
"""
from __future__ import annotations

import time
from typing import Callable

from telemetry.daemon.diagnosis.config import DiagnosisConfig
from telemetry.daemon.diagnosis.rules.base import Finding, Rule, step_of
from telemetry.shared.numbers import is_int

_HINT = ("hung in a collective (NCCL), stuck in the data loader or a long checkpoint, or dead; "
         "py-spy dump --pid on that rank shows where")


def _rank(v: object) -> int | None:
    return v if is_int(v) else None


class RankStopped(Rule):
    """Known ranks come from hello and metrics records; a bye record retires a rank. The silence
    clock of a rank starts at its first metrics (loading a model before step 1 is not silence).
    Each stop is reported once; the rank reporting again re-arms it."""

    name = "rank_stopped"
    kinds = frozenset({"hello", "metrics", "bye", "event"})

    def __init__(self, cfg: DiagnosisConfig, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        super().__init__(cfg)
        self.clock = clock   # when a record was taken, and tick's "now" for silence (monotonic)
        self.wall = wall     # unix seconds for the findings of consume (tick's come with `now`)
        self.known: set[int] = set()
        self.last_seen: dict[int, float] = {}  # only ranks that have sent metrics: self.clock() then
        self.num_missing: dict[int, int] = {}
        self.stopped: set[int] = set()  # reported, not yet seen again
        self.run_silent_reported = False

    def _seen(self, rank: int, t: float) -> None:
        self.known.add(rank)
        self.last_seen[rank] = t
        self.num_missing[rank] = 0
        self.stopped.discard(rank)
        self.run_silent_reported = False

    def consume(self, record: dict) -> list[Finding]:
        kind, t = record.get("kind"), self.clock()
        rank = _rank(record.get("rank"))
        if kind == "hello":
            if rank is not None:
                self.known.add(rank)
                self.stopped.discard(rank)
            return []
        if kind == "bye":
            if rank is not None:  # a clean exit is not a stop
                for d in (self.last_seen, self.num_missing):
                    d.pop(rank, None)
                self.known.discard(rank)
                self.stopped.discard(rank)
            return []
        if kind == "event":
            return self._link_closed(record, rank) if record.get("name") == "link_closed" else []
        if rank is not None:
            self._seen(rank, t)
            return []
        missing_raw = record.get("missing_ranks") or []
        missing = {r for r in map(_rank, missing_raw if isinstance(missing_raw, list) else []) if r is not None}
        for r in self.known - missing:
            self._seen(r, t)
        out = []
        for r in sorted(missing):
            self.known.add(r)
            n = self.num_missing[r] = self.num_missing.get(r, 0) + 1
            if n >= self.cfg.rank_missing_steps and r not in self.stopped:
                self.stopped.add(r)
                msg = (f"rank {r} is missing from the last {n} aggregated steps (latest step {step_of(record)}) "
                       f"while the other ranks report: it may be {_HINT}")
                out.append(Finding(f"rank{r}", msg, self.wall(), rank=r, severity="critical",
                                   data={"num_steps_missing": n, "step": step_of(record)}))
        return out

    def _link_closed(self, record: dict, rank: int | None) -> list[Finding]:
        """A head's node (a rank, to this rule) whose link closed without a bye: stopped, said once
        (its missing steps then add nothing); its hello on a new link re-arms it."""
        if rank is None or rank in self.stopped:
            return []
        self.known.add(rank)
        self.stopped.add(rank)
        data = record.get("data") if isinstance(record.get("data"), dict) else {}
        link = data.get("link") if isinstance(data.get("link"), str) else "?"
        msg = (f"rank {rank}'s link to this daemon ({link}) closed without its goodbye: its daemon was killed, "
               f"or its host is down or unreachable; its steps go out without it once aggregator.step_timeout_s "
               f"has passed")
        return [Finding(f"rank{rank}", msg, self.wall(), rank=rank, severity="critical",
                        data={"link": link, "link_closed": True})]

    def tick(self, now: float) -> list[Finding]:
        limit, mono = self.cfg.rank_silence_s, self.clock()
        silent = {r: mono - t for r, t in self.last_seen.items() if mono - t >= limit}
        if not silent:
            return []
        if len(silent) == len(self.last_seen):
            # Every rank at once is one story (the whole job hung or was killed), not N.
            if self.run_silent_reported:
                return []
            self.run_silent_reported = True
            self.stopped.update(silent)
            quiet_s = min(silent.values())
            msg = (f"no rank has reported for {quiet_s:.0f} s ({len(silent)} rank(s) silent): the job may be {_HINT}, "
                   f"or it ended without saying goodbye")
            return [Finding("all", msg, now, severity="critical",
                            data={"num_ranks": len(silent), "silent_s": quiet_s})]
        out = []
        for r, quiet_s in sorted(silent.items()):
            if r in self.stopped:
                continue
            self.stopped.add(r)
            msg = (f"rank {r} has sent nothing for {quiet_s:.0f} s while "
                   f"{len(self.last_seen) - len(silent)} other rank(s) report: it may be {_HINT}")
            out.append(Finding(f"rank{r}", msg, now, rank=r, severity="critical", data={"silent_s": quiet_s}))
        return out
