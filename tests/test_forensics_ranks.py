"""Hang and crash forensics with real processes (issue 19): gloo ranks of
tests/strag_scripts/ddp_rank.py, a real daemon, the client's faulthandler stacks on a signal."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_straggler_ranks import SCRIPT, free_port

HANG = {"hang_min_s": 3.0, "hang_factor": 10.0, "hang_stacks_wait_s": 3.0, "hang_py_spy": False,
        "warmup_steps": 3}


def start_ranks(endpoint: str, world: int, steps: int, *extra: str) -> list[subprocess.Popen]:
    port = free_port()
    return [subprocess.Popen([sys.executable, str(SCRIPT), "--endpoint", endpoint, "--rank", str(r),
                              "--world", str(world), "--port", str(port), "--steps", str(steps), *extra],
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
            for r in range(world)]


def kill_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(30)


def events(recs: list[dict], name: str) -> list[dict]:
    return [r for r in recs if r.get("kind") == "event" and r.get("name") == name]


@pytest.mark.slow
@pytest.mark.timeout(600)     # hang detectors below, generous for a loaded machine
def test_a_rank_hung_before_the_all_reduce_gets_one_bundle_naming_it(make_daemon):
    # py-spy (a dev extra) on: native frames where ptrace is permitted, else the reason.
    # The stage waits for the ranks' dumps until all are in or hang_stacks_wait_s: 60 s, for the
    # scheduler of a loaded machine to run their signal handlers (3 s could name no rank there).
    d = make_daemon(world_size=3, config={"diagnosis": {**HANG, "hang_py_spy": True, "hang_stacks_wait_s": 60.0},
                                          "pollers": {"nvml_enabled": False}})
    procs = start_ranks(d.ingest, 3, 10_000, "--hang-rank", "1", "--hang-step", "8")
    try:
        # Found after hang_after_s (10 x the median step, at least hang_min_s): later on a loaded
        # machine, where steps are slower; the deadline is a hang detector.
        recs = d.wait_for(lambda rs: events(rs, "diagnosis/hang"), timeout_s=300)
        time.sleep(2.0)      # a window for a repeat: it says so once per hang, not every tick
        recs = d.read_jsonl()
        assert d.status(timeout_s=60)["sinks"]["forensics"]["hangs"] == 1
        assert all(p.poll() is None for p in procs)     # the ranks are still hung, not killed
    finally:
        kill_all(procs)
    (ev,) = events(recs, "diagnosis/hang")
    data = ev["data"]
    assert ev["rank"] == 1 and data["ranks"] == [1] and data["step"] == 7
    assert "rank 1 is in load_batch at ddp_rank.py" in data["message"], data["message"]
    assert "ranks 0, 2 wait in" in data["message"] and "backward" in data["message"]
    bundle = Path(data["bundle"])
    assert bundle.parent == d.log_dir / "forensics"
    summary = json.loads((bundle / "summary.json").read_text())
    assert summary["ranks_named"] == [1] and summary["message"] == data["message"]
    for r in (0, 1, 2):
        rank = json.loads((bundle / f"rank{r}.json").read_text())
        assert "most recent call first" in rank["python_stacks"]       # every thread's stack
        assert rank["last_step"] == 7 and rank["last_records"][-1]["step"] == 7
        assert rank["process"]["status"] in ("sleeping", "running", "disk-sleep")
        spy = rank["py_spy"]
        if "text" in spy:            # Python and native frames of the rank's threads
            assert "Thread" in spy["text"] and "(lib" in spy["text"] and "ddp_rank.py" in spy["text"], spy
        else:                        # ptrace not permitted here: the bundle says so
            assert any(w in spy["error"] for w in ("ermission", "not permitted", "ptrace")), spy
    assert "load_batch" in json.loads((bundle / "rank1.json").read_text())["python_stacks"]
    assert "torch/autograd" in json.loads((bundle / "rank0.json").read_text())["python_stacks"]
    d.drain()


@pytest.mark.slow
def test_a_rank_killed_with_sigkill_produces_rank_exited(make_daemon):
    d = make_daemon(world_size=2, config={"diagnosis": HANG, "pollers": {"nvml_enabled": False}})
    procs = start_ranks(d.ingest, 2, 10_000, "--slow-rank", "1", "--slow-phase", "forward", "--slow-s", "0.01")
    try:
        d.wait_for(lambda rs: sum(r["kind"] == "metrics" for r in rs) >= 5, timeout_s=60)
        os.kill(procs[1].pid, signal.SIGKILL)      # not reaped yet: its exit status can be read
        recs = d.wait_for(lambda rs: any(e["data"]["exited_rank"] == 1 for e in events(rs, "diagnosis/rank_exited")),
                          timeout_s=120)
    finally:
        kill_all(procs)
    (ev,) = [e for e in events(recs, "diagnosis/rank_exited") if e["data"]["exited_rank"] == 1]
    assert ev["rank"] == 1 and ev["data"]["exit_code"] == -9 and "SIGKILL" in ev["data"]["message"]
    assert (Path(ev["data"]["bundle"]) / "summary.json").exists()
    d.drain()


def a_verified_rank_gone(d) -> int:
    """A real client as rank 0 (the daemon verifies it in /proc before it watches it), killed and
    reaped once verified: its src, for records and a bye sent in its name after it is gone."""
    rank = subprocess.Popen([sys.executable, "-c", "import sys, telemetry; tm = telemetry.TelemetryClient(sys.argv[1], "
                             "rank=0); print(tm._src, flush=True); sys.stdin.read()", d.ingest],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    src = int(rank.stdout.readline())
    deadline = time.monotonic() + 60
    while d.status()["sinks"]["forensics"]["ranks_verified"] < 1:
        assert time.monotonic() < deadline, d.status()["sinks"]["forensics"]
        time.sleep(0.1)
    rank.kill()
    rank.wait()                                # reaped: the pid is gone
    return src


def test_a_rank_gone_just_before_its_bye_arrives_is_no_exit(make_daemon):
    """A rank exits right after its bye; the daemon may see the process gone before the bye has
    come through (it may hold a bye behind its records, byes.BYE_HOLD_S): no rank_exited for it.
    The rank is a real client (the daemon verifies it in /proc before it watches it); its bye is
    sent for it after it is gone."""
    import zmq

    from protocol import encode_bye

    d = make_daemon(world_size=1, config={"diagnosis": HANG, "pollers": {"nvml_enabled": False}})
    src = a_verified_rank_gone(d)
    ctx = zmq.Context()
    push = d.push(ctx)
    try:
        time.sleep(1.5)                        # three forensics checks see the process gone
        push.send(encode_bye(src, 0, 1, 0, time.time_ns(), {"sent": 1, "dropped": 0}))
        time.sleep(3.0)
        recs = d.read_jsonl()
    finally:
        push.close(0)
        ctx.term()
    assert any(r["kind"] == "bye" for r in recs)
    assert events(recs, "diagnosis/rank_exited") == []
    d.drain()


def test_a_bye_held_behind_records_that_keep_coming_is_written_last_and_is_no_exit(make_daemon):
    """A loaded daemon takes a rank's last records in for longer than a fixed hold (issue 27: a
    loaded run's bye was written 2 s into them). Here the rank is gone, its bye arrives first and
    its 8 last records follow one every 0.6 s: the bye is held while they come, written after
    them, and the rank's exit (longer ago than EXIT_GRACE_S by then) is no crash."""
    import zmq

    from protocol import encode_bye, encode_metrics

    d = make_daemon(per_rank=True, world_size=1, config={"diagnosis": HANG, "pollers": {"nvml_enabled": False}})
    src = a_verified_rank_gone(d)
    ctx = zmq.Context()
    push = d.push(ctx)
    try:
        push.send(encode_bye(src, 0, 9, 0, time.time_ns(), {"sent": 10, "dropped": 0}))
        d.wait_for(lambda _: d.status()["records_in_by_kind"]["bye"] == 1, kind="daemon")
        for seq in range(1, 9):
            time.sleep(0.6)
            push.send(encode_metrics(src, 0, seq, 0, time.time_ns(), seq, {"x": float(seq)}))
        final = d.drain()
    finally:
        push.close(0)
        ctx.term()
    recs = d.read_jsonl()
    kinds = [r["kind"] for r in recs if r.get("kind") in ("metrics", "bye") and r.get("rank") == 0]
    assert kinds == ["metrics"] * 8 + ["bye"], kinds
    assert final["records_lost"] == 0
    assert events(recs, "diagnosis/rank_exited") == [], [e["data"]["message"] for e in events(recs, "diagnosis/rank_exited")]


