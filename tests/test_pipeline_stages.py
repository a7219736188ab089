"""The daemon's pipeline in-process (telemetry/daemon/pipeline.py, stages/): the stages drained in
order, each by its share of the time left, their counters merged; the receiver stage reading each
frame off the socket once and counting what its queue sheds itself; the fan-out's drain ending
by its deadline with a hung sink; drain.json's stop code, which the dashboard matches. On a
simulated clock where time matters: deterministic."""
from __future__ import annotations

import collections
import json
import signal
import threading
from pathlib import Path

import zmq

from protocol import codec
from telemetry.daemon import loops, memory
from telemetry.daemon.config import load
from telemetry.daemon.core import Daemon
from telemetry.daemon.intake import FRAME_OVERHEAD_BYTES, Intake
from telemetry.daemon.pipeline import Pipeline, Stage
from telemetry.daemon.receiver import Receiver
from telemetry.daemon.self_report import Losses
from telemetry.daemon.stages import fanout
from telemetry.daemon.stages.fanout import FanOut
from telemetry.daemon.stages.receive import ReceiveStage
from telemetry.shared.control import request
from testkit import faults

VALUES = {"train/loss": 2.5, "perf/step_time": 0.05}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t


class Recorder(Stage):
    def __init__(self, name: str, share: float, clock: Clock, log: list, cost_s: float = 0.0,
                 done: bool = True) -> None:
        self.name, self.drain_share, self.clock, self.log = name, share, clock, log
        self.cost_s, self.done = cost_s, done

    def drain(self, deadline: float) -> bool:
        self.log.append((self.name, self.clock.t, deadline))
        self.clock.t = min(deadline, self.clock.t + self.cost_s)
        return self.done

    def stats(self) -> dict:
        return {self.name: 1, "shared": self.name}


def test_the_pipeline_drains_in_order_each_stage_by_its_share_of_the_time_left():
    clock, log = Clock(), []
    stages = [Recorder("receiver", 0.9, clock, log, cost_s=100.0), Recorder("steps", 0.5, clock, log),
              Recorder("sinks", 1.0, clock, log, cost_s=100.0, done=False)]
    pipeline = Pipeline(stages, clock=clock.monotonic)
    start = clock.t
    assert pipeline.drain(start + 10.0) == ["sinks"]
    # The receiver may take 9 of the 10 s, however long it would go on; the steps then have half of
    # the second left, and the last stage the rest: nobody's time is taken by the one before it.
    assert log == [("receiver", start, start + 9.0), ("steps", start + 9.0, start + 9.5),
                   ("sinks", start + 9.0, start + 10.0)]
    assert clock.t == start + 10.0
    assert pipeline.stats() == {"receiver": 1, "steps": 1, "sinks": 1, "shared": "sinks"}


class CountingSocket:
    """The ingest socket: each recv() counted, frames handed over once."""

    def __init__(self, frames: list) -> None:
        self.frames = collections.deque(frames)
        self.num_recv = 0

    def recv(self, flags: int = 0) -> bytes:
        self.num_recv += 1
        try:
            return self.frames.popleft()
        except IndexError:
            raise zmq.Again from None


def test_the_receiver_stage_reads_each_frame_once_and_counts_what_it_sheds():
    num = 3000
    frames = [codec.encode_metrics(77, 0, seq, 0, 0, seq, VALUES) for seq in range(num)]
    frames.append(codec.encode_bye(77, 0, num, 0, 0, {}))
    sock = CountingSocket(frames)
    shed = memory.Shed()
    receiver = Receiver(loops)
    # A share that holds about 500 of them: the rest of each read is shed as it is read.
    share = 500 * (len(frames[0]) + FRAME_OVERHEAD_BYTES)
    intake = Intake(None, share, loops.read_frames_upto, receiver.unread_headers, recv=sock.recv, shed=shed)
    losses = Losses()
    stage = ReceiveStage(None, receiver, intake, losses)
    taken = 0
    while True:
        recs, _, n = stage.take(256)
        if not n and not sock.frames:
            break
        taken += n
    # Every frame came off the socket in exactly one recv (the empty reads raised Again), and
    # each is either decoded or shed: none read twice, none lost between two readers.
    empty_reads = sock.num_recv - len(frames)
    assert 0 < empty_reads <= sock.num_recv // 256 + 2
    assert intake.num_shed > 0 and taken + intake.num_shed == len(frames)
    assert receiver.num_in == taken
    # What the queue shed is counted where it sheds, under the one name it has everywhere.
    t = losses.totals(receiver, intake)
    assert shed.counts["records_shed_at_intake"] == intake.num_shed == t["records_shed_at_intake"]
    assert stage.stats()["intake"]["records_shed_at_intake"] == intake.num_shed
    assert t["records_in"] + t["records_lost"] == len(frames) and t["records_lost"] == intake.num_shed


