"""The receiver stage: the ingest socket, its read-ahead queue (intake.py: bounded in bytes, the
excess shed and counted as it is read), the receiver's decoding and loss accounting
(receiver.py), and the drain of what the socket and the queue still hold.

Each frame is read off the socket once, into the read-ahead queue, in chunks (loops.read_frames_upto
or its C twin); a batch is a list taken from the queue's head and decoded as it is. What the
queue sheds it counts itself, in memory.shed and in records_shed_at_intake.

A batch all of metrics goes to the steps stage (`downstream`), any other to the rare records'
stage, which passes its metrics runs on to the steps.

The drain: what libzmq holds or is still reading off the wire is taken until every client that
was sending has said bye (or gone silent), processed through the pipeline (`process`) up to
PROCESS_SHARE of the stage's time (less when the open steps' flush would not fit) and only
counted after it (records_unread_at_drain), the byes and each client's first frame in hand
first: what the deadline leaves uncounted, the clients' byes account for (in transit).
"""
from __future__ import annotations

import logging
import time
from typing import Protocol

import zmq

from pathlib import Path

from telemetry.daemon import memory
from telemetry.daemon.intake import Intake
from telemetry.daemon.pipeline import Stage
from telemetry.daemon.receiver import Receiver
from telemetry.daemon.self_report import Losses
from telemetry.shared import client_page

log = logging.getLogger("telemetry.daemon")

# Frames taken from the ingest socket per loop turn before housekeeping gets a look-in; also the
# unit the receiver, the aggregator and the bulk reduction work in. Small enough for a batch's
# records to stay in the CPU caches between the stages (larger batches measured slower, smaller
# ones no faster: benchmarks/ingest.py), large enough to amortise the per-batch work.
INGEST_BATCH = 1024
# The drain's intake, as shares of the stage's time (its deadline is the last call for byes):
# records are processed up to PROCESS_SHARE of it, then only counted up to COUNT_SHARE, then
# the socket is read on, until the deadline, only for the byes of clients still open.
PROCESS_SHARE = 2 / 3
COUNT_SHARE = 8 / 9
# At shutdown, intake ends once the ingest socket has been quiet this long (records still on the
# wire from ranks that just closed get in), or when its share of the time is spent (ranks still
# sending, or a backlog larger than the daemon can take in that time); the rest of the deadline
# is the sinks' to flush. What is still queued then is read and counted as lost, as far as the
# deadline allows; what is left after that, the clients' byes account for.
INTAKE_QUIET_S = 0.05
# ... unless a client that was still sending when the drain began has not said bye yet (its bye
# carries its final seq: only with it is what it sent and this daemon never got counted). Then
# intake waits for the bye, or for the socket to be quiet this long (a rank killed or hung
# mid-drain, which will never say bye; named in sources_open_at_drain). Under CPU hogs a busy
# sender and libzmq's I/O thread go unscheduled for a while: the first empty read is no proof.
SOURCE_SILENT_S = 1.0
# ... and for the byes at most this long into the drain, once the socket has a quiet moment: ranks
# that go on sending (a daemon restarted under a running job) will not say bye soon, and their
# accounting goes on in the next daemon on this log directory (sources.json).
BYE_WAIT_S = 5.0
# Frames counted (their headers only) per turn once processing stops: the deadline is looked at
# between turns.
COUNT_BATCH = 1024
# Processing stops early enough that the open steps still go out, and the queue is scanned for
# the byes, before the count's deadline: the flush at this many times the cost of a step as the
# steps stage measured it (or, before it has, as the drain does: the least a turn's time over
# the steps it closed, an upper bound of the step's own cost), DEFAULT_STEP_COST_S before any.
FLUSH_COST_FACTOR = 2.0
DEFAULT_STEP_COST_S = 2e-5
# The queue's two scans (take_rare, take_firsts) at this many times what its sample cost a frame
# (Intake.scan_cost_s): the sample is looked over in the CPU's caches, the whole queue is not,
# and the scans take frames out of it as well.
SCAN_COST_FACTOR = 8
# Sources still open at the drain's end named in the log (rank, src, the last seq seen).
MAX_OPEN_NAMED = 8