def test_a_rank_gone_within_its_grace_when_the_drain_comes_gets_its_rank_exited(tmp_path):
    """A launcher's teardown kills every rank and its script's drain comes a second or two later,
    inside the exit grace (EXIT_GRACE_S): at the drain (the stage's close) the rank seen gone
    gets its rank_exited all the same, gone_for_s as always. In-process: a real child as the
    verified rank, the stage's timer look (flush) and its close as the runner calls them."""
    import socket
    from collections import deque

    from telemetry.daemon.diagnosis.config import DiagnosisConfig
    from telemetry.daemon.forensics.collect import open_pidfd
    from telemetry.daemon.forensics.stage import EXIT_GRACE_S, ForensicsStage
    from telemetry.daemon.forensics.verify import LocalRank

    posted: list = []
    stage = ForensicsStage(DiagnosisConfig(hang_py_spy=False), tmp_path, socket.gethostname(), post=posted.append,
                           recent=deque(), ingest=f"ipc://{tmp_path}/ingest.sock")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        with open(f"/proc/{child.pid}/stat") as f:
            start_time = int(f.read().rsplit(")", 1)[1].split()[19])
        lr = LocalRank(rank=0, pid=child.pid, start_time=start_time, stacks_path="", stacks_dev_ino=(0, 0),
                       stacks_signal=None, stacks_unavailable="none in this test")
        stage.ranks[0] = lr
        stage._hold_pidfd(0, open_pidfd(lr))
        child.kill()
        child.wait()
        killed = time.monotonic()
        stage.flush()                       # the timer's look: gone, inside its grace
        assert posted == [] or time.monotonic() - killed >= EXIT_GRACE_S   # (a box that slow: no test of the grace)
        stage.flush()                       # the runner's last flush, then its close: the drain
        stage.close()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    (ev,) = [r for r in posted if r.name == "diagnosis/rank_exited"]
    assert ev.rank == 0 and ev.data["exited_rank"] == 0 and ev.data["gone_for_s"] >= 0.0
    assert "rank 0 exited without a bye" in ev.data["message"]
    assert stage.stats()["ranks_exited"] == 1
    stage.close()                           # twice: nothing more
    assert len(posted) == 1


