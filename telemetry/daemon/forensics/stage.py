"""The forensics stage: watches the output stream like a sink, off the daemon's thread.

From the records it is handed it learns each rank's pid, host and stacks signal/file (hello),
which ranks finished (bye), and when the aggregated step last advanced (metrics). On its timer
(flush) it checks two things, and collects a bundle (collect.py) on its own thread, so the
daemon's loop never waits for a signal, a dump or py-spy:

    hang         no aggregated step for max(hang_min_s, hang_factor x the median step time of
                 the last steps) -> one bundle and one `diagnosis/hang` event per hang (re-armed
                 when a step completes again)
    rank_exited  a rank's process on this host is gone without a bye (EXIT_GRACE_S after it was
                 first seen gone) -> a bundle of the others
                 and one `diagnosis/rank_exited` event with its exit code where it can be known

The last records each rank sent come from `recent`: the daemon appends each batch of metrics
records it ingests (one deque append per batch, nothing per record); the stage reads it only
when it collects.
"""
from __future__ import annotations

import json
import logging
import os
import statistics
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

from telemetry.daemon.forensics import stacks
from telemetry.daemon.forensics.collect import exit_status, process_state, py_spy, signal_stacks
from telemetry.daemon.sinks.base import Out, Sink

log = logging.getLogger("telemetry.daemon")

# Batches of metrics records kept for "the last records each rank sent".
RECENT_BATCHES_KEPT = 256
# Step durations the median step time is taken over.
STEP_TIMES_KEPT = 50
# How long a rank's process may be gone before it counts as exited without a bye: a rank that
# exits right after its bye is gone before the bye has come through the pipeline (the daemon
# holds a bye that overtook its records up to core.BYE_HOLD_S, 2 s).
EXIT_GRACE_S = 3.0