class Runner:
    """A sink runner as the fan-out drives it; a hung one never finishes, on the simulated clock."""

    def __init__(self, name: str, clock: Clock, log: list, analysis: bool = False, hung: bool = False,
                 ends_in_grace: bool = False) -> None:
        self.name, self.clock, self.log, self.analysis, self.hung = name, clock, log, analysis, hung
        self.ends_in_grace = ends_in_grace      # late at the deadline less the grace, back within it
        self.num_dropped = 0

    def put(self, batch: list, num_bytes: int) -> None:
        self.log.append(("put", self.name, len(batch)))

    def request_stop(self) -> None:
        pass

    def close(self, timeout_s: float) -> bool:
        self.log.append(("close", self.name))
        if self.hung:
            self.clock.t += timeout_s
            return False
        return True

    def give_up(self) -> None:
        pass

    def abandon(self, grace_s: float) -> bool:
        self.clock.t += grace_s / 2 if self.ends_in_grace else grace_s
        self.log.append(("abandon", self.name))
        return self.ends_in_grace

    def ended_short(self) -> int | None:
        return None if self.hung else 0      # a hung sink is still in its batch

    def queued(self) -> int:
        return 0


def test_the_fan_out_closes_analysis_first_and_ends_by_its_deadline_with_a_hung_sink(monkeypatch):
    clock, log = Clock(), []
    monkeypatch.setattr(fanout, "time", clock)
    out = FanOut()
    diagnosis = out.add(Runner("diagnosis", clock, log, analysis=True))
    out.add(Runner("jsonl", clock, log))
    out.add(Runner("wandb", clock, log, hung=True))
    out._in_order = list(out.runners)
    out.last_words = lambda: log.append(("last words",))
    deadline = clock.t + 2.0
    assert not out.drain(deadline)
    assert out.unfinished == ["wandb"]
    assert log.index(("close", "diagnosis")) < log.index(("last words",)) < log.index(("close", "jsonl"))
    assert ("abandon", "wandb") in log and diagnosis not in out._in_order
    assert clock.t <= deadline            # the hung sink's grace is inside the deadline, not after it


def test_a_sink_back_from_its_last_batch_within_the_grace_is_not_unfinished(monkeypatch):
    clock, log = Clock(), []
    monkeypatch.setattr(fanout, "time", clock)
    out = FanOut()
    out.add(Runner("jsonl", clock, log, hung=True, ends_in_grace=True))
    out.add(Runner("wandb", clock, log, hung=True))
    out._in_order = list(out.runners)
    assert not out.drain(clock.t + 2.0)
    assert out.unfinished == ["wandb"] and ("abandon", "jsonl") in log


def _drained_in_process(tmp_path, **drain_request) -> dict:
    """A daemon in this process, drained by a drain request (`drain_request`: its fields); the
    reply."""
    rt = Path(faults.Endpoints().dir)
    cfg = load(None, {"log_dir": str(tmp_path / "tm"), "wandb.mode": "disabled", "ingest": f"ipc://{rt}/i",
                      "pub": f"ipc://{rt}/p", "control": f"ipc://{rt}/c", "aggregator.world_size": 1})
    d = Daemon(cfg)
    old_handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    d.start()
    try:
        t = threading.Thread(target=lambda: setattr(d, "rc", d.run()), daemon=True)
        t.start()
        final = request(d.endpoints["control"], "drain", timeout_s=120, **drain_request)   # a hang detector
        t.join(120)
        assert not t.is_alive()
    finally:
        signal.set_wakeup_fd(-1)
        for sig, h in old_handlers.items():
            signal.signal(sig, h)
    return final


