"""The forensics stage: watches the output stream like a sink, off the daemon's thread.

From the records it is handed it learns this host's ranks (hello: each claim verified in /proc
by verify.py before it is believed; the host poller watches the verified ranks' pids only),
which ranks finished (bye), and when the aggregated step last advanced (metrics). On its timer
(flush) it checks two things, and collects a bundle (collect.py) on its own thread, so the
daemon's loop never waits for a signal, a dump or py-spy:

    hang         no aggregated step for max(hang_min_s, hang_factor x the median step time of
                 the last steps) -> one bundle and one `diagnosis/hang` event per hang (re-armed
                 when a step completes again)
    rank_exited  a rank's process on this host is gone without a bye (EXIT_GRACE_S after it was
                 first seen gone: when its pidfd polled readable, exitwatch.py, to the ms;
                 without a pidfd, at the timer's look; at the drain, whatever its grace had
                 left: no bye can come then) -> a bundle of the others
                 and one `diagnosis/rank_exited` event with its exit code where it can be known:
                 through the pidfd held since the rank was verified (Linux >= 6.15 keeps the
                 status after the launcher reaped it), else from a zombie's /proc/<pid>/stat

The last records each rank sent come from `recent`: the daemon appends each batch of metrics
records it ingests (one deque append per batch, nothing per record); the stage reads it only
when it collects.
"""
from __future__ import annotations

import json
import logging
import os
import stat
import statistics
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

from protocol.output import EventRecord
from telemetry.daemon.forensics import stacks
from telemetry.daemon.forensics.collect import exit_status, open_pidfd, process_state, py_spy, signal_stacks
from telemetry.daemon.forensics.exitwatch import ExitWatcher
from telemetry.daemon.forensics.verify import LocalRank, Verifier, claims_this_host
from telemetry.daemon.sinks.base import Out, Sink

log = logging.getLogger("telemetry.daemon")

# Step durations the median step time is taken over.
STEP_TIMES_KEPT = 50
# How long a rank's process may be gone before it counts as exited without a bye: a rank that
# exits right after its bye may be gone before the daemon has read the bye (it is told of a bye
# as it arrives, note_bye, however long the daemon then holds it behind its records).
EXIT_GRACE_S = 3.0
# The most ranks of this host the stage keeps (verified), and unverified claims it remembers
# (for the bundle's summary); refusals logged, in all.
MAX_LOCAL_RANKS = 1024
MAX_UNVERIFIED_KEPT = 1024
MAX_REFUSALS_LOGGED = 20