class ForensicsStage(Sink):
    name = "forensics"

    def __init__(self, cfg, log_dir: Path, host: str, post: Callable[[dict], None],
                 recent: deque) -> None:
        self.cfg = cfg                      # DiagnosisConfig: hang_* fields
        self.log_dir = Path(log_dir)
        self.host = host
        self.post = post
        self.recent = recent
        self.ranks: dict[int, dict] = {}    # rank -> its latest hello info
        self.byes: set[int] = set()
        self.exited: set[int] = set()
        self.gone_since: dict[int, tuple] = {}   # rank -> (when first seen gone, exit code, how)
        self.last_step: int | None = None
        self.last_step_t: float | None = None
        self.last_advance_mono: float | None = None
        self.step_times_s: deque[float] = deque(maxlen=STEP_TIMES_KEPT)
        self.hang_reported = False
        self.num_bundles = 0
        self.num_hangs = 0
        self.num_exits = 0

    # -- what the stream says ------------------------------------------------------------------
    def consume(self, batch: list[Out]) -> None:
        for o in batch:
            kind, rec = o.kind, o.record
            if kind == "metrics":
                if rec.get("rank") is None:
                    self._note_step(rec)
            elif kind == "hello":
                rank = rec.get("rank")
                if isinstance(rank, int):
                    self.ranks[rank] = rec.get("info") or {}
                    self.byes.discard(rank)
                    self.exited.discard(rank)
                    self.gone_since.pop(rank, None)
            elif kind == "bye":
                rank = rec.get("rank")
                if isinstance(rank, int):
                    self.byes.add(rank)

    def _note_step(self, rec: dict) -> None:
        step, t = rec.get("step"), rec.get("t")
        if not isinstance(step, int) or not isinstance(t, (int, float)):
            return
        if self.last_step is not None and step > self.last_step and self.last_step_t is not None:
            self.step_times_s.append(max(0.0, (t - self.last_step_t) / (step - self.last_step)))
        if self.last_step is None or step > self.last_step:
            self.last_step, self.last_step_t = step, t
            self.last_advance_mono = time.monotonic()
            self.hang_reported = False

    # -- the timer -----------------------------------------------------------------------------
    def flush(self) -> None:
        if not self.cfg.hang_enabled:
            return
        try:
            self._check_exits()
            self._check_hang()
        except Exception:   # forensics must never take the daemon down
            log.exception("forensics check failed")

    def hang_after_s(self) -> float:
        median = statistics.median(self.step_times_s) if self.step_times_s else 0.0
        return max(self.cfg.hang_min_s, self.cfg.hang_factor * median)

    def _live_local_ranks(self) -> dict[int, dict]:
        return {r: info for r, info in self.ranks.items()
                if r not in self.byes and r not in self.exited and isinstance(info.get("pid"), int)
                and info.get("host") in (None, self.host)}

    def _check_hang(self) -> None:
        if self.hang_reported or self.last_advance_mono is None:
            return
        live = self._live_local_ranks()
        if not live:
            return
        stalled_s = time.monotonic() - self.last_advance_mono
        if stalled_s < self.hang_after_s():
            return
        self.hang_reported = True
        self.num_hangs += 1
        self._bundle("hang", live, stalled_s=stalled_s)

    def _check_exits(self) -> None:
        for rank, info in list(self._live_local_ranks().items()):
            if rank in self.gone_since:
                first_s, code, how = self.gone_since[rank]   # the status as first seen (before a reap)
            else:
                gone, code, how = exit_status(info["pid"])
                if not gone:
                    continue
                first_s = time.monotonic()
                self.gone_since[rank] = (first_s, code, how)
            if time.monotonic() - first_s < EXIT_GRACE_S:
                continue                    # its bye may still be on its way
            self.exited.add(rank)
            self.num_exits += 1
            self._bundle("rank_exited", self._live_local_ranks(), exited=(rank, code, how))

    # -- the bundle ----------------------------------------------------------------------------
    def _bundle(self, what: str, live: dict[int, dict], *, stalled_s: float = 0.0,
                exited: tuple[int, int | None, str] | None = None) -> None:
        when = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        out_dir = self.log_dir / "forensics" / f"{when}-{what}"
        suffix = 1
        while out_dir.exists():
            suffix += 1
            out_dir = self.log_dir / "forensics" / f"{when}-{what}-{suffix}"
        out_dir.mkdir(parents=True)
        with_stacks = {r: (i["pid"], i["stacks_file"], i["stacks_signal"]) for r, i in live.items()
                       if isinstance(i.get("stacks_signal"), int) and isinstance(i.get("stacks_file"), str)}
        dumps = signal_stacks(with_stacks, self.cfg.hang_stacks_wait_s) if with_stacks else {}
        records = self._recent_by_rank()
        per_rank: dict[int, dict[str, Any]] = {}
        for rank, info in sorted(live.items()):
            dump = dumps.get(rank, {"error": info.get("stacks_unavailable", "the client registered no stacks signal")})
            where = stacks.where(stacks.parse(dump)) if isinstance(dump, str) else None
            recs = records.get(rank, [])
            per_rank[rank] = {
                "rank": rank, "pid": info["pid"], "host": info.get("host"),
                "last_step": recs[-1]["step"] if recs else None,
                "where": where.phrase if where else None, "waiting": where.waiting if where else None,
                "python_stacks": dump, "py_spy": py_spy(info["pid"], self.cfg.hang_py_spy),
                "process": process_state(info["pid"]), "last_records": recs}
            (out_dir / f"rank{rank}.json").write_text(json.dumps(per_rank[rank], indent=1, default=str))
        message, culprits = self._message(what, per_rank, stalled_s, exited)
        summary = {"what": what, "message": message, "ranks_named": culprits, "last_step": self.last_step,
                   "stalled_s": round(stalled_s, 3), "hang_after_s": round(self.hang_after_s(), 3),
                   "host": self.host, "ranks": {r: {k: p[k] for k in ("pid", "last_step", "where", "waiting")}
                                                 for r, p in per_rank.items()}}
        if exited is not None:
            summary["exited"] = {"rank": exited[0], "exit_code": exited[1], "how": exited[2]}
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        (out_dir / "summary.txt").write_text(message + "\n\n" + "\n".join(
            f"rank {r}: {p['where'] or 'no stack'} (last step {p['last_step']})" for r, p in per_rank.items()) + "\n")
        self.num_bundles += 1
        data = {"message": message, "rule": what, "severity": "critical", "subject": "run",
                "bundle": str(out_dir), "ranks": culprits, "step": self.last_step, "stalled_s": round(stalled_s, 3),
                "num_suppressed": 0}
        if exited is not None:
            data.update(exited_rank=exited[0], exit_code=exited[1], how=exited[2])
        rank = exited[0] if exited is not None else (culprits[0] if len(culprits) == 1 else None)
        log.error("diagnosis: %s (bundle %s)", message, out_dir)
        self.post({"kind": "event", "t": time.time(), "rank": rank, "name": f"diagnosis/{what}", "data": data})

    def _recent_by_rank(self) -> dict[int, list[dict]]:
        n = self.cfg.hang_records_kept
        out: dict[int, list[dict]] = {}
        for batch in reversed(list(self.recent)):        # newest batch first
            for rec in reversed(batch):
                kept = out.setdefault(rec.rank, [])
                if len(kept) < n:
                    kept.append({"step": rec.step, "t": rec.t_ns / 1e9, "values": dict(rec.values)})
        for kept in out.values():
            kept.reverse()
        return out

    def _message(self, what: str, per_rank: dict[int, dict], stalled_s: float,
                 exited: tuple | None) -> tuple[str, list[int]]:
        known = {r: p for r, p in per_rank.items() if p["where"]}
        not_waiting = sorted(r for r, p in known.items() if not p["waiting"])
        waiting = sorted(r for r, p in known.items() if p["waiting"])
        if not_waiting and waiting:
            culprits = not_waiting
        else:   # all alike by that test: the ranks whose innermost frame differs from the most common
            counts: dict[str, int] = {}
            for p in known.values():
                counts[p["where"]] = counts.get(p["where"], 0) + 1
            common = max(counts, key=counts.get) if counts else None
            culprits = sorted(r for r, p in known.items() if p["where"] != common) if len(counts) > 1 else []
        parts = []
        for r in culprits:
            parts.append(f"rank {r} {known[r]['where']}")
        rest = sorted(r for r in known if r not in culprits)
        if rest:
            phrases = {known[r]["where"] for r in rest}
            names = ", ".join(str(r) for r in rest)
            label = "rank" if len(rest) == 1 else "ranks"
            verb_phrase = known[rest[0]]["where"] if len(phrases) == 1 else "are elsewhere (see the bundle)"
            if len(rest) == 1 and verb_phrase.startswith("wait "):
                verb_phrase = "waits " + verb_phrase[len("wait "):]
            parts.append(f"{label} {names} {verb_phrase}")
        no_stack = sorted(r for r in per_rank if r not in known)
        if no_stack:
            parts.append(f"no Python stack from rank(s) {', '.join(map(str, no_stack))}")
        where = "; ".join(parts) or "no stacks could be collected"
        if what == "hang":
            med = statistics.median(self.step_times_s) if self.step_times_s else None
            head = (f"hang: no step completed for {stalled_s:.1f} s after step {self.last_step}"
                    + (f" (median step time {med:.3g} s)" if med is not None else ""))
        else:
            rank, code, how = exited
            head = f"rank {rank} exited without a bye: {how}" + (f" (exit code {code})" if code is not None else "")
            culprits = [rank]
        return f"{head}: {where}", culprits

    def stats(self) -> dict:
        return {"bundles": self.num_bundles, "hangs": self.num_hangs, "ranks_exited": self.num_exits}
