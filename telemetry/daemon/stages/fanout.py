"""The fan-out stage: every output record encoded once and handed, a batch per loop turn, to each
sink's runner (sinks/base.py: a bounded queue and a thread each; PUB inline, first) and to the
analysis stages fed like sinks (runners flagged `analysis`: diagnosis, forensics, goodput).

Its drain: the media keeper is told to stop (it keeps what it holds, beside the sinks); the
first record of the drain (a script's exit code and when it exited, when its drain request
carried them: `exit_data`) goes to every runner, the analysis stages too (the goodput ledger
books a failed script's tail as hang by it; the W&B sink ends the run with it unless the script
finished the run itself); the analysis stages close, with a quarter of the time left (their
last events must still reach the sinks); then the last records (their last events,
`last_words`: the daemon's own record); then every sink drains, flushes, fsyncs and closes, in
parallel, until the deadline less ABANDON_GRACE_S (less its `close_reserve_s` for a sink whose
close takes time: W&B's finish, the run's exit record; moved on by the time a sink spends in
a `phase` during the drain, up to its `phase_allowance_s`: W&B's init or finish on a loaded
host, which the script's own W&B calls would have waited for); one still busy then takes no more
batches and has that grace (and its reserve) to finish the one in its hands, flush and close
(with nothing queued behind that batch, it drained), else it is abandoned (what it never wrote
is counted in its `dropped`), so a hung W&B never holds the daemon past the deadline.
"""
from __future__ import annotations

import collections
import logging
import time
from typing import Callable

from protocol import output
from protocol.output import EventRecord, OutputRecord
from telemetry.daemon.pipeline import Stage
from telemetry.daemon.shutdown import SCRIPT_EXIT_EVENT
from telemetry.daemon.sinks.base import InlineRunner, Out, SinkRunner, batch_bytes

log = logging.getLogger("telemetry.daemon")

# How long a sink abandoned at the deadline may take to finish the batch in its hands: kept
# inside the deadline (the sinks' own time ends this long before it; half the fan-out's time
# when that is shorter).
ABANDON_GRACE_S = 0.5
# A sink with a close reserve (W&B) is given up on at its reserve's start only with more records
# than this queued: about what W&B logs in a second or two on a loaded host.
EARLY_GIVE_UP_BACKLOG = 2000
# How often the drain looks whether a sink is still in a phase (FanOut._close_by), and after how
# long a wait for one it says so (a W&B start of a short script is often a moment of the drain).
PHASE_POLL_S = 0.1
PHASE_SAY_AFTER_S = 1.0
# Of the time left when the fan-out's drain begins, the analysis stages' share.
ANALYSIS_SHARE = 0.25


