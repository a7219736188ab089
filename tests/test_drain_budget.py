"""The drain's intake on a simulated clock: a box so loaded that reading a frame's header costs
tens of microseconds, with a backlog read ahead far larger than the deadline lets it count.
The intake still ends by its deadline (give or take one bounded turn), and the accounting is
exact: every record each client sent is taken in or counted lost. Deterministic: the clock
moves only by what each step is made to cost."""
from __future__ import annotations

import collections
from types import SimpleNamespace

import zmq

from protocol import Bye, codec
from telemetry.daemon import loops
from telemetry.daemon.intake import Intake
from telemetry.daemon.receiver import Receiver
from telemetry.daemon.self_report import Losses
from telemetry.daemon.stages import receive
from telemetry.daemon.stages.receive import ReceiveStage

COUNT_S = 20e-6          # a frame's header read and accounted, on the loaded box
PROCESS_S = 200e-6       # a frame decoded, aggregated and handed on
VALUES = {"train/loss": 2.5, "perf/step_time": 0.05}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t

    perf_counter = monotonic


class Socket:
    """The ingest socket: frames libzmq still holds."""

    def __init__(self, clock: Clock) -> None:
        self.frames: collections.deque = collections.deque()
        self.clock = clock

    def recv(self, flags: int = 0) -> bytes:
        try:
            return self.frames.popleft()
        except IndexError:
            raise zmq.Again from None

    def poll(self, timeout_ms: int) -> int:
        if not self.frames:
            self.clock.t += timeout_ms / 1000
        return int(bool(self.frames))


def _daemon(clock: Clock, monkeypatch) -> SimpleNamespace:
    receiver = Receiver(loops)
    count_one = receiver.unread

    def unread(frames: list) -> None:            # reading headers costs what it costs on the box
        clock.t += COUNT_S * len(frames)
        count_one(frames)

    monkeypatch.setattr(receiver, "unread", unread)
    pull = Socket(clock)
    intake = Intake(None, 1 << 40, loops.read_frames_upto, receiver.unread_headers,
                    recv=lambda: pull.recv(zmq.NOBLOCK))
    losses = Losses()
    stage = ReceiveStage(pull, receiver, intake, losses)
    d = SimpleNamespace(receiver=receiver, intake=intake, pull=pull, losses=losses, stage=stage)

    def process() -> int:
        intake.fill()
        frames, num_bytes = intake.take_batch(1024)
        recs, _ = receiver.accept(frames, num_bytes)
        for rec in recs:
            if type(rec) is Bye:
                receiver.note_bye(rec.src)
        clock.t += PROCESS_S * len(frames)
        return len(frames)

    stage.process = process          # a turn of the pipeline: no stages after the receiver here
    stage.downstream = SimpleNamespace(num_open_steps=lambda: 0, num_steps_out=lambda: 0,
                                       flush_open=lambda: None, step_cost_s=lambda: None)
    return d