def test_drain_json_says_why_as_a_code_and_in_words(tmp_path):
    final = _drained_in_process(tmp_path)
    assert final["stop_code"] == "drain_request" and final["stop_reason"] == "drain request"
    written = json.loads((tmp_path / "tm" / "drain.json").read_text())
    assert written["stop_code"] == "drain_request"
    events = [r for r in map(json.loads, (tmp_path / "tm" / "metrics.jsonl").read_text().splitlines())
              if r["kind"] == "event" and r["name"] == "script_exit"]
    assert events == []          # no exit code in the request: no script_exit


def test_the_drains_script_exit_event_says_when_the_script_exited(tmp_path):
    """`telemetry run`'s drain request carries the script's exit code and when it exited: the
    drain's script_exit event, which every runner gets, carries both (the goodput ledger ends
    the launch at exited_at, not at the event's own time)."""
    _drained_in_process(tmp_path, exit_code=3, extra={"exited_at": 1_800_000_000.5})
    recs = [json.loads(line) for line in (tmp_path / "tm" / "metrics.jsonl").read_text().splitlines()]
    events = [r for r in recs if r["kind"] == "event" and r["name"] == "script_exit"]
    assert [(e["rank"], e["data"]) for e in events] == [(None, {"exit_code": 3, "exited_at": 1_800_000_000.5})]
    assert recs.index(events[0]) < max(i for i, r in enumerate(recs) if r["kind"] == "daemon")   # before the last words


def test_the_dashboard_matches_the_stop_code_not_its_words(tmp_path):
    from telemetry.consumers.dashboard.live import _drained_at

    path = tmp_path / "drain.json"
    for final, ended in (({"stop_code": "drain_request", "stop_reason": "anything at all"}, True),
                         ({"stop_code": "watched_process_exited", "stop_reason": ""}, True),
                         ({"stop_code": "sigterm", "stop_reason": "drain request"}, False),
                         ({"stop_code": ["drain_request"]}, False),
                         ({"stop_reason": "drain request"}, True),      # an older daemon's file
                         ({"stop_reason": "SIGTERM"}, False)):
        path.write_text(json.dumps(final))
        assert (_drained_at(tmp_path) is not None) == ended, final


def test_sinks_of_one_name_keep_their_own_counters():
    """Two sinks of one name (two custom sinks of one class, a second OTLP endpoint): each has a
    row of its own in the stats, never one hiding the other's drops."""
    from daemon_sinks import RaisingSink
    from telemetry.daemon.sinks.base import Out, SinkRunner

    out = FanOut()
    for _ in range(3):
        out.add(SinkRunner(RaisingSink(sink_name="mine"), max_queued=10))
    out.add(SinkRunner(RaisingSink(sink_name="mine-2"), max_queued=10))
    assert [r.name for r in out.runners] == ["mine", "mine-2", "mine-3", "mine-2-2"]
    out.runners[1].put([Out("metrics", {"step": i}, b"{}") for i in range(20)])   # not started: 10 queued, 10 dropped
    sinks = out.stats()["sinks"]
    assert len(sinks) == 4 and sinks["mine-2"]["dropped"] == 10 and sinks["mine"]["dropped"] == 0, sinks


