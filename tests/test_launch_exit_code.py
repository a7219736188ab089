"""run.sh exits with the trainer's own code, the first failing rank's (issue 29, item 4): torchrun
alone turns every failed worker into exit 1; trainer.launch reads torchrun's failure record."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKER = """
import os, signal, sys, time
rank, mode = int(os.environ["RANK"]), sys.argv[1]
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


@pytest.mark.parametrize("nproc", [2, 1])
def test_run_sh_exits_3_when_the_trainer_stops_on_a_nonfinite_loss(tmp_path, nproc):
    """nonfinite_action=stop: the trainer exits 3 (on 2 ranks the NaN is on rank 1 only; both stop)."""
    env = {**os.environ, "TELEMETRY_WANDB": "disabled"}
    env.pop("TELEMETRY_RUNTIME_DIR", None)
    p = subprocess.run([str(ROOT / "launch/run.sh"), "--steps", "8", "--nproc", str(nproc), "--run-dir",
                        str(tmp_path / "run"), "--", "engine.backend=ddp", "engine.zero_stage=0",
                        "nonfinite_action=stop", "debug.nan_step=3", f"debug.nan_rank={nproc - 1}",
                        "eval.every_steps=0", "checkpoint.every_steps=0", "data.num_workers=0", "data.seq_len=64",
                        "data.micro_batch_size=4"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 3, p.stdout[-3000:] + p.stderr[-3000:]
    assert "emergency checkpoint (nonfinite)" in p.stdout, p.stdout[-3000:]
