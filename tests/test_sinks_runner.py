"""SinkRunner: each sink on its own thread behind a bounded queue; drops counted; never blocks."""
import threading
import time

from daemon_sinks import HangSink, RaisingSink
from protocol.output import MetricsRecord
from telemetry.daemon.downsample import Downsampler
from telemetry.daemon.sinks.base import Out, Sink, SinkRunner


def batch(n, start=0):
    return [Out("metrics", MetricsRecord(0.0, i, {"x": 1.0}), b"{}")
            for i in range(start, start + n)]


class NoStart(Sink):
    name = "nostart"

    def start(self):
        raise RuntimeError("cannot connect")

    def consume(self, b):
        raise AssertionError("never called")


def test_full_queue_drops_and_counts_without_blocking():
    sink = HangSink()
    r = SinkRunner(sink, max_queued=10)
    r.start()
    r.put(batch(1))
    assert sink.entered.wait(5)            # the thread is stuck inside consume with 1 record
    for i in range(5):
        r.put(batch(4, start=1 + 4 * i))   # never blocks: 10 fit, 10 are dropped
    assert r.queued() == 10 and r.num_dropped == 10
    sink.release.set()
    assert r.close(5)
    assert sink.steps == list(range(11))   # first, then the queued ones in order
    assert r.stats()["written"] == 11 and sink.num_closed == 1
    assert r.close(1)                       # twice is harmless
    r.put(batch(2))                         # after its end: dropped, and counted as handed to it
    st = r.stats()
    assert (st["in"], st["written"], st["dropped"]) == (23, 11, 12), st   # in = written + dropped
    assert st["dropped_by_reason"] == {"queue_full": 10, "sink_ended": 2}, st


def test_what_a_sink_was_handed_adds_up_whatever_dropped_it():
    """A sink's `in` is what it was handed: written + dropped + queued, whether a record was
    dropped for the queue's record bound, its byte bound or after the sink's end."""
    sink = HangSink()
    r = SinkRunner(sink, max_queued=6, max_bytes=3 * 6)         # a record: its 2-byte line x 3
    r.start()
    r.put(batch(1))
    assert sink.entered.wait(5)
    r.put(batch(4))                         # 4 fit the records, but their bytes (3 each) only 3
    r.put(batch(4, start=5))                # nothing fits the bytes any more
    st = r.stats()
    assert (st["in"], st["queued"], st["dropped"]) == (9, 3, 5), st
    assert st["in_hand"] == 1 and st["in"] == st["written"] + st["dropped"] + st["queued"] + st["in_hand"], st
    sink.release.set()
    assert r.close(5)
    st = r.stats()
    assert (st["in"], st["written"], st["dropped"]) == (9, 4, 5), st
    # The second batch of 4: the records had room for 3 of it, the bytes for none.
    assert st["dropped_by_reason"] == {"memory_budget": 4, "queue_full": 1} and st["dropped_for_bytes"] == 4, st


def test_a_batch_over_both_bounds_is_counted_once_under_each_reason():
    """Of a batch larger than the queue's room, what the bytes refused and what the record bound
    refused are two reasons that add up to the batch's drop, never counted twice."""
    sink = HangSink()
    r = SinkRunner(sink, max_queued=6, max_bytes=6 * 4)         # room: 6 records, 4 records' bytes
    r.start()
    r.put(batch(1))
    assert sink.entered.wait(5)
    r.put(batch(10, start=1))                # 4 fit; 2 more fit the records but not the bytes; 4 neither
    st = r.stats()
    assert (st["queued"], st["dropped"]) == (4, 6), st
    assert st["dropped_by_reason"] == {"memory_budget": 2, "queue_full": 4}, st
    sink.release.set()
    assert r.close(5)


def test_a_hung_sink_does_not_hold_close_past_its_timeout():
    sink = HangSink()
    r = SinkRunner(sink)
    r.start()
    r.put(batch(3))
    assert sink.entered.wait(5)
    assert r.close(0.2) is False            # abandoned, reported as unfinished
    sink.release.set()
    assert r.close(5) is True


def test_failing_sink_is_counted_not_fatal():
    r = SinkRunner(RaisingSink(message="disk full"))
    r.start()
    r.put(batch(5))
    r.put(batch(2))
    assert r.close(5)
    st = r.stats()
    # What was queued when the thread took its queue goes to the sink as one batch: 1 or 2 calls.
    assert st["dropped"] == 7 and st["errors"] in (1, 2) and "disk full" in st["last_error"]
    assert st["dropped_by_reason"] == {"sink_error": 7}, st