def test_the_rank_that_went_first_is_said_first(tmp_path):
    """Rank 1 crashes; its launcher then ends rank 0 (torchrun SIGTERMs it); both are past their
    grace at the same look (here the drain): rank 1's rank_exited, the first cause, comes first.
    They came in the order the ranks were verified: rank 0's SIGTERM read as the first failure.
    In-process, as above: real children as the verified ranks, the stage's close as the drain."""
    import socket
    from collections import deque

    from telemetry.daemon.diagnosis.config import DiagnosisConfig
    from telemetry.daemon.forensics.collect import open_pidfd
    from telemetry.daemon.forensics.stage import ForensicsStage
    from telemetry.daemon.forensics.verify import LocalRank

    posted: list = []
    stage = ForensicsStage(DiagnosisConfig(hang_py_spy=False), tmp_path, socket.gethostname(), post=posted.append,
                           recent=deque(), ingest=f"ipc://{tmp_path}/ingest.sock")
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(2)]
    try:
        for rank, child in enumerate(children):         # rank 0 verified first, as its hello comes first
            with open(f"/proc/{child.pid}/stat") as f:
                start_time = int(f.read().rsplit(")", 1)[1].split()[19])
            lr = LocalRank(rank=rank, pid=child.pid, start_time=start_time, stacks_path="", stacks_dev_ino=(0, 0),
                           stacks_signal=None, stacks_unavailable="none in this test")
            stage.ranks[rank] = lr
            stage._hold_pidfd(rank, open_pidfd(lr))
        for rank, signum in ((1, signal.SIGSEGV), (0, signal.SIGTERM)):
            children[rank].send_signal(signum)       # not reaped: its exit status can be read
            deadline = time.monotonic() + 60
            while stage.exit_watch.exited_at(rank) is None:      # the watcher has timed its going
                assert time.monotonic() < deadline
                time.sleep(0.01)
        stage.close()
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    evs = [r for r in posted if r.name == "diagnosis/rank_exited"]
    assert [(e.data["exited_rank"], e.data["exit_code"]) for e in evs] == \
        [(1, -signal.SIGSEGV), (0, -signal.SIGTERM)], [e.data["message"] for e in evs]