class Downstream(Protocol):
    """What the receiver needs of the stage after it (the steps stage: stages/steps.py)."""

    record_bytes: int      # estimated bytes of a metrics record in memory (the last batch's)

    def consume(self, batch: list) -> None:
        """A batch of metrics records, in the order they came."""

    def hand_out(self) -> None:
        """Pass on to the sinks what the stages made of the batches so far."""

    def num_open_steps(self) -> int:
        """Steps waiting for ranks (what a flush would send out now)."""

    def num_steps_out(self) -> int:
        """Steps sent out so far."""

    def step_cost_s(self) -> float | None:
        """What sending one step out costs now, as measured (None: not yet)."""

    def flush_open(self) -> None:
        """Send the open steps out now, with whatever ranks they have, and hand them on."""


class ReceiveStage(Stage):
    name = "receiver"
    # The rest of the drain (the open steps, the analysis stages, the sinks) has the other tenth.
    drain_share = 0.9

    def __init__(self, sock: zmq.Socket | None, receiver: Receiver, intake: Intake, losses: Losses,
                 page_dir: Path | None = None) -> None:
        self.sock = sock
        self.page_dir = page_dir      # the local clients' seq pages (client_page.py); None: not ipc
        self.pid_ns = client_page.pid_namespace()
        # The pages there already at start: of clients of a daemon before this one on the socket.
        self.pages_before: set[int] = set()
        if page_dir is not None:
            with client_page.PageDir(page_dir) as pages:
                self.pages_before = set(pages.listed())
        self.receiver = receiver
        self.intake = intake
        self.losses = losses
        self.downstream: Downstream | None = None      # the steps stage (set at start)
        self.rare: Stage | None = None                  # the rare records' stage (set at start)
        self.batch_bytes = 0                            # the last batch's frames, in bytes
        self.batch_frames = INGEST_BATCH      # frames per batch: memory.INGEST_BATCH_BYTES of them
        self.last_batch_mono = 0.0                      # when the last batch was taken

    def start(self) -> None:
        if self.intake.rings is not None:
            self.intake.rings.start()       # the marker clients look for: before any client's start

    def take(self, max_frames: int) -> tuple[list, bool, int]:
        """Read ahead what the socket holds (Intake.fill), then decode and account up to
        `max_frames` frames from the head of that queue: (the valid records in order, whether
        they are all metrics records, how many frames were taken)."""
        intake = self.intake
        intake.fill()
        frames, self.batch_bytes = intake.take_batch(max_frames)
        if not frames:
            return [], True, 0
        recs, all_metrics = self.receiver.accept(frames, self.batch_bytes)
        return recs, all_metrics, len(frames)

    def ingest(self, max_frames: int | None = None) -> int:
        """Take a batch of up to `max_frames` frames (the batch size the last one's frames call
        for) through the pipeline: an all-metrics batch to the steps stage, any other to the rare
        records' stage. Returns how many frames were taken. Records are single frames; the parts
        of a multipart message are taken as frames of their own (see protocol/README.md): a
        garbage part is counted as malformed."""
        recs, all_metrics, n = self.take(self.batch_frames if max_frames is None else max_frames)
        if not n:
            return 0
        frame_bytes = self.batch_bytes // n + 1
        self.downstream.record_bytes = frame_bytes * memory.RECORD_BYTES_PER_FRAME_BYTE
        self.batch_frames = max(1, min(INGEST_BATCH, memory.INGEST_BATCH_BYTES // frame_bytes))
        self.last_batch_mono = time.monotonic()
        if all_metrics:
            self.downstream.consume(recs)
        else:
            self.rare.consume(recs)
        return n

    def process(self) -> int:
        """One turn of the pipeline in the drain: a batch taken, processed, handed out; how many."""
        n = self.ingest()
        if n:
            self.downstream.hand_out()
        return n

    def __len__(self) -> int:
        return len(self.intake)

    def stats(self) -> dict:
        rx = self.receiver
        rings = self.intake.rings
        return {"records_keys_coerced": rx.num_keys_coerced,
                "values_refused_by_reason": dict(rx.values_refused),
                "per_rank": {str(r): v for r, v in rx.per_rank().items()},
                "inner_loops": rx.loops_name(),
                "intake": {**self.intake.stats(), **({"rings": rings.stats()} if rings is not None else {})}}

    # -- the drain -----------------------------------------------------------------------------
    def drain(self, deadline: float) -> bool:
        """Take and account what the clients sent, by `deadline` (the last call for byes); then
        the ingest socket closes. True when no client was left open."""
        start = time.monotonic()
        span = max(0.0, deadline - start)
        self.drain_intake(start + span * PROCESS_SHARE, start + span * COUNT_SHARE, deadline)
        if self.sock is not None:
            self.sock.close(linger=0)
        if self.intake.rings is not None:
            self.intake.rings.stop()
        return not self.losses.num_sources_open_at_drain

    def drain_intake(self, until: float, deadline: float, last_call: float | None = None) -> None:
        """Take records until every client that was sending when the drain began has said bye
        and the socket has been quiet INTAKE_QUIET_S, or it has been quiet SOURCE_SILENT_S
        whoever is still open (or INTAKE_QUIET_S after BYE_WAIT_S), or `deadline`. Up to `until`
        they are processed, and only while a turn as long as the longest so far and the open
        steps' flush (at the cost of a step measured as it goes) still end before `deadline`;
        then the open steps go out and the rest is only counted (their headers,
        records_unread_at_drain): the frames read ahead that are not metrics and each source's
        first in hand first (take_rare: the byes; take_firsts), then the socket's and the others.

        A client's bye closes its accounting: what it sent and this daemon never counted is then
        lost in transit, exactly. So the count is exact however slow the box is: the byes in
        hand are found by two bytes a frame, and what a count cut short by `deadline` leaves
        (read ahead or still in libzmq) is accounted by them, never left uncounted. The clients
        still open at the end are counted in sources_open_at_drain and named in the log with the
        last seq seen: what they sent after it, nobody counts.

        A bye can be late, though: libzmq's I/O thread, starved on a loaded box, may not have
        read it off the connection yet. So while a source that moved lately (hello or not) has
        no bye, a quiet socket ends the intake only after SOURCE_SILENT_S, and past `deadline`
        the socket is read on (and counted) until `last_call` for it. A bye also lies behind its
        client's backlog (one connection is one ordered stream), and a client met first in the
        drain (it connected last, on a loaded box: nothing of it taken before) is read on for
        just the same; one whose bye is still out of reach at `last_call` stays open, named
        with its last seq."""
        losses, receiver, intake, down = self.losses, self.receiver, self.intake, self.downstream
        if intake.rings is not None:
            intake.rings.scan()     # the loop's poll of new rings ends here: before any bye is read
        waiting = receiver.open_live()
        recent = receiver.open_live(hello_only=False)     # byes a drain can use, if they come
        num_known = len(receiver.sources)

        def open_now() -> tuple[set, set]:
            """`waiting` and `recent` as they stand: those still without a bye, plus the sources
            first met during the drain (a rank that connected late, whose whole stream and bye
            were still in libzmq or the read-ahead queue when the drain began: its bye lies
            behind its backlog on its connection, so it is read on for like the others)."""
            nonlocal num_known
            if len(receiver.sources) == num_known:       # sources are only ever added
                return receiver.still_open(waiting), receiver.still_open(recent)
            num_known = len(receiver.sources)
            return (receiver.still_open(waiting) | receiver.open_live(),
                    receiver.still_open(recent) | receiver.open_live(hello_only=False))
        last_call = deadline if last_call is None else max(deadline, last_call)
        started = quiet_since = time.monotonic()
        turn_s = 0.0                # the longest processing turn so far
        step_s = None               # the cost of emitting a step, as measured (FLUSH_COST_FACTOR)
        counting = False
        processed = 0
        # The two scans of the queue at the switch to counting (take_rare, take_firsts), at what
        # looking over a frame costs now: on a loaded box they are no longer free.
        scan_per_frame = intake.scan_cost_s()
        while True:
            now = time.monotonic()
            if not counting:
                num_open = down.num_open_steps()
                cost = down.step_cost_s() or step_s or DEFAULT_STEP_COST_S
                flush_s = FLUSH_COST_FACTOR * cost * num_open
                scan_s = SCAN_COST_FACTOR * scan_per_frame * len(intake)
                counting = now >= until or now + 2 * turn_s + flush_s + scan_s >= deadline
                if counting:
                    # The open steps go out now, inside the intake's time; then the byes read ahead.
                    down.flush_open()
                    flushed_at = time.monotonic()
                    # Each source's first frame in hand, so that its seq window starts there
                    # whatever is left uncounted at the deadline (it lies inside the window).
                    rare = intake.take_rare()
                    firsts = intake.take_firsts()
                    receiver.unread(rare + firsts)
                    losses.num_unread_at_drain += len(rare) + len(firsts)
                    log.info("drain: processing stopped after %.2f s; %d open steps out in %.2f s (%.2f s "
                             "foreseen), %d frames other than metrics and %d sources' first found in %.2f s "
                             "(%.2f s foreseen)", now - started, num_open, flushed_at - now, flush_s, len(rare),
                             len(firsts), time.monotonic() - flushed_at, scan_s)
            if counting:
                n = self.count_unread(COUNT_BATCH)
                losses.num_unread_at_drain += n
            else:
                steps_before = down.num_steps_out()
                n = self.process()
                processed += n
                took = time.monotonic() - now
                turn_s = max(turn_s, took)
                steps = down.num_steps_out() - steps_before
                if steps >= 16 and (step_s is None or took / steps < step_s):
                    step_s = took / steps
            now = time.monotonic()
            if not n and not counting and intake.fill_rings_to_end():
                n = -1                      # the rings' last records: not quiet yet
            if n:
                quiet_since = now
            else:
                quiet = now - quiet_since
                if quiet >= INTAKE_QUIET_S:
                    waiting, recent = open_now()
                    if not recent or quiet >= SOURCE_SILENT_S or now - started >= BYE_WAIT_S:
                        break
                self.sock.poll(int(INTAKE_QUIET_S * 1000 / 2) + 1)
            if now >= deadline:
                waiting, recent = open_now()
                if not recent or now >= last_call:
                    break
        left = len(intake)
        intake.take_all()
        log.info("drain intake: %d records processed, %d counted unread, %d left uncounted at the deadline "
                 "(accounted by their clients' byes), in %.2f s (a step's cost measured at %s)", processed,
                 losses.num_unread_at_drain, left, time.monotonic() - started,
                 "-" if step_s is None else f"{step_s * 1e6:.0f} µs")
        waiting, recent = open_now()
        ended = self.end_by_pages()
        # Still open: those the drain waited for, and every client without a bye long silent
        # (a remote rank killed, a predecessor's client that never came back): per_rank's `open`.
        still = (waiting | receiver.open_clients()) - ended
        recent -= ended
        losses.num_sources_open_at_drain = len(still)
        still |= recent
        if losses.num_unread_at_drain or left:
            log.error("drain deadline: %d queued records could not be processed and are counted as "
                      "lost (raise drain_timeout_s to keep them)", losses.num_unread_at_drain + left)
        if still:
            named = ", ".join(f"rank {receiver.sources[i].rank} (src {i}, last seq {receiver.sources[i].max_seq})"
                              for i in sorted(still)[:MAX_OPEN_NAMED])
            log.error("drain: %d client(s) still open at its end, without a bye: %s%s; what they sent after "
                      "their last record that arrived is counted only by a daemon restarted on this log "
                      "directory (sources_open_at_drain)", len(still), named,
                      " ..." if len(still) > MAX_OPEN_NAMED else "")

    def end_by_pages(self) -> set[int]:
        """Close the accounting of the local clients whose process has ended without a bye, by
        their pages (client_page.py): what each took a seq for and never sent is counted lost,
        for a client seen before, and for one never heard from whose page was made while this
        daemon ran (or, continuing a predecessor's accounting, before: the run's). The pages it
        is done with go: those used, those of clients whose bye came, and those of processes
        gone that were there before it started, of no run of its (said). Returns the sources
        ended."""
        if self.page_dir is None:
            return set()
        receiver, losses, own_ns = self.receiver, self.losses, self.pid_ns
        sources = receiver.sources
        ended: dict[int, tuple[int, int]] = {}
        closed: dict[int, tuple[int, int]] = {}      # of those, clients that closed: their tail was sent
        unaccounted = 0
        with client_page.PageDir(self.page_dir) as pages:
            for src_id in [i for i, s in sources.items() if not s.bye]:       # by name: never missed
                info = pages.read(src_id)
                if info is None or not client_page.final(info, own_ns):
                    continue                # none, or alive (or not judged here: another pid namespace)
                tail = receiver.end_by_page(src_id, info.next_seq)
                if tail is not None:
                    (closed if info.closed else ended)[src_id] = (info.pid, tail)
                pages.remove(src_id)
            for src_id in [i for i, s in sources.items() if s.bye]:
                pages.remove(src_id)        # kept by its client until a daemon had its bye
            for src_id in pages.listed():   # clients never heard from
                if src_id in sources:
                    continue
                info = pages.read(src_id)
                if info is None or not client_page.final(info, own_ns):
                    continue
                if src_id in self.pages_before and not receiver.had_predecessor:
                    unaccounted += 1        # another run's: there before this daemon, gone since
                else:
                    tail = receiver.add_unseen(src_id, info.rank, info.next_seq)
                    if tail is not None:
                        (closed if info.closed else ended)[src_id] = (info.pid, tail)
                pages.remove(src_id)
        if ended:
            total = sum(t for _, t in ended.values())
            losses.num_sources_ended_by_page += len(ended)
            losses.num_lost_with_client += total
            named = ", ".join(f"rank {sources[i].rank} (pid {pid}: {tail} unsent)"
                              for i, (pid, tail) in sorted(ended.items())[:MAX_OPEN_NAMED])
            log.warning("drain: %d client(s) ended without a bye: %s%s; what each took a seq for and never sent, "
                        "by its seq page, is counted lost (records_lost_with_client: %d)", len(ended), named,
                        " ..." if len(ended) > MAX_OPEN_NAMED else "", total)
        if closed:
            # Sent, with a bye no daemon read (a predecessor killed first): lost in transit.
            losses.num_sources_closed_by_page += len(closed)
            named = ", ".join(f"rank {sources[i].rank} (pid {pid}: {tail} after the last that arrived)"
                              for i, (pid, tail) in sorted(closed.items())[:MAX_OPEN_NAMED])
            log.warning("drain: %d client(s) closed with a bye that never arrived: %s%s; their final seq, by "
                        "their seq pages, counts what they sent after their last record that arrived as lost "
                        "in transit", len(closed), named, " ..." if len(closed) > MAX_OPEN_NAMED else "")
        if unaccounted:
            log.warning("drain: removed %d seq page(s) of clients that ended before this daemon started, never "
                        "heard from here: what they made is counted by no daemon", unaccounted)
        return set(ended) | set(closed)

    def count_unread(self, max_frames: int) -> int:
        """Read up to `max_frames` queued frames without processing them (their header only), so
        that the final counters say how much was lost instead of nothing: the socket's first (a
        bye libzmq still holds comes out within a frame per connection: its accounting closes
        even if the count is cut short), then those read ahead into the intake queue."""
        frames = []
        recv, again = self.sock.recv, zmq.Again
        try:
            for _ in range(max_frames):
                frames.append(recv(zmq.NOBLOCK))
        except again:
            pass
        if len(frames) < max_frames:
            frames += self.intake.take(max_frames - len(frames))
        if len(frames) < max_frames and self.intake.rings is not None:
            frames += self.intake.rings.drain()      # what the local clients' rings still hold
        self.receiver.unread(frames)      # their srcs' seq windows: arrived, not lost twice
        return len(frames)