def test_sink_that_cannot_start_drops_everything_counted():
    r = SinkRunner(NoStart())
    r.start()
    deadline = time.monotonic() + 30           # the sink's thread tries to start it: a hang detector
    while "cannot connect" not in r.last_error:
        assert time.monotonic() < deadline, "the sink's start was not tried"
        time.sleep(0.01)
    r.put(batch(3))
    assert r.close(5)
    assert r.num_dropped == 3 and "cannot connect" in r.last_error
    assert r.stats()["dropped_by_reason"] == {"sink_failed_to_start": 3}


def test_downsampled_runner_flushes_the_last_window_at_close():
    sink = HangSink()
    sink.release.set()
    r = SinkRunner(sink, downsampler=Downsampler(every_n_steps=4))
    r.start()
    r.put(batch(10))
    assert r.close(5)
    assert sink.steps == [3, 7, 9]


def test_inline_runner_consumes_on_the_callers_thread():
    from telemetry.daemon.sinks.base import InlineRunner

    seen = []

    class Rec(Sink):
        name = "rec"
        inline = True

        def consume(self, b):
            seen.append((threading.current_thread().name, len(b)))

    r = InlineRunner(Rec(), downsampler=Downsampler(every_n_steps=3))
    r.start()
    r.put(batch(7))
    assert seen == [(threading.current_thread().name, 2)]     # steps 2 and 5; 6 waits for its window
    assert r.close(0) and r.close(0)
    assert seen[-1][1] == 1 and r.stats()["in"] == 7
    r.put(batch(1))                                         # after close: dropped, counted
    assert r.num_dropped == 1


class Busy(Sink):
    """Spends `cost_s` of CPU per batch: diagnosis rules under a backlog."""
    name = "busy"

    def __init__(self, cost_s):
        self.cost_s = cost_s
        self.batches = []

    def consume(self, b):
        end = time.perf_counter() + self.cost_s
        while time.perf_counter() < end:
            pass
        self.batches.append(len(b))


def test_a_sink_held_to_a_share_drops_what_it_cannot_get_to_and_still_closes_promptly():
    import pytest

    with pytest.raises(ValueError):
        SinkRunner(Busy(0), max_share=0)
    sink = Busy(0.1)
    r = SinkRunner(sink, max_queued=5, max_share=0.001)    # after a 0.1 s batch it rests ~100 s
    r.start()
    r.put(batch(5))
    deadline = time.monotonic() + 60
    while not sink.batches and time.monotonic() < deadline:
        time.sleep(0.01)
    for i in range(4):                                        # arrives while it rests: 5 fit, 15 dropped
        r.put(batch(5, start=5 * (i + 1)))
    assert r.num_dropped == 15
    # The rest is cut short by the stop: close() finishes within a budget (60 s, generous for a
    # loaded machine) that the ~100 s rest would overrun, not by its clock.
    assert r.close(60)
    assert sum(sink.batches) == 10 and r.num_written == 10


class Collect(Sink):
    name = "collect"

    def __init__(self):
        self.steps = []

    def consume(self, b):
        self.steps += [o.record["step"] for o in b]


def test_a_batch_put_as_a_wait_comes_back_empty_is_still_written():
    # The daemon's drain puts its final counters, then asks the sink to stop. The sink's thread may
    # just have come back from a wait that found nothing. Here the test acts in exactly that
    # window (from the sink's thread, as the daemon's thread could): the batch must be written,
    # not left in the queue by a thread that sees "stop" and "nothing came" and ends.
    sink = Collect()
    r = SinkRunner(sink, flush_interval_s=0.01)
    take, acted = r._take, threading.Event()

    def take_then_act(timeout_s):
        got = take(timeout_s)
        if got is None and not acted.is_set():
            acted.set()
            r.put(batch(1, start=7))
            r.request_stop()
        return got

    r._take = take_then_act
    r.start()
    assert acted.wait(5)
    assert r.close(5)
    assert sink.steps == [7] and r.queued() == 0 and r.num_dropped == 0


def test_a_batch_put_after_the_thread_ended_is_counted_as_dropped():
    sink = Collect()
    r = SinkRunner(sink)
    r.start()
    r.put(batch(2))
    assert r.close(5)
    r.put(batch(3, start=2))               # nothing will ever take it: dropped, and said so
    assert sink.steps == [0, 1] and r.num_dropped == 3 and r.queued() == 0