def test_a_sink_with_a_close_reserve_is_given_up_on_that_long_before_the_end_whatever_its_place(monkeypatch):
    """The W&B sink's reserve (its finish: the run's exit record) holds even behind a slow sink
    listed before it: sinks with a reserve are waited for first, and given up on (no more
    batches) that long before the sinks' end (a reviewer's find: a JSONL that took all the time
    left W&B no reserve)."""
    clock, log = Clock(), []
    monkeypatch.setattr(fanout, "time", clock)

    class Reserving(Runner):
        def __init__(self, *args, reserve: float = 0.0, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.sink = type("S", (), {"close_reserve_s": reserve})()
            self.backlog = fanout.EARLY_GIVE_UP_BACKLOG + 1

        def give_up(self) -> None:
            log.append(("give_up", self.name, clock.t))

        def queued(self) -> int:
            return self.backlog

    out = FanOut()
    out.add(Reserving("jsonl", clock, log, hung=True))
    out.add(Reserving("wandb", clock, log, hung=True, reserve=5.0))
    out._in_order = list(out.runners)
    start = clock.t
    deadline = start + 12.0
    out.drain(deadline)
    closes = [e[1] for e in log if e[0] == "close"]
    assert closes.index("wandb") < closes.index("jsonl"), log
    given = [e for e in log if e[0] == "give_up" and e[1] == "wandb"]
    assert given and given[0][2] <= deadline - fanout.ABANDON_GRACE_S - 5.0 + 1e-9, log
    # A few records queued behind a slow start (W&B's init under load): not given up on early,
    # they are logged by the end (the restarted daemon's rows were dropped so, in CI).
    clock2, log[:] = Clock(), []
    monkeypatch.setattr(fanout, "time", clock2)
    out = FanOut()
    slow = out.add(Reserving("wandb", clock2, log, hung=True, reserve=5.0))
    slow.backlog = 2
    out._in_order = list(out.runners)
    out.drain(clock2.t + 12.0)
    assert not [e for e in log if e[0] == "give_up" and e[2] < clock2.t - 1.0], log


def test_a_sink_given_up_on_that_closed_in_time_is_said_closed_short_not_abandoned():
    """A sink with a close reserve (W&B) given up on under a backlog at the drain stops inside its
    batch, closes (W&B: the run's exit record) and counts the rest dropped: the drain names it
    closed without them, with how many, and not "abandoned" (it was logged "still busy at the
    drain deadline, abandoned" though it had finished); a sink still inside its batch at the end
    is abandoned. Real runner threads, a real clock."""
    import time

    from telemetry.consumers.drain import problem_lines
    from telemetry.daemon.sinks.base import Out, Sink, SinkRunner

    class Slow(Sink):
        close_reserve_s = 1.0

        def __init__(self, name: str, hang: bool = False) -> None:
            self.name, self.hang, self.closed = name, hang, False

        def consume(self, batch):
            for i in range(len(batch)):
                if self.giving_up and not self.hang:
                    self.num_dropped += len(batch) - i    # the rest of its batch, counted
                    return
                time.sleep(0.001 if not self.hang else 30)

        def close(self):
            self.closed = True

    out = FanOut()
    slow = out.add(SinkRunner(Slow("wandb"), max_queued=10 ** 6))
    hung = out.add(SinkRunner(Slow("hung", hang=True), max_queued=10 ** 6))
    out._in_order = list(out.runners)
    out.last_words = lambda: None
    for r in out.runners:
        r.start()
    records = [Out("metrics", {"step": s}, b"x") for s in range(fanout.EARLY_GIVE_UP_BACKLOG * 4)]
    for i in range(0, len(records), 500):
        for r in out.runners:
            r.put(records[i:i + 500], 500)
    assert not out.drain(time.monotonic() + 3.0)
    assert slow.sink.closed and not hung.sink.closed
    assert set(out.unfinished) == {"wandb", "hung"}, out.unfinished
    st = slow.stats()
    assert 0 < out.closed_short["wandb"] <= st["dropped"] and st["in"] == st["written"] + st["dropped"], (out.closed_short, st)
    assert "hung" not in out.closed_short
    said = problem_lines({"unfinished_sinks": out.unfinished, "sinks_closed_short": out.closed_short})
    assert any(line.startswith("closed in time without") and "wandb" in line for line in said), said
    assert [line for line in said if "abandoned" in line] == ["abandoned at the deadline: hung"], said