def test_a_rank_killed_just_before_the_drain_has_its_rank_exited_in_the_run(make_daemon):
    """The same through a daemon: a verified rank killed, the drain asked at once (well inside
    the exit grace); its rank_exited, posted at the forensics stage's close, still reaches the
    run's JSONL (the fan-out takes the analysis stages' last events before the sinks drain)."""
    d = make_daemon(world_size=1, config={"diagnosis": HANG, "pollers": {"nvml_enabled": False}})
    a_verified_rank_gone(d)
    d.drain()
    (ev,) = events(d.read_jsonl(), "diagnosis/rank_exited")
    assert ev["rank"] == 0 and ev["data"]["exited_rank"] == 0 and ev["data"]["gone_for_s"] >= 0.0


@pytest.mark.slow
def test_ranks_killed_together_are_exits_not_a_hang(make_daemon):
    """Both ranks SIGKILLed at once, a hang's threshold (1 s) shorter than the grace a gone rank
    gets for its bye (3 s): no step comes, yet nobody hangs: each is told as rank_exited, and no
    diagnosis/hang is said of ranks already seen gone (it made the goodput ledger's launch last
    past their exits)."""
    d = make_daemon(world_size=2, config={"diagnosis": {**HANG, "hang_min_s": 1.0}, "pollers": {"nvml_enabled": False}})
    procs = start_ranks(d.ingest, 2, 10_000, "--slow-rank", "1", "--slow-phase", "forward", "--slow-s", "0.01")
    try:
        deadline = time.monotonic() + 60
        while d.status()["sinks"]["forensics"]["ranks_verified"] < 2:     # both watched
            assert time.monotonic() < deadline, d.status()["sinks"]["forensics"]
            time.sleep(0.1)
        d.wait_for(lambda rs: sum(r["kind"] == "metrics" for r in rs) >= 5, timeout_s=60)
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)         # not reaped yet: their exit status can be read
        recs = d.wait_for(lambda rs: len(events(rs, "diagnosis/rank_exited")) >= 2, timeout_s=120)
        time.sleep(1.5)                            # a window for a late hang
        recs = d.read_jsonl()
    finally:
        kill_all(procs)
    assert sorted(e["data"]["exited_rank"] for e in events(recs, "diagnosis/rank_exited")) == [0, 1]
    assert events(recs, "diagnosis/hang") == [], events(recs, "diagnosis/hang")
    d.drain()