class FanOut(Stage):
    name = "fan-out"

    def __init__(self) -> None:
        self.runners: list[SinkRunner] = []
        self._in_order: list[SinkRunner] = []      # inline ones first (start)
        self._out: list[Out] = []
        self.num_records_out = 0
        # Records posted from other threads (the pollers': post), taken on the daemon's thread.
        self.inbox: collections.deque[OutputRecord] = collections.deque()
        self.media = None                          # the MediaKeeper (not on a head)
        self.media_files = None                    # who deletes the ranks' media files
        # The script's exit code as its launcher saw it, and when it exited (`telemetry run`'s drain
        # request: the script_exit event's data; None: no exit code).
        self.exit_data: Callable[[], dict | None] = lambda: None
        self.last_words: Callable[[], None] = lambda: None   # the drain's last records (the daemon's)
        # Called while the drain waits for a sink's slow phase (up to a minute): the daemon's
        # control socket is served meanwhile (`telemetry status`, a second `telemetry drain`).
        self.while_waiting: Callable[[], None] = lambda: None
        self.unfinished: list[str] = []            # runners (and "media") not drained by the deadline
        self.phase_waits: dict[str, float] = {}    # seconds the drain waited for a sink's phase, by runner
        self.closed_short: dict[str, int] = {}     # of those: closed, without this many records

    def add(self, runner: SinkRunner) -> SinkRunner:
        """A runner, under a name no other has: a second sink of the same name (two custom sinks
        of one class, a second OTLP endpoint) is `<name>-2`, and so on, so that neither's counters
        hide the other's in `status`, drain.json and the daemon's records."""
        taken = {r.name for r in self.runners}
        if runner.name in taken:
            n = 2
            while f"{runner.name}-{n}" in taken:
                n += 1
            log.info("a second sink named %s: its counters are under %s-%d", runner.name, runner.name, n)
            runner.name = f"{runner.name}-{n}"
        self.runners.append(runner)
        return runner

    def start(self) -> None:
        self._in_order = sorted(self.runners, key=lambda r: not isinstance(r, InlineRunner))
        for runner in self.runners:
            runner.start()
        if self.media is not None:
            self.media.start()

    def emit(self, rec: OutputRecord) -> None:
        self._out.append(Out(rec.kind, rec, output.encode(rec)))

    def put(self, out: Out) -> None:
        """An output record already encoded (a step's line)."""
        self._out.append(out)

    def event(self, name: str, data: dict) -> None:
        """An event of the daemon's own (no rank), for every runner."""
        self.emit(EventRecord(time.time(), None, name, data))

    def post(self, rec: OutputRecord) -> None:
        """Thread-safe: the record is emitted on the daemon's thread (take_inbox)."""
        self.inbox.append(rec)

    def take_inbox(self) -> None:
        inbox = self.inbox
        while inbox:
            self.emit(inbox.popleft())

    def num_pending(self) -> int:
        """Records emitted this turn, not handed out yet."""
        return len(self._out)

    def consume(self, batch: list) -> None:
        for rec in batch:
            self.emit(rec)

    def flush(self) -> None:
        """Hand this turn's records to every runner: inline sinks (PUB) first, so subscribers
        get the batch before any sink thread is woken."""
        if not self._out:
            return
        batch, self._out = self._out, []
        self.num_records_out += len(batch)
        num_bytes = batch_bytes(batch)        # once for every queue (they hold the same records)
        for runner in self._in_order:
            runner.put(batch, num_bytes)

    def queued(self) -> bool:
        return any(r.queued() for r in self.runners)

    def drain(self, deadline: float) -> bool:
        if self.media is not None:
            self.media.request_stop()       # it keeps what it holds, beside the sinks' drain
        grace = min(ABANDON_GRACE_S, max(0.0, deadline - time.monotonic()) / 2)
        stages = [r for r in self.runners if r.analysis]
        sinks = [r for r in self.runners if not r.analysis]
        data = self.exit_data()
        if data is not None:    # to the analysis stages too (the goodput ledger)
            self.event(SCRIPT_EXIT_EVENT, data)
            for r in self.runners:    # ... and to each sink at once, ahead of any backlog (Sink.script_exit)
                try:
                    r.sink.script_exit = dict(data)
                except AttributeError:      # an inline runner, or a sink of the user's that takes none
                    pass
        self.flush()
        unfinished = [r.name for r in stages
                      if not r.close(max(0.0, (deadline - time.monotonic()) * ANALYSIS_SHARE))]
        # Their part is over: what follows (their last events, the final counters) is for the sinks.
        self._in_order = [r for r in self._in_order if not r.analysis]
        self.take_inbox()
        self.last_words()
        self.flush()
        for runner in sinks:
            runner.request_stop()
        sinks_end = deadline - grace
        # A sink whose close takes time (W&B's finish) stops taking batches that long before the
        # end, so that it closes within the drain (its exit record) with what it wrote. They all
        # drain at once; those are waited for first, so that a slow one before them in the list
        # (a JSONL on a slow disk) cannot eat their reserve.
        left = max(0.0, sinks_end - time.monotonic())
        ends = {id(r): sinks_end - min(getattr(getattr(r, "sink", None), "close_reserve_s", 0.0), left / 2)
                for r in sinks}
        for r in sorted(sinks, key=lambda r: ends[id(r)]):
            if not self._close_by(r, ends[id(r)]):
                unfinished.append(r.name)
                # Given up on early only with a backlog it cannot log in its reserve anyway: a
                # slow start (W&B's init under load) with a few records queued logs them by the end.
                if ends[id(r)] < sinks_end and r.queued() > EARLY_GIVE_UP_BACKLOG:
                    r.give_up()     # the batch in its hands, then its close: the rest is counted dropped
        deadline += max(self.phase_waits.values(), default=0.0)
        if self.media is not None:
            if self.media.close(max(0.0, sinks_end - time.monotonic())):
                self.media_files.close()    # what a reader never released (its event dropped)
            else:
                unfinished.append("media")
        if unfinished:
            # What they never wrote is counted in their `dropped`, so the final counters add up.
            # Each is told first, then waited for: one grace for all of them, not one each.
            late = [r for r in self.runners if r.name in unfinished]
            for r in late:
                r.give_up()
            grace_end = max(time.monotonic(), deadline)
            for r in late:
                self._close_by(r, grace_end)     # its last batch, then its close (W&B's finish)
            ended = [r.name for r in late if r.abandon(0.0)]
            if ended:           # back from their last batch within the grace, nothing queued behind
                unfinished = [name for name in unfinished if name not in ended]
                log.warning("finished within the drain's grace, nothing dropped: %s", ", ".join(ended))
            # Closed, but without what was queued behind their last batch (counted dropped): not
            # drained, yet not "abandoned" either (W&B's run got its exit record).
            short = {r.name: r.ended_short() for r in late if r.name in unfinished}
            self.closed_short = {name: n for name, n in short.items() if n is not None}
            if self.closed_short:
                log.warning("closed in time without the records queued behind its last batch (counted "
                            "dropped): %s", ", ".join(f"{name} {n}" for name, n in self.closed_short.items()))
            busy = [name for name in unfinished if name not in self.closed_short]
            if busy:
                log.error("still busy at the drain deadline, abandoned: %s", ", ".join(busy))
        self.unfinished = unfinished
        return not unfinished

    def _close_by(self, r: SinkRunner, end: float) -> bool:
        """Wait for the runner `r` to drain and close by `end` (time.monotonic()); True if it did.
        Time its sink spends in a phase meanwhile (Sink.phase: W&B's `wandb.init` or `finish`
        on a loaded host) moves `end` on, up to its phase_allowance_s over the whole drain; how
        far is in phase_waits."""
        sink = getattr(r, "sink", None)
        allowance = getattr(sink, "phase_allowance_s", 0.0)
        if not allowance:
            return r.close(max(0.0, end - time.monotonic()))
        moved = 0.0                       # this call's; the allowance is what earlier calls left
        before = self.phase_waits.get(r.name, 0.0)
        said = ""
        while True:
            t0 = time.monotonic()
            phase = getattr(sink, "phase", "") if before + moved < allowance else ""
            if phase and phase != said and moved >= PHASE_SAY_AFTER_S:
                said = phase
                log.info("sink %s is still %s: the drain waits for it (up to %.0f s more in all)", r.name, phase,
                         allowance - before - moved)
            closed = r.close(PHASE_POLL_S if phase else max(0.0, min(PHASE_POLL_S, end + moved - t0)))
            if not closed:
                self.while_waiting()
            t1 = time.monotonic()
            if phase:
                moved = min(allowance - before, moved + (t1 - t0))
                self.phase_waits[r.name] = before + moved
                if before + moved >= allowance and not closed:
                    log.error("sink %s: still %s after the drain waited %.0f s for it: given up on", r.name,
                              phase, allowance)
            if closed or (not phase and t1 >= end + moved):
                return closed

    def stats(self) -> dict:
        return {"queued": {r.name: r.queued() for r in self.runners},
                "records_out": self.num_records_out,
                "phase_waits": dict(self.phase_waits),
                "sinks": {r.name: r.stats() for r in self.runners},
                "media": self.media.stats() if self.media is not None else {}}