class ForensicsStage(Sink):
    name = "forensics"

    def __init__(self, cfg, log_dir: Path, host: str, post: Callable[[dict], None],
                 recent: deque, ingest: str = "",
                 on_ranks: Callable[[dict[int, int]], None] | None = None) -> None:
        """ingest: the daemon's local ingest endpoint (a verified rank is connected to it);
        on_ranks: called with {rank: pid} of the verified ranks whenever they change (the
        pollers' set_rank_pids), from this stage's thread."""
        self.cfg = cfg                      # DiagnosisConfig: enabled, hang_* fields
        self.log_dir = Path(log_dir)
        self.host = host
        self.post = post
        self.recent = recent
        self.on_ranks = on_ranks
        self.verifier = Verifier(ingest, host)
        self.ranks: dict[int, LocalRank] = {}   # rank -> its process, verified
        # rank -> a pidfd of it, held while it is watched: its exit status outlives the reap
        self.pidfds: dict[int, int] = {}
        self._exit_watch: ExitWatcher | None = None   # when each exited, to the ms (exitwatch.py)
        self.unverified: dict[int, str] = {}    # rank -> why its claim of this host was not believed
        self.num_refusals_logged = 0
        self.byes: set[int] = set()
        self._early_byes: deque[int] = deque()   # ranks whose bye arrived (note_bye), for this thread
        self.byes_pending: dict[int, int] = {}   # rank -> byes arrived whose record has not come through
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
        # Ranks whose bye is in this batch: a short script's whole life (its hello is read after
        # it has closed its connection, so it cannot be verified; nothing to warn about).
        leaving = {o.record.get("rank") for o in batch if o.kind == "bye"}
        for o in batch:
            kind, rec = o.kind, o.record
            if kind == "metrics":
                if rec.get("rank") is None:
                    self._note_step(rec)
            elif kind == "hello":
                rank = rec.get("rank")
                if isinstance(rank, int) and isinstance(rec.get("info"), dict):
                    self._on_hello(rank, rec["info"], quiet=rank in leaving)
            elif kind == "bye":
                rank = rec.get("rank")
                if isinstance(rank, int):
                    self.byes.add(rank)
                    self._take_early_byes()
                    if self.byes_pending.get(rank, 0) > 1:
                        self.byes_pending[rank] -= 1
                    else:
                        self.byes_pending.pop(rank, None)

    def note_bye(self, rank: int) -> None:
        """From the daemon's loop, as a bye arrives, before its record comes through (the daemon
        holds it behind its records, byes.BYE_HOLD_S): the rank finished; its exit is no crash.
        A deque's append is atomic; this stage's thread takes them (_take_early_byes)."""
        if isinstance(rank, int):
            self._early_byes.append(rank)

    def _take_early_byes(self) -> None:
        while self._early_byes:
            rank = self._early_byes.popleft()
            self.byes_pending[rank] = self.byes_pending.get(rank, 0) + 1

    def _on_hello(self, rank: int, info: dict, quiet: bool = False) -> None:
        """Believe a hello's claim to be a rank of this host only once verified (verify.py); an
        unverified one changes nothing of what is known (a verified rank stays verified)."""
        if not claims_this_host(info, self.host):
            return                          # another node's rank, or a node daemon: never ours
        found = self.verifier.verify(rank, info)
        if isinstance(found, str):
            if rank not in self.ranks and (rank in self.unverified or len(self.unverified) < MAX_UNVERIFIED_KEPT):
                self.unverified[rank] = found
            if quiet:
                log.debug("forensics: rank %d (pid %r) said hello and bye before it was verified: %s",
                          rank, info.get("pid"), found)
            elif self.num_refusals_logged < MAX_REFUSALS_LOGGED:
                self.num_refusals_logged += 1
                log.warning("forensics: rank %d's hello (pid %r) not verified as a process of this run: %s; "
                            "the daemon will not signal or read it", rank, info.get("pid"), found)
            return
        if self.ranks.get(rank) == found:
            return
        if rank not in self.ranks and len(self.ranks) >= MAX_LOCAL_RANKS:
            return
        self.ranks[rank] = found
        self._hold_pidfd(rank, open_pidfd(found))
        self.unverified.pop(rank, None)
        self.byes.discard(rank)
        self.exited.discard(rank)
        self.gone_since.pop(rank, None)
        if self.on_ranks is not None:
            self.on_ranks({r: lr.pid for r, lr in self.ranks.items()})

    def _hold_pidfd(self, rank: int, fd: int | None) -> None:
        old = self.pidfds.pop(rank, None)
        if old is not None:
            os.close(old)
            self.exit_watch.forget(rank)
        if fd is not None:
            self.pidfds[rank] = fd
            try:
                self.exit_watch.watch(rank, os.dup(fd))
            except OSError:                 # out of descriptors: the timer's look is all there is
                pass

    @property
    def exit_watch(self) -> ExitWatcher:
        if self._exit_watch is None:
            self._exit_watch = ExitWatcher()
        return self._exit_watch

    def close(self) -> None:
        """The drain (its runner flushed first): every rank seen gone without a bye gets its
        rank_exited now, its grace or not. No bye can come any more (the daemon read what the
        clients sent before its analysis stages close), and a launcher's teardown (every rank
        killed, its script's exit, the drain a second or two later) is the end of a hang whose
        only exit evidence this is (the goodput ledger ends the launch where it was seen gone)."""
        if self.cfg.enabled and self.cfg.hang_enabled:
            try:
                self._take_early_byes()
                self._check_exits(grace_s=0.0, seen_only=True)
            except Exception:   # forensics must never take the daemon down
                log.exception("forensics check at the drain failed")
        for rank in list(self.pidfds):
            self._hold_pidfd(rank, None)
        if self._exit_watch is not None:
            self._exit_watch.close()
            self._exit_watch = None

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
        if not (self.cfg.enabled and self.cfg.hang_enabled):
            return                          # the stage still verifies ranks for the pollers
        try:
            self._take_early_byes()
            self._check_exits()
            self._check_hang()
        except Exception:   # forensics must never take the daemon down
            log.exception("forensics check failed")

    def hang_after_s(self) -> float:
        median = statistics.median(self.step_times_s) if self.step_times_s else 0.0
        return max(self.cfg.hang_min_s, self.cfg.hang_factor * median)

    def _live_local_ranks(self) -> dict[int, LocalRank]:
        return {r: lr for r, lr in self.ranks.items()
                if r not in self.byes and r not in self.byes_pending and r not in self.exited}

    def _check_hang(self) -> None:
        if self.hang_reported or self.last_advance_mono is None:
            return
        # A rank already seen gone (its bye may still come, within its grace) is not hung: it
        # left. Said of it, a hang would have its launch last past its exit.
        live = {r: lr for r, lr in self._live_local_ranks().items() if r not in self.gone_since}
        if not live:
            return
        stalled_s = time.monotonic() - self.last_advance_mono
        if stalled_s < self.hang_after_s():
            return
        self.hang_reported = True
        self.num_hangs += 1
        self._bundle("hang", live, stalled_s=stalled_s)

    def _check_exits(self, grace_s: float = EXIT_GRACE_S, seen_only: bool = False) -> None:
        """grace_s: how long a rank must have been gone (its bye may still be on its way); none
        at the drain (close). seen_only (the drain): only ranks whose going is already known
        with its time (seen gone before, or timed by the exit watch); one first found gone now
        left since when is unknown, and its event would end the launch at the drain.
        Said in the order the ranks went, the first cause first: a launcher ends the other
        ranks after one failed (torchrun SIGTERMs them), and both are often past their grace
        at the same look (always at the drain)."""
        due = []
        for rank, lr in list(self._live_local_ranks().items()):
            if rank not in self.gone_since:
                gone, code, how = exit_status(lr, self.pidfds.get(rank))
                if not gone:
                    continue
                seen = self._exit_watch.exited_at(rank) if self._exit_watch is not None else None
                if seen is None and seen_only:
                    continue
                # the status as first seen (before a reap)
                self.gone_since[rank] = (seen if seen is not None else time.monotonic(), code, how)
            if time.monotonic() - self.gone_since[rank][0] >= grace_s:
                due.append(rank)            # else its bye may still be on its way
        for rank in sorted(due, key=lambda r: (self.gone_since[r][0], r)):
            first_s, code, how = self.gone_since[rank]
            self.exited.add(rank)
            self._hold_pidfd(rank, None)
            self.num_exits += 1
            self._bundle("rank_exited", self._live_local_ranks(), exited=(rank, code, how),
                         gone_since=first_s)

    # -- the bundle ----------------------------------------------------------------------------
    def _bundle(self, what: str, live: dict[int, LocalRank], *, stalled_s: float = 0.0,
                exited: tuple[int, int | None, str] | None = None, gone_since: float = 0.0) -> None:
        """gone_since: time.monotonic() when the exited rank was first seen gone."""
        out_dir = _new_bundle_dir(self.log_dir / "forensics", f'{time.strftime("%Y%m%d-%H%M%S", time.gmtime())}-{what}')
        with_stacks = {r: lr for r, lr in live.items() if lr.stacks_signal is not None}
        dumps = signal_stacks(with_stacks, self.cfg.hang_stacks_wait_s, self.pidfds) if with_stacks else {}
        records = self._recent_by_rank()
        per_rank: dict[int, dict[str, Any]] = {}
        for rank, lr in sorted(live.items()):
            dump = dumps.get(rank, {"error": lr.stacks_unavailable or "the client registered no stacks signal"})
            where = stacks.where(stacks.parse(dump)) if isinstance(dump, str) else None
            recs = records.get(rank, [])
            per_rank[rank] = {
                "rank": rank, "pid": lr.pid, "host": self.host,
                "last_step": recs[-1]["step"] if recs else None,
                "where": where.phrase if where else None, "waiting": where.waiting if where else None,
                "python_stacks": dump, "py_spy": py_spy(lr, self.cfg.hang_py_spy),
                "process": process_state(lr), "last_records": recs}
            _write_private(out_dir / f"rank{rank}.json", json.dumps(per_rank[rank], indent=1, default=str))
        message, culprits = self._message(what, per_rank, stalled_s, exited)
        summary = {"what": what, "message": message, "ranks_named": culprits, "last_step": self.last_step,
                   "stalled_s": round(stalled_s, 3), "hang_after_s": round(self.hang_after_s(), 3),
                   "host": self.host, "ranks": {r: {k: p[k] for k in ("pid", "last_step", "where", "waiting")}
                                                 for r, p in per_rank.items()}}
        if exited is not None:
            summary["exited"] = {"rank": exited[0], "exit_code": exited[1], "how": exited[2]}
        if self.unverified:
            summary["ranks_unverified"] = dict(sorted(self.unverified.items()))
        _write_private(out_dir / "summary.json", json.dumps(summary, indent=1, default=str))
        _write_private(out_dir / "summary.txt", message + "\n\n" + "\n".join(
            f"rank {r}: {p['where'] or 'no stack'} (last step {p['last_step']})" for r, p in per_rank.items()) + "\n")
        self.num_bundles += 1
        data = {"message": message, "rule": what, "severity": "critical", "subject": "run",
                "bundle": str(out_dir), "ranks": culprits, "step": self.last_step, "stalled_s": round(stalled_s, 3),
                "num_suppressed": 0}
        now = time.time()
        if exited is not None:
            # gone_for_s: how long before this event's t the process was first seen gone (the
            # goodput ledger ends the launch there, not at this event, EXIT_GRACE_S and the
            # bundle's collection later): read together with t.
            data.update(exited_rank=exited[0], exit_code=exited[1], how=exited[2],
                        gone_for_s=round(time.monotonic() - gone_since, 3))
        rank = exited[0] if exited is not None else (culprits[0] if len(culprits) == 1 else None)
        log.error("diagnosis: %s (bundle %s)", message, out_dir)
        self.post(EventRecord(now, rank, f"diagnosis/{what}", data))

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
        # A rank is named only when its stack says so: it is in its own code while the others wait
        # in a collective. All waiting, or none (a compute-bound loop, an unknown wait): the
        # stacks do not tell which rank holds the others up, and no rank is named.
        culprits = not_waiting if not_waiting and waiting else []
        parts = []
        if what == "hang" and not culprits and len(known) > 1:
            why = "every rank waits in a collective" if waiting else "no rank waits in a collective it knows"
            parts.append(f"the stacks cannot tell which rank holds the others up ({why})")
        for r in culprits:
            parts.append(f"rank {r} {known[r]['where']}")
        rest = sorted(r for r in known if r not in culprits)
        if rest and not culprits:   # nobody named: each rank's place, for the reader to judge
            for r in rest:
                phrase = known[r]["where"]
                parts.append(f"rank {r} " + ("waits " + phrase[len("wait "):] if phrase.startswith("wait ") else phrase))
        elif rest:
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
        return {"bundles": self.num_bundles, "hangs": self.num_hangs, "ranks_exited": self.num_exits,
                "ranks_verified": len(self.ranks), "hellos_verified": self.verifier.num_verified,
                "hellos_not_verified": self.verifier.num_refused}


def _new_bundle_dir(parent: Path, name: str) -> Path:
    """A new bundle directory, 0700, under `parent` (made 0700, and refused unless it is a real
    directory of ours: never a symlink planted in the log directory)."""
    try:
        parent.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(parent)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise OSError(f"{parent} is not a directory of ours: no bundle written")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(parent, 0o700)
    suffix = 1
    out_dir = parent / name
    while True:
        try:
            out_dir.mkdir(mode=0o700)
            return out_dir
        except FileExistsError:
            suffix += 1
            out_dir = parent / f"{name}-{suffix}"


def _write_private(path: Path, text: str) -> None:
    """A new file, 0600, never through a symlink."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