def test_a_backlog_too_big_to_count_in_time_is_accounted_exactly_by_the_deadline(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(receive, "time", clock)
    d = _daemon(clock, monkeypatch)
    num_clients, n = 4, 70_000
    sent = {}
    byes_in_libzmq = []
    for c in range(num_clients):
        src = 7000 + c
        frames = [codec.encode_metrics(src, c, seq, 0, 0, seq, VALUES) for seq in range(n)]
        # Each client's stream as a busy daemon met it: the first few processed (not client 0's),
        # then read ahead, then shed (the queue full: accounted at once), then read ahead again,
        # the rest still in libzmq. Its bye, on its own connection, read ahead for clients 0
        # and 1, still in libzmq (where fair queueing hands it over early) for 2 and 3.
        first = 0 if c == 0 else 10
        d.receiver.take(iter(frames[:first]).__next__, StopIteration, first)
        d.intake._q.extend(frames[first:30_000])
        d.receiver.unread(frames[30_000:31_000])
        d.intake.num_shed += 1000
        d.intake._q.extend(frames[31_000:33_000])
        d.pull.frames.extend(frames[33_000:])
        bye = codec.encode_bye(src, c, n, 0, 0, {})
        if c < 2:
            d.intake._q.append(bye)
        else:
            byes_in_libzmq.append(bye)
        sent[src] = n + 1
    d.pull.frames.extendleft(byes_in_libzmq)
    d.intake.num_bytes = sum(map(len, d.intake._q))
    timeout_s = 3.0
    start = clock.t
    # As the stage's drain calls it, its share for processing spent: counted up to 0.8 of the
    # time. What is read ahead alone (128k frames at COUNT_S: 2.6 s) takes longer than that.
    deadline = start + timeout_s * ReceiveStage.drain_share * receive.COUNT_SHARE
    d.stage.drain_intake(start, deadline)
    assert clock.t <= deadline + COUNT_S * receive.COUNT_BATCH + 0.05, clock.t - start   # one turn late at most
    t = d.losses.totals(d.receiver, d.intake)
    assert t["records_unread_at_drain"] > 0 and t["sources_open_at_drain"] == 0, t
    assert t["records_in"] + t["records_lost"] == sum(sent.values()), t
    for src, s in d.receiver.sources.items():       # per client: taken in, counted, or lost in transit
        assert s.bye and s.min_seq == 0 and s.received + s.refused + s.lost() == sent[src], (src, s)


def _late_rank(d, clock, n: int, late_frames: int) -> dict:
    """Clients 0-2 as a busy daemon met them (a few processed, the rest and their byes read
    ahead); client 3 connected late: nothing of it taken yet, its `late_frames` records and
    its bye all still in libzmq, the bye behind them (one connection is one ordered stream)."""
    sent = {}
    for c in range(4):
        src = 7000 + c
        num = late_frames if c == 3 else n
        frames = [codec.encode_metrics(src, c, seq, 0, 0, seq, VALUES) for seq in range(num)]
        frames.append(codec.encode_bye(src, c, num, 0, 0, {}))
        if c == 3:
            d.pull.frames.extend(frames)
        else:
            d.receiver.take(iter(frames[:10]).__next__, StopIteration, 10)
            d.intake._q.extend(frames[10:])
        sent[src] = num + 1
    d.intake.num_bytes = sum(map(len, d.intake._q))
    return sent


def test_a_rank_first_met_in_the_drain_is_read_on_for_its_bye(monkeypatch):
    """A rank whose whole stream was still in libzmq when the drain began (it connected last, on
    a loaded box) is not among the sources moving at the drain's start: its bye, behind its
    backlog, must still be read on for past the count's deadline, like theirs (it was not: the
    drain stopped once the others' byes were in, and its tail went uncounted, in no counter)."""
    clock = Clock()
    monkeypatch.setattr(receive, "time", clock)
    d = _daemon(clock, monkeypatch)
    sent = _late_rank(d, clock, 2_000, 60_000)
    start = clock.t
    # Its 60k frames take 1.2 s to count: past the count's deadline, well before the last call.
    d.stage.drain_intake(start, start + 0.5, start + 3.0)
    assert clock.t <= start + 3.0 + COUNT_S * receive.COUNT_BATCH + 0.05, clock.t - start
    t = d.losses.totals(d.receiver, d.intake)
    assert t["records_in"] + t["records_lost"] == sum(sent.values()), t
    for src, s in d.receiver.sources.items():
        assert s.bye and s.min_seq == 0 and s.received + s.refused + s.lost() == sent[src], (src, s)


def test_a_bye_the_drain_cannot_reach_leaves_its_rank_open_and_named(monkeypatch, caplog):
    """The same rank, with a backlog larger than the drain can read by its last call: its bye is
    out of reach, so what it sent after its last record read is known to no one. That is said,
    not hidden: the rank is open in per_rank and named in the log with its last seq, and its
    window up to that seq is accounted exactly (everything else adds up)."""
    clock = Clock()
    monkeypatch.setattr(receive, "time", clock)
    d = _daemon(clock, monkeypatch)
    sent = _late_rank(d, clock, 2_000, 120_000)
    start = clock.t
    with caplog.at_level("INFO", logger="telemetry.daemon"):
        d.stage.drain_intake(start, start + 0.5, start + 1.5)
    assert clock.t <= start + 1.5 + COUNT_S * receive.COUNT_BATCH + 0.05, clock.t - start
    late = d.receiver.sources[7003]
    assert not late.bye and late.min_seq == 0 and 0 < late.max_seq < 120_000, late
    assert d.receiver.per_rank()[3]["open"] == 1
    assert f"rank 3 (src 7003, last seq {late.max_seq})" in caplog.text, caplog.text
    assert late.received + late.refused + late.lost() == late.max_seq + 1, late
    t = d.losses.totals(d.receiver, d.intake)
    tail = sent[7003] - (late.max_seq + 1)
    assert t["records_in"] + t["records_lost"] + tail == sum(sent.values()), t
    for src, s in d.receiver.sources.items():
        if src != 7003:
            assert s.bye and s.received + s.refused + s.lost() == sent[src], (src, s)


def test_the_open_steps_flush_is_sized_by_what_a_step_costs_now(monkeypatch):
    """A loaded box where sending a step out costs 100 µs (the steps stage measured it) and the
    drain begins with 19,000 steps open: processing stops in time for their flush, so the
    intake still ends by its deadline. Sized at a fixed guess of a step's cost (20 µs), it went
    on processing, and the flush ended the intake past its deadline."""
    clock = Clock()
    monkeypatch.setattr(receive, "time", clock)
    d = _daemon(clock, monkeypatch)
    step_s, open_steps = 100e-6, [19_000]

    def flush_open() -> None:
        clock.t += step_s * open_steps[0]
        open_steps[0] = 0

    down = d.stage.downstream
    down.num_open_steps = lambda: open_steps[0]
    down.flush_open = flush_open
    down.step_cost_s = lambda: step_s
    frames = [codec.encode_metrics(7000, 0, seq, 0, 0, seq, VALUES) for seq in range(40_000)]
    frames.append(codec.encode_bye(7000, 0, 40_000, 0, 0, {}))
    d.receiver.take(iter(frames[:10]).__next__, StopIteration, 10)
    d.intake._q.extend(frames[10:])
    d.intake.num_bytes = sum(map(len, d.intake._q))
    start = clock.t
    d.stage.drain_intake(start + 2.0, start + 2.4, start + 2.7)
    assert open_steps[0] == 0
    assert clock.t <= start + 2.7 + COUNT_S * receive.COUNT_BATCH + 0.05, clock.t - start
    t = d.losses.totals(d.receiver, d.intake)
    assert t["records_in"] + t["records_lost"] == len(frames), t
