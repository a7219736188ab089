"""The sink interface and the thread that runs each sink behind its own bounded queue.

A sink consumes output records: `Out` tuples holding the record as a dict (the JSONL schema)
and its JSON bytes, encoded once by the daemon. A sink never runs on the daemon's thread: a slow
or failing W&B costs its own queue, never ingest or the JSONL sink. A queue is bounded by records
and by bytes (its share of the daemon's memory budget, telemetry/daemon/memory.py); when full, the
newest batch's records are dropped and counted.
"""
from __future__ import annotations

import logging
import operator
import threading
import time
from collections import deque
from typing import NamedTuple

from protocol.output import OutputRecord

log = logging.getLogger("telemetry.daemon.sinks")



class StartupError(Exception):
    """The daemon cannot run as asked (its source of truth cannot be written, its log dir is not
    a writable directory): said before "ready", and `telemetry daemon` exits 2."""

class Out(NamedTuple):
    kind: str        # the record's kind: "metrics", "event", "hello", "bye", "daemon", "system", "gpu"
    record: OutputRecord   # exactly what the JSONL line holds (protocol/output.py)
    line: bytes      # the JSON encoding of `record`, without a newline


class Sink:
    """One destination. Called from its runner's thread only, so it needs no locks."""

    name = "sink"
    # Records the sink was handed but could not deliver, counted by the sink itself (a W&B step
    # it refused, lines written into a file that was then deleted): its runner moves them from
    # `written` to `dropped` after each call, so the daemon's sink_dropped holds them too.
    num_dropped = 0
    # How long its close may take (W&B's finish: the run's exit record). Under a backlog at the
    # drain, the sink takes no more batches this long before the sinks' deadline, so that it
    # closes within the drain (what it never took is counted dropped) rather than being
    # abandoned mid-backlog, unclosed.
    close_reserve_s = 0.0
    # Set (from the drain's thread) when the drain gives up on this sink's backlog: a sink with a
    # close_reserve_s stops inside the batch in its hands, counting the rest in num_dropped.
    giving_up = False
    # A call of the sink's service the script's own code would have waited for, under way now
    # ("starting": W&B's import and `wandb.init`; "finishing": `run.finish`, the run's exit
    # record; "" otherwise), read from the drain's thread: time a sink spends in one during the
    # drain moves its end on, up to phase_allowance_s in all, so that a loaded host's slow W&B
    # does not cost the run its rows or its exit record.
    phase = ""
    phase_allowance_s = 0.0
    # The script's exit as the drain's first record (`script_exit`) says it, also set here from the
    # drain's thread: a sink whose backlog is given up on never reaches that record, and W&B's run
    # must still end with the script's exit code.
    script_exit: dict | None = None

    def start(self) -> None:
        """Open files, sockets, connections. Runs on the sink's thread."""

    def consume(self, batch: list[Out]) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        """Push buffered data to its destination; called on the flush interval and at close."""

    def close(self) -> None:
        """Release everything. Called once, after the last flush."""

    def stats(self) -> dict:
        return {}


# The most records a sink is handed at once: under a backlog, the unit in which a sink abandoned
# at the drain deadline stops (what it never got to is then counted, exactly).
MAX_BATCH = 8192

# What SinkRunner._take returns once the sink is to end.
STOP = object()
# A queue's byte bound when none is given (the daemon gives each its memory share).
DEFAULT_MAX_BYTES = 64 << 20
# What a queued output record is estimated to hold (its dict, values and JSON line) per byte of its
# JSON line (memory.OUT_BYTES_PER_LINE_BYTE, measured with tracemalloc).
OUT_BYTES_PER_LINE_BYTE = 3


def batch_bytes(batch: list[Out]) -> int:
    """The estimated memory a batch of output records holds (from their JSON lines' lengths)."""
    return sum(map(len, map(_line, batch))) * OUT_BYTES_PER_LINE_BYTE


_line = operator.itemgetter(2)     # Out.line, without a Python call per record


