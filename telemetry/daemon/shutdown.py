"""The daemon's drain: SIGTERM, SIGINT, a drain request or --watch-pid's process gone.

Stop intake, drain every stage and queue, flush, fsync, close, all within `drain_timeout_s`:

1. intake: what libzmq holds or is still reading off the wire is taken until every client that
   was sending has said bye (or gone silent), processed up to INTAKE_SHARE of the deadline (less
   when the open steps' flush would not fit) and only counted after it (records_unread_at_drain),
   the byes and each client's first frame in hand first: what the deadline leaves uncounted,
   the clients' byes account for (in transit); then the ingest socket closes;
2. the pipeline: open steps go out with whatever ranks they have (at the end of processing, in
   the intake's time), the held byes after them;
3. the analysis stages (diagnosis first: its last events must still reach the sinks) with a
   share of the time; the script's exit code when the drain request carried one (a
   `script_exit` event); then every sink drains, flushes, fsyncs and closes, in parallel; one
   still busy at the deadline is abandoned (named in the log and the reply), so a hung W&B
   never holds the daemon past the deadline;
4. the final counters: drain.json (self_report.status and how the drain went), the checkpoint
   for a successor (continuity.py), the reply to `telemetry drain`; then the sockets close.

`run(d)` returns the exit code: 1 if the JSONL sink could not hold everything or drain.json
could not be written, else 0.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

import msgspec
import zmq

from protocol.output import EventRecord
from telemetry.daemon.self_report import ANALYSIS_STAGES
from telemetry.shared import endpoints, files

log = logging.getLogger("telemetry.daemon")

# At shutdown, intake ends once the ingest socket has been quiet this long (records still on the
# wire from ranks that just closed get in), or when INTAKE_SHARE of drain_timeout_s is spent
# (ranks still sending, or a backlog larger than the daemon can take in that time); the rest of
# the deadline is the sinks' to flush. What is still queued then is read and counted as lost, as
# far as the deadline allows; what is left after that, the clients' byes account for.
INTAKE_QUIET_S = 0.05
INTAKE_SHARE = 0.6
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
# How long a sink abandoned at the deadline may take to finish the batch in its hands.
ABANDON_GRACE_S = 0.5
# Frames counted (their headers only) per turn once processing stops: the deadline is looked at
# between turns.
COUNT_BATCH = 1024
# Processing stops early enough that the open steps still go out before the intake's deadline:
# at this many times the cost of a step measured while processing (the least a turn's time over
# the steps it closed: an upper bound of the step's own cost), DEFAULT_STEP_COST_S before any.
FLUSH_COST_FACTOR = 2.0
DEFAULT_STEP_COST_S = 2e-5
# Sources still open at the drain's end named in the log (rank, src, the last seq seen).
MAX_OPEN_NAMED = 8

_json = msgspec.json.Encoder()
SCRIPT_EXIT_EVENT = "script_exit"     # {"exit_code": N}: a drain request's (shared/control.py)


def run(d) -> int:
    """Drain the daemon `d` (core.Daemon), once; the exit code."""
    now = time.monotonic()
    timeout_s = d.cfg.drain_timeout_s
    deadline = now + timeout_s
    log.info("draining (%s)", d.stop_reason)
    drain_intake(d, now + timeout_s * INTAKE_SHARE, now + timeout_s * (1 + INTAKE_SHARE) / 2, deadline)
    marks = [time.monotonic()]
    d.pull.close(linger=0)
    for p in d.pollers:
        try:
            p.close()
        except Exception as exc:   # a poller must not stop the drain
            log.error("poller %s close failed: %r", getattr(p, "name", p), exc)
    d.take_inbox()
    d.emit_steps(d.aggregator.flush())
    d.write_byes(d.byes.release(time.monotonic(), d.receiver.sources, everything=True))
    d.hand_out()
    if d.media is not None:
        d.media.request_stop()       # it keeps what it holds, beside the sinks' drain
    marks.append(time.monotonic())
    unfinished = _close_stages(d, deadline)
    if d.media is not None:
        if d.media.close(max(0.0, deadline - time.monotonic())):
            d.media_files.close()    # what a reader never released (its event dropped)
        else:
            unfinished.append("media")
    d.unfinished = unfinished
    if unfinished:
        # What they never wrote is counted in their `dropped`, so the final counters add up.
        # Each is told first, then waited for: one grace for all of them, not one each.
        late = [r for r in d.runners if r.name in unfinished]
        for r in late:
            r.give_up()
        grace_end = time.monotonic() + ABANDON_GRACE_S
        for r in late:
            r.abandon(max(0.0, grace_end - time.monotonic()))
        log.error("still busy at the drain deadline, abandoned: %s", ", ".join(unfinished))
    marks.append(time.monotonic())
    final = {"ok": True, "drained": not unfinished, "unfinished_sinks": unfinished,
             "stop_reason": d.stop_reason, **d.status()}
    final_written = write_drain_json(d.log_dir, final)
    d.continuity.write(d.num_records_out)
    d.control_server.answer_drain(final)
    _close(d, unfinished)
    marks.append(time.monotonic())
    log.info("drain: %.2f s of %.2f (intake %.2f, pipeline %.2f, stages and sinks %.2f, final counters "
             "and close %.2f)", marks[-1] - now, timeout_s, marks[0] - now,
             *(b - a for a, b in zip(marks, marks[1:])))
    log.info("stopped: %d records in, %d malformed, %d lost, %d steps out", final["records_in"],
             final["records_malformed"], final["records_lost"], final["steps_out"])
    failed = d.jsonl_runner.sink.failed()
    if failed:
        log.error("%s could not hold everything it was handed (%s): exit 1",
                  d.jsonl_runner.sink.path, _json.encode(final["sinks"].get("jsonl")).decode())
    return 0 if d.jsonl_runner.name not in unfinished and not failed and final_written else 1


def _close_stages(d, deadline: float) -> list[str]:
    """The analysis stages, with a quarter of the time left; then the daemon's own record and
    every sink, until the deadline. The names of those still busy then."""
    stages = [r for r in d.runners if r.name in ANALYSIS_STAGES]
    sinks = [r for r in d.runners if r.name not in ANALYSIS_STAGES]
    unfinished = [r.name for r in stages if not r.close(max(0.0, (deadline - time.monotonic()) / 4))]
    # Their part is over: what follows (their last events, the final counters) is for the sinks.
    d.runners_in_order = [r for r in d.runners_in_order if r not in stages]
    d.take_inbox()
    code = d.control_server.exit_code
    if code is not None:
        # The script's exit code, as its launcher saw it (`telemetry run`'s drain request): the
        # W&B sink ends the run with it unless the script finished the run itself.
        d.emit(EventRecord(time.time(), None, SCRIPT_EXIT_EVENT, {"exit_code": code}))
    d.emit(d.daemon_record())
    d.hand_out()
    for runner in sinks:
        runner.request_stop()
    return unfinished + [r.name for r in sinks if not r.close(max(0.0, deadline - time.monotonic()))]


def _close(d, unfinished: list[str]) -> None:
    """The control socket, the security stage, the endpoints, the wake-up pipe, the directories'
    locks (free for a successor) and, with no sink thread left inside a socket call, the context."""
    if threading.current_thread() is threading.main_thread():
        signal.set_wakeup_fd(-1)
    d.control_server.close()
    d.security.close()
    endpoints.release_ipc(d.endpoints.values())
    d.close_wakeups()
    if d.lock_fd is not None:
        os.close(d.lock_fd)
        d.lock_fd = None
    if d.run_lock_fd is not None:      # the log directory: everything is written
        os.close(d.run_lock_fd)
        d.run_lock_fd = None
    if not unfinished:
        # With a sink thread still inside a socket call, destroying the context could hang
        # or crash; the process is about to exit anyway.
        d.ctx.destroy(linger=0)


def drain_intake(d, until: float, deadline: float, last_call: float | None = None) -> None:
    """Take records until every client that was sending when the drain began has said bye
    and the socket has been quiet INTAKE_QUIET_S, or it has been quiet SOURCE_SILENT_S
    whoever is still open (or INTAKE_QUIET_S after BYE_WAIT_S), or `deadline`. Up to `until`
    they are processed, and only while a turn as long as the longest so far and the open steps'
    flush (at the cost of a step measured as it goes) still end before `deadline`; then the open
    steps go out and the rest is only counted (their headers, records_unread_at_drain): the
    frames read ahead that are not metrics and each source's first in hand first (take_rare:
    the byes; take_firsts), then the socket's and the others.

    A client's bye closes its accounting: what it sent and this daemon never counted is then
    lost in transit, exactly. So the count is exact however slow the box is: the byes in hand
    are found by two bytes a frame, and what a count cut short by `deadline` leaves
    (read ahead or still in libzmq) is accounted by them, never left uncounted. The clients
    still open at the end are counted in sources_open_at_drain and named in the log with the
    last seq seen: what they sent after it, nobody counts.

    A bye can be late, though: libzmq's I/O thread, starved on a loaded box, may not have read
    it off the connection yet. So while a source that moved lately (hello or not) has no bye,
    a quiet socket ends the intake only after SOURCE_SILENT_S, and past `deadline` the socket
    is read on (and counted) until `last_call` for it. A bye also lies behind its client's
    backlog (one connection is one ordered stream), and a client met first in the drain (it
    connected last, on a loaded box: nothing of it taken before) is read on for just the same;
    one whose bye is still out of reach at `last_call` stays open, named with its last seq."""
    losses, receiver, intake = d.losses, d.receiver, d.intake
    waiting = receiver.open_live()
    recent = receiver.open_live(hello_only=False)     # byes a drain can use, if they come
    num_known = len(receiver.sources)

    def open_now() -> tuple[set, set]:
        """`waiting` and `recent` as they stand: those still without a bye, plus the sources
        first met during the drain (a rank that connected late, whose whole stream and bye were
        still in libzmq or the read-ahead queue when the drain began: its bye lies behind its
        backlog on its connection, so it is read on for like the others)."""
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
    agg = d.aggregator
    counting = False
    processed = 0
    while True:
        now = time.monotonic()
        if not counting:
            flush_s = FLUSH_COST_FACTOR * (step_s or DEFAULT_STEP_COST_S) * len(agg.pending)
            counting = now >= until or now + 2 * turn_s + flush_s >= deadline
            if counting:
                # The open steps go out now, inside the intake's time; then the byes read ahead.
                num_open = len(agg.pending)
                d.take_inbox()
                d.emit_steps(agg.flush())
                d.hand_out()
                flushed_at = time.monotonic()
                # Each source's first frame in hand, so that its seq window starts there whatever
                # is left uncounted at the deadline (it lies inside the window).
                rare = intake.take_rare()
                firsts = intake.take_firsts()
                receiver.unread(rare + firsts)
                losses.num_unread_at_drain += len(rare) + len(firsts)
                log.info("drain: processing stopped after %.2f s; %d open steps out in %.2f s (%.2f s "
                         "foreseen), %d frames other than metrics and %d sources' first found in %.2f s",
                         now - started, num_open, flushed_at - now, flush_s, len(rare), len(firsts),
                         time.monotonic() - flushed_at)
        if counting:
            n = count_unread(d, COUNT_BATCH)
            losses.num_unread_at_drain += n
        else:
            steps_before = agg.num_steps_out
            n = d.ingest(d.batch_frames)
            if n:
                d.hand_out()
                processed += n
            took = time.monotonic() - now
            turn_s = max(turn_s, took)
            steps = agg.num_steps_out - steps_before
            if steps >= 16 and (step_s is None or took / steps < step_s):
                step_s = took / steps
        now = time.monotonic()
        if n:
            quiet_since = now
        else:
            quiet = now - quiet_since
            if quiet >= INTAKE_QUIET_S:
                waiting, recent = open_now()
                if not recent or quiet >= SOURCE_SILENT_S or now - started >= BYE_WAIT_S:
                    break
            d.pull.poll(int(INTAKE_QUIET_S * 1000 / 2) + 1)
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
    still = waiting
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


def count_unread(d, max_frames: int) -> int:
    """Read up to `max_frames` queued frames without processing them (their header only), so
    that the final counters say how much was lost instead of nothing: the socket's first (a
    bye libzmq still holds comes out within a frame per connection: its accounting closes
    even if the count is cut short), then those read ahead into the intake queue."""
    frames = []
    recv, again = d.pull.recv, zmq.Again
    try:
        for _ in range(max_frames):
            frames.append(recv(zmq.NOBLOCK))
    except again:
        pass
    if len(frames) < max_frames:
        frames += d.intake.take(max_frames - len(frames))
    d.receiver.unread(frames)      # their srcs' seq windows: arrived, not lost twice
    return len(frames)


def write_drain_json(log_dir: Path, final: dict) -> bool:
    """drain.json, on a full disk in the room the JSONL sink's reserve held; else the final
    counters go to stderr, so they are somewhere. True if the file was written."""
    from telemetry.daemon.sinks.jsonl import release_reserve

    path = log_dir / "drain.json"
    written = _write_final(path, final) or (release_reserve(log_dir) and _write_final(path, final))
    release_reserve(log_dir)      # its job is done either way
    if not written:
        print("telemetry daemon: final counters (drain.json could not be written): "
              + _json.encode(final).decode(), file=sys.stderr, flush=True)
    return bool(written)


def _write_final(path: Path, final: dict) -> bool:
    """The final counters beside metrics.jsonl, whatever stopped the daemon (SIGTERM too);
    `telemetry drain` replies with the same object."""
    try:
        files.write_file(path, _json.encode(final) + b"\n")
        return True
    except OSError as exc:
        if path.name not in _write_failed:    # logged once a file
            _write_failed.add(path.name)
            log.error("cannot write %s: %r", path, exc)
        return False


_write_failed: set[str] = set()
