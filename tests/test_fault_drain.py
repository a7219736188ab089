"""A drain with a backlog loses nothing without counting it: ranks close with everything they
sent queued at the daemon, then SIGTERM. With a deadline the backlog fits in, the whole of it is
written (how fast is a benchmark's: on a loaded box 120,000 records take longer than the default
12 s, and what the deadline cuts is counted, as below);
with a 1 s one the intake and the JSONL each add up exactly: sent = accepted + counted lost, and
the JSONL's lines written + counted dropped = what it was handed, the file holding those lines."""
from __future__ import annotations

import subprocess
import sys

import time

import pytest

from telemetry.consumers.drain import problem_lines
from testkit import faults


def _adds_up(r: dict) -> None:
    """What the ranks sent is taken in or counted lost, but for the tail of a rank whose bye the
    drain could not reach by its deadline (a backlog larger than a loaded box reads in time):
    that rank is open and named with its last seq, so the tail is said, not hidden. The file
    holds the lines written; past them, only a batch the JSONL sink still had in hand when it was
    abandoned and the counters were read (counted dropped, and said: `dropped_in_hand`)."""
    assert r["hidden_loss"] == 0, r
    assert all(o["named"] and o["tail"] > 0 for o in r["open_ranks"].values()), r
    assert r["unaccounted_jsonl"] == 0 and r["file_vs_written"] >= 0 and r["file_past_count"] == 0, r
    assert r["integrity"]["bad_lines"] == 0 and r["integrity"]["ends_with_newline"], r


def test_a_backlog_at_sigterm_is_written(tmp_path):
    # The drain ends once everything is written: the 120 s deadline only bounds a loaded box.
    r = faults.drain_backlog(tmp_path, num_ranks=2, n=60_000, drain_timeout_s=120.0)
    _adds_up(r)
    assert r["exit_code"] == 0 and r["unread_at_drain"] == 0 and r["written"] == r["sent"], r
    assert r["dropped_by_ranks"] == 0, r             # the whole burst was queued: the drain's to write


def test_what_a_short_drain_deadline_leaves_is_counted(tmp_path):
    r = faults.drain_backlog(tmp_path, num_ranks=2, n=150_000, drain_timeout_s=1.0)
    _adds_up(r)
    assert r["unread_at_drain"] > 0 and r["counted_lost"] >= r["unread_at_drain"], r
    assert r["exit_s"] < 1.0 + 10.0, r                   # the deadline, plus process teardown


