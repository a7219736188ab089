"""run.sh exits with the trainer's own code, the first failing rank's (issue 29, item 4): torchrun
alone turns every failed worker into exit 1; trainer.launch reads torchrun's failure record. The
DeepSpeed launcher exits 256-N for a rank killed by signal N (247 for SIGKILL); trainer.launch
--deepspeed takes the rank's returncode from DeepSpeed's node launcher, run in its process. The
trainer's own exit 3 (nonfinite_action=stop) through run.sh, on one rank and two:
test_trainer_nonfinite.py."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKER = """
import os, signal, sys, time
rank, mode = int(os.environ["RANK"]), sys.argv[-1]   # deepspeed puts --local_rank=N first
if rank == 1 and mode == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if rank == 1 and mode == "exit3":
    sys.exit(3)
if rank == 0 and mode != "ok":
    time.sleep(120)     # torchrun ends it once rank 1 has failed: rank 1's code is the first
"""


@pytest.mark.parametrize("mode, code", [("exit3", 3), ("kill", 137), ("ok", 0)])
def test_launch_exits_with_the_first_failing_ranks_code(tmp_path, mode, code):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    p = subprocess.run([sys.executable, "-m", "trainer.launch", "--standalone", "--nproc_per_node", "2",
                        str(script), mode], cwd=ROOT, capture_output=True, text=True, timeout=240,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == code, p.stderr[-3000:]
    if code:
        assert f"[trainer.launch] rank 1 failed first (exit code {-9 if mode == 'kill' else 3}): exiting {code}" \
            in p.stderr, p.stderr[-3000:]
        assert "Root Cause" in p.stderr            # torchrun's own report is still printed


@pytest.mark.parametrize("mode, code", [("exit3", 3), ("kill", 137), ("ok", 0)])
def test_deepspeed_launch_exits_with_the_first_failing_ranks_code(tmp_path, mode, code):
    """The DeepSpeed launcher itself: 3 -> 3, but a SIGKILLed rank -> 247 (its sys.exit(-9))."""
    pytest.importorskip("deepspeed")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    p = subprocess.run([sys.executable, "-m", "trainer.launch", "--deepspeed", "--num_nodes", "1", "--num_gpus", "2",
                        str(script), mode], cwd=ROOT, capture_output=True, text=True, timeout=240,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == code, p.stdout[-3000:] + p.stderr[-3000:]
    if code:
        assert f"[trainer.launch] rank 1 failed first (exit code {-9 if mode == 'kill' else 3}): exiting {code}" \
            in p.stderr, p.stderr[-3000:]


@pytest.mark.slow
def test_run_sh_deepspeed_exits_137_when_the_rank_is_sigkilled(tmp_path):
    """run.sh --launcher deepspeed, one rank hung at step 2 and SIGKILLed (its pid from its hello):
    128+9 as under torchrun, not DeepSpeed's 247. One rank: no other rank can fail first."""
    pytest.importorskip("deepspeed")
    import json
    import signal
    import time

    env = {**os.environ, "TELEMETRY_WANDB": "disabled", "OMP_NUM_THREADS": "1"}
    env.pop("TELEMETRY_RUNTIME_DIR", None)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([str(ROOT / "launch/run.sh"), "--launcher", "deepspeed", "--steps", "8", "--nproc", "1",
                             "--run-dir", str(run_dir), "--", "engine.backend=ddp", "engine.zero_stage=0",
                             "debug.hang_step=2", "debug.hang_rank=0", "eval.every_steps=0",
                             "checkpoint.every_steps=0", "data.num_workers=0", "data.seq_len=64",
                             "data.micro_batch_size=4"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        pid, deadline = None, time.monotonic() + 300   # a hang detector, not a speed
        while pid is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                lines = (run_dir / "telemetry" / "metrics.jsonl").read_text().split("\n")[:-1]
            except FileNotFoundError:
                lines = []
            for rec in map(json.loads, lines):
                if rec.get("kind") == "hello" and rec.get("rank") == 0 and rec.get("info", {}).get("pid"):
                    pid = rec["info"]["pid"]
            time.sleep(0.2)
        assert pid is not None, "no hello from rank 0"
        assert "trainer.train" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 137, out[-3000:]
    assert "[trainer.launch] rank 0 failed first (exit code -9): exiting 137" in out, out[-3000:]




def test_deepspeed_launch_passes_sigterm_on_to_its_ranks(tmp_path):
    """SIGTERM to trainer.launch --deepspeed (what `telemetry run` passes on) reaches every rank
    once, through DeepSpeed's node launcher, and the launch exits 128+15. DeepSpeed's runner
    passes nothing on to a local node launcher: killed, it left the ranks training, unseen."""
    pytest.importorskip("deepspeed")
    import signal
    import time

    script = tmp_path / "worker.py"
    script.write_text(SIGTERM_WORKER)
    p = subprocess.Popen([sys.executable, "-m", "trainer.launch", "--deepspeed", "--num_nodes", "1", "--num_gpus", "2",
                          str(script), str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    try:
        deadline = time.monotonic() + 240          # a hang detector
        while not all((tmp_path / f"ready-{r}").exists() for r in (0, 1)):
            assert time.monotonic() < deadline and p.poll() is None, p.stdout.read()[-3000:] if p.poll() else ""
            time.sleep(0.1)
        p.send_signal(signal.SIGTERM)
        out = p.communicate(timeout=120)[0]
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)    # whatever is left of its group (an orphaned node launcher)
        except ProcessLookupError:
            pass
    pids = [int((tmp_path / f"ready-{r}").read_text()) for r in (0, 1)]
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or \
            open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[0] == "Z", f"rank {pid} outlived the launch"
    assert [(tmp_path / f"got-{r}").read_text() for r in (0, 1)] == ["SIGTERM", "SIGTERM"], out[-3000:]
    assert p.returncode == 128 + signal.SIGTERM, out[-3000:]


SIGTERM_WORKER = """
import os, signal, sys, time
rank, out = int(os.environ["RANK"]), sys.argv[-1]
got = []
signal.signal(signal.SIGTERM, lambda n, _f: got.append(signal.Signals(n).name))
with open(f"{out}/ready-{rank}", "w") as f:
    f.write(str(os.getpid()))
deadline = time.monotonic() + 200
while time.monotonic() < deadline and not got:
    time.sleep(0.05)
time.sleep(1.0)                 # a second one would come within this
with open(f"{out}/got-{rank}", "w") as f:
    f.write(",".join(got))
"""


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_torchrun_launch_stopped_by_a_signal_exits_128_plus_n_without_a_traceback(tmp_path, signame):
    """SIGTERM or SIGINT to trainer.launch on torchrun (what `telemetry run --nproc 2` passes on,
    a scheduler's preemption): torchrun's agent stops its ranks and raises SignalException, which
    torchrun ends in a traceback and exit 1; the launch exits 128+N and says so in one line."""
    import signal
    import time

    signum = getattr(signal, signame)
    script = tmp_path / "worker.py"
    script.write_text(QUIET_WORKER)
    p = subprocess.Popen([sys.executable, "-m", "trainer.launch", "--standalone", "--nproc_per_node", "2",
                          str(script), str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    try:
        deadline = time.monotonic() + 240          # a hang detector
        while not all((tmp_path / f"ready-{r}").exists() for r in (0, 1)):
            assert time.monotonic() < deadline and p.poll() is None, p.communicate()[1][-3000:] if p.poll() else ""
            time.sleep(0.1)
        p.send_signal(signum)
        out, err = p.communicate(timeout=120)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert p.returncode == 128 + signum, err[-3000:]
    assert f"[trainer.launch] stopped by {signame}: exiting {128 + signum}" in err, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    for r in (0, 1):
        pid = int((tmp_path / f"ready-{r}").read_text())
        assert not os.path.exists(f"/proc/{pid}") or \
            open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[0] == "Z", f"rank {r} outlived the launch"


QUIET_WORKER = """
import os, signal, sys, time
rank, out = int(os.environ["RANK"]), sys.argv[-1]
signal.signal(signal.SIGINT, signal.SIG_DFL)      # a rank that ends quietly on either signal
with open(f"{out}/ready-{rank}", "w") as f:
    f.write(str(os.getpid()))
time.sleep(200)
"""


def test_telemetry_run_nproc_2_stopped_by_sigterm_exits_143(tmp_path):
    """`telemetry run --nproc 2` SIGTERMed (a scheduler's preemption): each rank gets one SIGTERM,
    and the run exits 143, the launch's 128+N, not torchrun's 1 under a traceback."""
    import signal

    from test_telemetry_run_terminal import _launched

    p = _launched(tmp_path, 120, nproc=2)
    try:
        p.send_signal(signal.SIGTERM)
        rest = p.stdout.read().decode(errors="replace")
        assert p.wait(120) == 128 + signal.SIGTERM, rest[-3000:]
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert rest.count("signals SIGTERM\n") == 2, rest[-3000:]
    assert "Traceback" not in rest, rest[-3000:]