class SinkRunner:
    """Runs one sink on its own thread, fed through a bounded queue of records."""

    def __init__(self, sink: Sink, max_queued: int = 100_000, flush_interval_s: float = 1.0,
                 downsampler=None, max_share: float = 1.0, max_bytes: int = DEFAULT_MAX_BYTES,
                 analysis: bool = False) -> None:
        """max_queued, max_bytes: the queue's bounds, in records and in estimated bytes.
        analysis: the stage analyses the stream rather than writes it (diagnosis, forensics,
        goodput): what it skips under a backlog is analysis skipped, not output lost, and at
        the drain it is closed before the sinks, so that its last events still reach them.
        max_share: the fraction of the time this sink's thread may spend consuming; after a
        batch that took t, it waits t * (1 - max_share) / max_share. Python threads share one
        interpreter lock, so a sink that is always busy (a backlog) takes it from the daemon's
        thread half the time; one held to a share drops (counted) what it cannot get to."""
        if not 0 < max_share <= 1:
            raise ValueError(f"max_share must be in (0, 1], got {max_share}")
        self.sink = sink
        self.name = sink.name
        self.analysis = analysis
        self.max_queued = max_queued
        self.max_bytes = max_bytes
        self.flush_interval_s = flush_interval_s
        self.downsampler = downsampler
        self.max_share = max_share
        self._stop_event = threading.Event()   # set by request_stop; also wakes a share's wait
        self._abandoned = False                # set by give_up: stop after the batch in hand
        self._late = False                     # set by abandon: its grace is over, the drain gone on
        self._dropped_at_give_up = 0           # num_dropped when give_up came (what abandon lost)
        self._short: int | None = None         # set by abandon: ended within its grace, less this many
        self._in_hand = 0                      # records of the batch the sink is consuming now
        self._in_hand_dropped = 0              # of them, counted dropped by abandon while in hand
        self._ended = False                    # the thread has taken its last batch (under _cond)
        self._batches: deque[list[Out]] = deque()
        self._sizes: deque[int] = deque()      # each queued batch's estimated bytes
        self._num_queued = 0
        self._num_bytes = 0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"sink-{self.name}", daemon=True)
        self._started = threading.Event()      # the sink's start() has returned or raised
        self.num_in = 0                        # handed to put: written + dropped + queued (+ in hand),
                                               # less what a downsampler let go
        self.num_taken = 0                     # of them, into the queue (a checkpoint's position)
        self.num_written = 0
        self.num_dropped = 0
        self.num_dropped_for_bytes = 0         # of num_dropped: beyond max_bytes (the memory budget)
        # Of num_dropped, by why: queue_full, memory_budget, drain_deadline, sink_error,
        # sink_failed_to_start, sink_ended, and "sink" for what the sink counted itself (named by
        # its own dropped_by_reason in stats): every record dropped has a reason.
        self.dropped_by_reason: dict[str, int] = {}
        self.num_errors = 0
        self.last_error = ""
        self._sink_dropped_seen = 0            # sink.num_dropped already moved into ours

    def start(self) -> None:
        self._thread.start()

    def wait_started(self, timeout_s: float) -> bool:
        """Until the sink's start() has returned or raised (a benchmark times the steady state)."""
        return self._started.wait(timeout_s)

    def put(self, batch: list[Out], num_bytes: int | None = None) -> None:
        """Hand a batch to the sink; never blocks. Thread-safe. After the sink's thread has taken
        its last batch (stopped, abandoned) nothing would ever take it: dropped and counted.
        num_bytes: the batch's estimated size (batch_bytes; the daemon computes it once for all
        its sinks)."""
        if num_bytes is None:
            num_bytes = batch_bytes(batch)
        with self._cond:
            self.num_in += len(batch)
            if self._ended or self._abandoned:
                self._drop(len(batch), "drain_deadline" if self._abandoned else "sink_ended")
                return
            room = self.max_queued - self._num_queued
            over_bytes = 0
            if self._num_bytes + num_bytes > self.max_bytes and batch:
                # Whole records only, in proportion: the records of a batch are alike in size.
                per_record = num_bytes / len(batch)
                fit = max(0, int((self.max_bytes - self._num_bytes) / per_record)) if per_record else len(batch)
                if fit < min(room, len(batch)):
                    over_bytes = min(room, len(batch)) - fit
                    self.num_dropped_for_bytes += over_bytes
                    room = fit
            if room < len(batch):
                self._drop(over_bytes, "memory_budget")
                self._drop(len(batch) - max(room, 0) - over_bytes, "queue_full")
            if room <= 0:
                return
            if len(batch) > room:
                num_bytes = num_bytes * room // len(batch)
                batch = batch[:room]
            self._batches.append(batch)
            self._sizes.append(num_bytes)
            self._num_queued += len(batch)
            self._num_bytes += num_bytes
            self.num_taken += len(batch)
            self._cond.notify()

    def queued(self) -> int:
        return self._num_queued

    def _take(self, timeout_s: float) -> list[Out] | None | object:
        """What is queued, up to MAX_BATCH records or one queued batch, whichever is more, as one
        batch; None if nothing came within `timeout_s`; STOP once the sink is to end: stop was
        requested and nothing is queued, or it was abandoned. Decided under the queue's lock, so
        a batch put just before request_stop is never left behind by a thread that found the
        queue empty a moment earlier and then saw the stop."""
        with self._cond:
            if not self._batches and not self._stop_event.is_set():
                self._cond.wait(timeout_s)
            if self._abandoned:
                return STOP
            if not self._batches:
                if self._stop_event.is_set():
                    self._ended = True          # under the lock: a later put counts as dropped
                    return STOP
                return None
            batches, sizes = self._batches, self._sizes
            batch = batches.popleft()
            self._num_bytes -= sizes.popleft()
            if batches and len(batch) < MAX_BATCH:
                batch = list(batch)
                while batches and len(batch) + len(batches[0]) <= MAX_BATCH:
                    batch += batches.popleft()
                    self._num_bytes -= sizes.popleft()
            self._num_queued -= len(batch)
            self._in_hand = len(batch)
            return batch

    def _run(self) -> None:
        why = "sink_ended"
        try:
            self._serve()
        except BaseException as exc:  # a bug past the sink's own calls: the sink ends, counted
            why = "sink_error"
            # last_error before the count, here and below: `status` reads them from another
            # thread, and an error counted must come with what it was (seen: errors 1, no
            # last_error, while the log line between the two was written).
            self.last_error = f"thread: {exc!r}"
            self.num_errors += 1
            log.error("sink %s stopped on %r; what it had not written is counted as dropped", self.name, exc)
        finally:
            # However the thread ends, what it never took is counted, and so is whatever is put
            # later: nothing waits in a queue that no thread will read.
            with self._cond:
                self._ended = True
                self._drop(self._num_queued + self._in_hand - self._in_hand_dropped,
                           "drain_deadline" if self._abandoned else why)
                self._num_queued = self._in_hand = self._in_hand_dropped = self._num_bytes = 0
                self._batches.clear()
                self._sizes.clear()

    def _serve(self) -> None:
        try:
            self.sink.start()
        except BaseException as exc:  # a sink that cannot start must not take the daemon down
            self.last_error = f"start: {exc!r}"
            self.num_errors += 1
            log.error("sink %s failed to start: %r; its records will be dropped", self.name, exc)
            self._started.set()
            self._discard_forever()
            return
        self._started.set()
        next_flush = time.monotonic() + self.flush_interval_s
        while True:
            batch = self._take(max(0.0, next_flush - time.monotonic()))
            if batch is STOP:
                break
            if batch:
                t0 = time.perf_counter()
                if self.downsampler is not None:
                    batch = self.downsampler.feed(batch)
                self._consume(batch, in_hand=True)
                if self.max_share < 1:
                    self._stop_event.wait((time.perf_counter() - t0) * (1 - self.max_share) / self.max_share)
            now = time.monotonic()
            if now >= next_flush:
                if self.downsampler is not None:
                    self._consume(self.downsampler.poll(now))
                self._call("flush")
                next_flush = now + self.flush_interval_s
        with self._cond:
            if self._late:      # the drain has gone on without it: what it holds is counted lost
                return
        # Stopped, or given up on and back from its batch within the drain's grace (what was
        # queued behind it is counted by abandon): the end is the same.
        if self.downsampler is not None:
            self._consume(self.downsampler.flush())
        self._call("flush")
        self._call("close")

    def _consume(self, batch: list[Out], in_hand: bool = False) -> None:
        """The sink consumes `batch`, counted written or dropped. in_hand: the batch _take
        handed out, which ends here. Counted under the queue's lock, with the end of the batch in
        hand, so that abandon (the drain's thread) sees the batch either in hand or counted,
        never both: the drain's final counters add up."""
        ok = True
        if batch:
            try:
                self.sink.consume(batch)
            except Exception as exc:
                ok = False
                self.last_error = repr(exc)
                self.num_errors += 1
        with self._cond:
            if ok:
                self.num_written += len(batch)
            else:
                self._drop(len(batch), "sink_error")
            self._take_sink_drops()
            if in_hand:
                # Abandoned while the sink held it, the batch was counted dropped then; the sink
                # has come back, and the batch is counted by what became of it instead.
                self._drop(-self._in_hand_dropped, "drain_deadline")
                self._in_hand = self._in_hand_dropped = 0
        if not ok and (self.num_errors == 1 or self.num_errors % 1000 == 0):  # never log per item
            log.error("sink %s failed (%d errors so far): %s", self.name, self.num_errors, self.last_error)

    def _call(self, method: str) -> None:
        try:
            getattr(self.sink, method)()
        except Exception as exc:
            self.last_error = f"{method}: {exc!r}"
            self.num_errors += 1
            log.error("sink %s %s failed: %r", self.name, method, exc)
        with self._cond:
            self._take_sink_drops()

    def _take_sink_drops(self) -> None:
        """What the sink counted as undelivered since the last look: written no more, dropped.
        Called under the queue's lock (put and abandon count drops from other threads)."""
        n = self.sink.num_dropped - self._sink_dropped_seen
        if n:
            self._sink_dropped_seen += n
            self.num_written -= n
            self._drop(n, "sink")

    def _drop(self, n: int, reason: str) -> None:
        """Count `n` records dropped (less, when negative: a batch counted lost comes back) for
        `reason`. Under the queue's lock where other threads count too."""
        if n:
            self.num_dropped += n
            left = self.dropped_by_reason.get(reason, 0) + n
            if left:
                self.dropped_by_reason[reason] = left
            else:
                self.dropped_by_reason.pop(reason, None)

    def _discard_forever(self) -> None:
        while True:
            batch = self._take(1.0)
            if batch is STOP:
                return
            if batch:
                with self._cond:
                    self._drop(len(batch) - self._in_hand_dropped, "sink_failed_to_start")
                    self._in_hand = self._in_hand_dropped = 0

    def request_stop(self) -> None:
        """Ask the thread to finish what is queued, flush and close; returns at once."""
        with self._cond:
            self._stop_event.set()
            self._cond.notify()

    def close(self, timeout_s: float) -> bool:
        """Stop after draining what is queued; True if the thread finished within `timeout_s`.
        Safe to call twice; a thread that never started counts as finished."""
        self.request_stop()
        if not self._thread.is_alive():
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def give_up(self) -> None:
        """Past the drain deadline: the sink takes no more batches; returns at once (the drain
        tells every late sink so before it waits for any: their graces run together)."""
        with self._cond:
            if not self._abandoned:
                self._dropped_at_give_up = self.num_dropped
            self._abandoned = True
            self._cond.notify()
        try:
            self.sink.giving_up = True
        except AttributeError:      # a sink of the user's that takes no attributes
            pass

    def abandon(self, grace_s: float) -> bool:
        """Past the drain deadline: the sink takes no more batches, and has `grace_s` to finish
        the batch in its hands, flush and close; whatever it has not written is counted as
        dropped. A sink still in a batch after `grace_s` (slow or hung) has that batch counted
        dropped too; should the sink come back from it, the batch is counted by what became of
        it instead (_consume). The counts read while a batch is still in a sink's hands are an
        upper bound on what it lost; exact once it returns. True if the sink ended within the
        grace and lost nothing to it (nothing was queued behind its batch): it drained."""
        self.give_up()
        self._thread.join(grace_s)
        with self._cond:
            alive = self._thread.is_alive()
            self._drop(self._num_queued, "drain_deadline")
            if alive:
                self._late = True
                if self._in_hand:
                    self._drop(self._in_hand - self._in_hand_dropped, "drain_deadline")
                    self._in_hand_dropped = self._in_hand
            self._num_queued = self._num_bytes = 0
            self._batches.clear()
            self._sizes.clear()
            self._short = None if alive else self.num_dropped - self._dropped_at_give_up
            return not alive and self.num_dropped == self._dropped_at_give_up

    def ended_short(self) -> int | None:
        """As abandon found it: how many records the sink closed without (given up on, it ended
        within the grace with those counted dropped), or None if it was still busy then (abandoned
        in its batch; it may end later, past the grace: still not "closed")."""
        return self._short

    def stats(self) -> dict:
        """The runner's counters (what every sink's row means, as in the daemon record's
        telemetry/sink/<name>/...; `dropped` holds the sink's own drops too) and the sink's own
        detail, which never replaces them. in = written + dropped + queued + in_hand (the batch
        the sink is consuming now), less what a downsampler let go."""
        s = self.sink.stats()
        with self._cond:        # one moment's counters: a batch settled between two reads would not add up
            s.update({"in": self.num_in, "written": self.num_written, "dropped": self.num_dropped,
                      "queued": self._num_queued, "in_hand": self._in_hand - self._in_hand_dropped,
                      "queued_mb": round(self._num_bytes / 2**20, 1),
                      "dropped_for_bytes": self.num_dropped_for_bytes, "errors": self.num_errors})
            s["dropped_by_reason"] = _reasons(self.dropped_by_reason, s.get("dropped_by_reason"))
            if self._in_hand_dropped:
                # Of `dropped`: the batch in the hands of a sink abandoned mid-batch, still there;
                # it may yet reach its destination (the count is then an upper bound by this much).
                s["dropped_in_hand"] = self._in_hand_dropped
        if self.last_error:
            s["last_error"] = self.last_error
        return s


