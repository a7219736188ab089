"""rank_exited under torchrun (issue 29, item 3): the launcher reaps a killed rank at once, so a
zombie's /proc status is gone before the daemon looks; the pidfd the daemon holds from the
rank's verification keeps its exit status (Linux >= 6.15, PIDFD_INFO_EXIT)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from daemon_util import kernel_keeps_exit_status
from test_forensics_ranks import HANG, events

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            "-m", "trainer.train"]


def _rank_pids(launcher: psutil.Process) -> dict[int, int]:
    out = {}
    for p in launcher.children(recursive=True):
        try:
            rank = p.environ().get("RANK")
        except psutil.Error:
            continue
        if rank is not None:
            out[int(rank)] = p.pid
    return out


@pytest.mark.slow
@pytest.mark.skipif(not kernel_keeps_exit_status(), reason="kernel before 6.15: no PIDFD_INFO_EXIT")
def test_a_rank_killed_under_torchrun_has_its_exit_code(make_daemon, tmp_path):
    d = make_daemon(world_size=2, config={"diagnosis": HANG, "pollers": {"nvml_enabled": False}})
    run = subprocess.Popen(
        [*TORCHRUN, "--config", str(ROOT / "launch/configs/tiny.yaml"), f"run_dir={tmp_path / 'run'}",
         f"telemetry_endpoint={d.ingest}", "engine.backend=ddp", "engine.zero_stage=0", "steps=100000",
         "eval.every_steps=0", "checkpoint.every_steps=0", "checkpoint.save_final=false", "data.num_workers=0",
         "data.seq_len=64", "data.micro_batch_size=4", "estimate_memory=false"],
        cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    try:
        deadline = time.monotonic() + 180      # hang detector: two trainers start on a busy box
        while d.status()["sinks"]["forensics"]["ranks_verified"] < 2:
            assert run.poll() is None and time.monotonic() < deadline, (run.poll(), d.status()["sinks"]["forensics"])
            time.sleep(0.2)
        pids = _rank_pids(psutil.Process(run.pid))
        assert set(pids) == {0, 1}, pids
        os.kill(pids[1], signal.SIGKILL)
        recs = d.wait_for(lambda rs: any(e["data"].get("exited_rank") == 1 for e in events(rs, "diagnosis/rank_exited")),
                          timeout_s=60)
        out, _ = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(30)
    # torchrun reaped it (the pid names no process, or another one) and says -9 itself
    assert not psutil.pid_exists(pids[1]) or psutil.Process(pids[1]).ppid() != run.pid
    assert "exitcode" in out and "-9" in out, out[-3000:]
    (ev,) = [e for e in events(recs, "diagnosis/rank_exited") if e["data"]["exited_rank"] == 1]
    assert ev["data"]["exit_code"] == -9 and "killed by SIGKILL" in ev["data"]["message"], ev["data"]
    d.drain()


def test_the_exit_watcher_notes_when_each_watched_process_died():
    """exitwatch.ExitWatcher: a process killed is noted between the kill and the moment the test
    sees it noted (the stage's own timer looks once a second); one still running is not; one
    forgotten is never noted; a descriptor number reused for another process names that one."""
    from telemetry.daemon.forensics.exitwatch import ExitWatcher

    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"]) for _ in range(3)]
    w = ExitWatcher()
    try:
        for rank, p in enumerate(procs):
            w.watch(rank, os.pidfd_open(p.pid))
        w.forget(2)
        before = time.monotonic()
        procs[0].kill()
        procs[2].kill()
        deadline = time.monotonic() + 60            # a hang detector
        while (at := w.exited_at(0)) is None:
            assert time.monotonic() < deadline, "the kill was never noted"
            time.sleep(0.005)
        seen = time.monotonic()
        assert before <= at <= seen
        assert w.exited_at(1) is None and w.exited_at(2) is None
        # The number of a forgotten descriptor comes back for a new process: that one's life counts.
        p3 = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        procs.append(p3)
        w.watch(3, os.pidfd_open(p3.pid))
        time.sleep(0.2)
        assert w.exited_at(3) is None
        p3.kill()
        deadline = time.monotonic() + 60
        while w.exited_at(3) is None:
            assert time.monotonic() < deadline, "the second kill was never noted"
            time.sleep(0.005)
    finally:
        w.close()
        for p in procs:
            p.kill()
            p.wait(30)