@pytest.mark.parametrize("run", range(3))
def test_a_drain_beside_cpu_bound_processes_is_exact(tmp_path, run):
    """Beside two processes that spin on the CPU (the daemon, its I/O thread and its sinks get a
    share of two cores), a backlog far larger than a 2 s deadline lets the daemon process or even
    count: every run, what each rank sent is taken in or counted lost, exactly, and the daemon
    still exits (the bound only catches a hang). A rank whose bye is still behind its backlog in
    libzmq at the drain's deadline (it connected last, so its stream is the last read) cannot be
    closed exactly: it must then be open and named with its last seq (_adds_up), never counted
    as closed with its tail gone."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        r = faults.drain_backlog(tmp_path, num_ranks=4, n=100_000, drain_timeout_s=2.0)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    _adds_up(r)
    assert r["counted_lost"] > 0, r                       # the deadline cut the backlog short
    assert r["exit_s"] < 2.0 + 10.0, r


def _out(n: int) -> list:
    from telemetry.daemon.sinks.base import Out

    return [Out("metrics", {"step": i}, b"{}") for i in range(n)]


def test_a_sink_abandoned_at_the_deadline_counts_what_it_never_wrote():
    import time

    from daemon_sinks import HangSink, SleepySink
    from telemetry.daemon.sinks.base import SinkRunner

    import threading

    gate = threading.Event()     # shut until all is queued: on a busy box the puts were once slower than the sink
    runner = SinkRunner(SleepySink(sleep_s=0.02, gate=gate), max_queued=1_000_000)   # at most 10 batches in 0.2 s
    runner.start()
    for _ in range(50):
        runner.put(_out(10_000))                          # 500k queued: far more than 0.2 s allows
    gate.set()
    assert runner.close(0.2) is False
    runner.abandon(2.0)
    s = runner.stats()
    assert s["dropped"] > 0 and s["written"] > 0, s
    assert s["written"] + s["dropped"] == s["in"] == 500_000, s

    hang_sink = HangSink()                                # never returns before the grace ends
    hung = SinkRunner(hang_sink, max_queued=1_000_000)
    hung.start()
    try:
        hung.put(_out(100))
        time.sleep(0.1)                                   # the first batch is in the sink's hands
        hung.put(_out(50))
        assert hung.close(0.1) is False
        hung.abandon(0.2)
    finally:
        hang_sink.release.set()
    assert hung.stats()["dropped"] == 150                 # the batch in hand counted too


@pytest.mark.parametrize("comes_back", ["writes", "raises"])
def test_a_sink_back_from_its_batch_after_the_deadline_counts_it_once(comes_back):
    """A sink abandoned with a batch in its hands (the drain's deadline gone: no grace left) has
    the batch counted dropped; when the sink comes back from it a moment later, the batch is
    counted by what became of it (written, or dropped once), never both: seen as a JSONL's
    in = written + dropped - 1 in a drain whose last one-record batch ended at its deadline."""
    from daemon_sinks import HangSink
    from telemetry.consumers.drain import summary_lines   # what `telemetry drain` prints of it
    from telemetry.daemon.sinks.base import SinkRunner

    sink = HangSink()
    if comes_back == "raises":
        def consume(batch):
            sink.entered.set()
            sink.release.wait()
            raise OSError("disk gone")
        sink.consume = consume
    runner = SinkRunner(sink, max_queued=1000)
    runner.start()
    runner.put(_out(1))
    assert sink.entered.wait(30)
    runner.give_up()
    runner.abandon(0.0)                                   # the deadline is already gone
    s = runner.stats()
    assert (s["written"], s["dropped"], s["dropped_in_hand"], s["in_hand"]) == (0, 1, 1, 0), s   # an upper bound, said
    assert any("dropped       1 (of them 1 in its hands when it was abandoned: they may have been written)"
               in line for line in summary_lines({"sinks": {"hang": s}})), summary_lines({"sinks": {"hang": s}})
    sink.release.set()
    runner._thread.join(30)
    assert not runner._thread.is_alive()
    s = runner.stats()
    expected = (1, 0) if comes_back == "writes" else (0, 1)
    assert (s["written"], s["dropped"]) == expected and s["in"] == 1 and "dropped_in_hand" not in s, s
    said = [line for line in summary_lines({"sinks": {"jsonl": s}}) if line.startswith("sink jsonl")]
    assert said and "in its hands" not in said[0], said
    # Every record dropped has a reason, in the counters and in the summary's words.
    assert s["dropped_by_reason"] == ({} if comes_back == "writes" else {"sink_error": 1}), s
    assert ("dropped for: sink_error 1" in said[0]) == (comes_back == "raises"), said
    runner.abandon(0.0)                                   # twice: nothing counted again
    assert (runner.stats()["written"], runner.stats()["dropped"]) == expected


@pytest.mark.timeout(600)
def test_a_w_and_b_run_behind_a_backlog_still_ends_with_its_exit_record(tmp_path, make_daemon):
    """A burst W&B cannot log by the drain's deadline: the W&B sink stops taking batches early
    enough to finish the run (its exit record, as a finished run), what it never took counted
    dropped. It was abandoned mid-backlog: no exit record, so a clean run looked crashed or
    still running in W&B (an outside tester's find)."""
    import glob

    from telemetry.client import TelemetryClient
    from wandb_offline import read_records, wait_finished

    pytest.importorskip("wandb")
    n = 40_000
    d = make_daemon(wandb="offline", world_size=1,
                    config={"drain_timeout_s": 16.0, "pollers": {"nvml_enabled": False}, "memory_mb": 512,
                            "rcvhwm": n + 100})
    tm = TelemetryClient(d.ingest, rank=0, sndhwm=n + 100)
    values = {f"train/v{i}": float(i) for i in range(10)}
    # W&B's run made first (its start is waited for at the drain: Sink.phase), then a backlog
    # every record of which reaches the daemon: W&B logs at most a few thousand rows a second
    # here, far fewer than it is handed at the drain, however loaded the host.
    tm.log(0, values)
    deadline = time.monotonic() + 180
    while not d.status()["sinks"]["wandb"].get("opened"):
        assert time.monotonic() < deadline, "W&B's run was never made"
        time.sleep(0.2)
    for s in range(1, n):
        tm.log(s, values)
        if s % 2000 == 0:                # at the daemon's pace: nothing dropped by the client
            while d.status()["records_in"] < s - 100:
                assert time.monotonic() < deadline + 300
                time.sleep(0.05)
    tm.close(timeout_s=120)
    final = d.drain()
    wb = final["sinks"]["wandb"]
    assert wb["dropped"] > 0, wb                 # a backlog it could not log by the deadline
    assert wb["in"] == wb["written"] + wb["dropped"] + wb.get("queued", 0), wb
    # Every record dropped has its reason (its queue's bound, the deadline), the sink's own part
    # named by the sink: nothing unnamed.
    assert sum(wb["dropped_by_reason"].values()) == wb["dropped"], wb
    assert wb["dropped_by_reason"] and "sink" not in wb["dropped_by_reason"], wb
    # It closed (its exit record below): never said "abandoned"; given up on, said closed short.
    said = problem_lines(final)
    assert not any("abandoned" in line for line in said), said
    if "wandb" in final["unfinished_sinks"]:
        assert 0 < final["sinks_closed_short"]["wandb"] <= wb["dropped"], (final["sinks_closed_short"], wb)
    (path,) = glob.glob(str(d.log_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    exits = [r.exit for r in read_records(wait_finished(path, timeout_s=60)) if r.WhichOneof("record_type") == "exit"]
    assert len(exits) == 1 and exits[0].exit_code == 0, exits