def _reasons(runner: dict[str, int], sink: object) -> dict[str, int]:
    """`dropped` by why: the runner's reasons, with what the sink counted itself ("sink") named by
    the sink's own dropped_by_reason where it keeps one (the W&B sink's; a reason both use adds)."""
    out = dict(runner)
    own = out.pop("sink", 0)
    for reason, n in (sink.items() if isinstance(sink, dict) else ()):
        if isinstance(n, int) and n > 0:
            out[reason] = out.get(reason, 0) + n
            own -= n
    if own > 0:
        out["sink"] = own
    return out


class InlineRunner(SinkRunner):
    """Runs a sink that can never block (PUB: libzmq queues per subscriber on its own I/O thread
    and drops for a slow one) directly on the daemon's thread: no thread hop, so records reach
    subscribers with the lowest latency. Same counters and lifecycle as SinkRunner."""

    def __init__(self, sink: Sink, max_queued: int = 100_000, flush_interval_s: float = 1.0,
                 downsampler=None, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        # The base's counters and bounds (nothing is queued here; its thread is never started).
        super().__init__(sink, max_queued, flush_interval_s, downsampler, max_bytes=max_bytes)
        self._running = False        # the sink's start() returned
        self._closed = False

    def start(self) -> None:
        try:
            self.sink.start()
            self._running = True
        except Exception as exc:
            self.last_error = f"start: {exc!r}"
            self.num_errors += 1
            log.error("sink %s failed to start: %r; its records will be dropped", self.name, exc)

    def wait_started(self, timeout_s: float) -> bool:
        return True     # start() ran the sink's start on the caller's thread

    def put(self, batch: list[Out], num_bytes: int | None = None) -> None:
        self.num_in += len(batch)
        if not self._running or self._closed:
            self._drop(len(batch), "sink_ended" if self._closed else "sink_failed_to_start")
            return
        if self.downsampler is not None:
            batch = self.downsampler.feed(batch)
        self._consume(batch)

    def request_stop(self) -> None:
        pass

    def give_up(self) -> None:
        pass            # nothing is ever queued or in another thread's hands

    def abandon(self, grace_s: float) -> bool:
        return True     # close never leaves it unfinished

    def ended_short(self) -> int | None:
        return 0

    def close(self, timeout_s: float) -> bool:
        if self._closed:
            return True
        self._closed = True
        if self._running:
            if self.downsampler is not None:
                self._consume(self.downsampler.flush())
            self._call("flush")
            self._call("close")
        return True