class DroppingSink(HangSink):
    """Counts one record of each batch as its own drop, and says so in its stats (as the forward
    sink counts what its send queue refused)."""

    def consume(self, b):
        super().consume(b)
        self.num_dropped += 1

    def stats(self):
        return {"dropped": self.num_dropped, "detail": 7}


def test_a_sinks_own_stats_never_replace_the_runners_counters():
    """`dropped` in a sink's row is everything that sink lost: its queue's drops and its own (as
    the daemon record's telemetry/sink/<name>/dropped). A sink whose stats also say `dropped`
    (its own part) used to replace the runner's count there, so the queue's drops vanished from
    `telemetry status`; the sink's own detail is kept."""
    sink = DroppingSink()
    r = SinkRunner(sink, max_queued=4)
    r.start()
    r.put(batch(1))
    assert sink.entered.wait(5)            # stuck in consume: the queue fills, then drops
    r.put(batch(8, start=1))               # 4 queued, 4 dropped by the queue
    sink.release.set()
    assert r.close(5)
    st = r.stats()
    assert st["dropped"] == r.num_dropped == 4 + sink.num_dropped and sink.num_dropped >= 2, st
    assert st["detail"] == 7
    assert st["dropped_by_reason"] == {"queue_full": 4, "sink": sink.num_dropped}, st


class NamingSink(DroppingSink):
    """Names its own drops by reason in its stats, as the W&B sink does."""

    def stats(self):
        return {"dropped_by_reason": {"step_backwards": self.num_dropped}}


def test_a_sinks_own_reasons_are_merged_with_the_runners():
    """Every record in a sink's `dropped` has a reason: the queue's and the drain's drops by the
    runner's names, the sink's own by the names it gives them (the W&B sink's row said dropped
    12,298 with 257 of them named: the rest, given up at the drain, had none)."""
    sink = NamingSink()
    r = SinkRunner(sink, max_queued=4)
    r.start()
    r.put(batch(1))
    assert sink.entered.wait(5)
    r.put(batch(6, start=1))                # 4 queued, 2 dropped by the queue
    assert r.close(0.05) is False           # the drain's deadline: stuck in its batch
    r.give_up()
    assert r.abandon(0.05) is False         # 4 queued behind it and the batch in its hands
    st = r.stats()
    assert st["dropped_by_reason"] == {"queue_full": 2, "drain_deadline": 5}, st
    sink.release.set()                      # back from its batch: counted by what became of it
    r._thread.join(30)                      # a hang detector
    assert not r._thread.is_alive()
    st = r.stats()
    assert st["dropped_by_reason"] == {"queue_full": 2, "drain_deadline": 4, "step_backwards": 1}, st
    assert sum(st["dropped_by_reason"].values()) == st["dropped"] == 7, st


class SlowLast(Sink):
    """Slow on its one batch; counts its flushes and closes."""
    name = "slowlast"

    def __init__(self, sleep_s):
        self.sleep_s, self.flushed, self.closed = sleep_s, 0, 0

    def consume(self, b):
        time.sleep(self.sleep_s)

    def flush(self):
        self.flushed += 1

    def close(self):
        self.closed += 1


def test_a_sink_back_from_its_last_batch_within_the_grace_drained():
    """Given up on at the drain's deadline less its grace, a sink with nothing queued behind the
    batch in its hands, back from it within the grace, flushes and closes as at any end and has
    drained (not "abandoned"); one with records queued behind it has not (they are counted)."""
    sink = SlowLast(0.5)
    r = SinkRunner(sink)
    r.start()
    r.put(batch(3))
    assert r.close(0.05) is False               # still in its batch at the deadline less the grace
    r.give_up()
    assert r.abandon(30) is True
    st = r.stats()
    assert (st["in"], st["written"], st["dropped"], sink.flushed, sink.closed) == (3, 3, 0, 1, 1), st

    behind = SlowLast(0.5)
    r = SinkRunner(behind)
    r.start()
    r.put(batch(3))
    time.sleep(0.1)                             # the first batch is in its hands
    r.put(batch(2, start=3))
    assert r.close(0.05) is False
    r.give_up()
    assert r.abandon(30) is False
    st = r.stats()
    assert (st["in"], st["written"], st["dropped"], behind.closed) == (5, 3, 2, 1), st
    assert st["dropped_by_reason"] == {"drain_deadline": 2}, st
