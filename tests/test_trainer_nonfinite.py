"""NaN/Inf handling: detected from an on-device flag read back without waiting; skip or stop."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Poison the loss of the 3rd micro-batch with NaN (on device, no host read).
SCRIPT = r'''
import sys, torch
import trainer.model as m
orig = m.forward_loss
n = [0]
def poisoned(model, batch):
    loss, tl, c = orig(model, batch)
    n[0] += 1
    if n[0] == 3:
        loss = loss * torch.tensor(float("nan"))
    return loss, tl, c
m.forward_loss = poisoned
from trainer import train
sys.exit(train.main(sys.argv[1:]))
'''


def _run(tmp_path, action):
    args = ["steps=6", f"run_dir={tmp_path}", "engine.backend=ddp", "engine.zero_stage=0", "telemetry_endpoint=",
            "eval.every_steps=0", "checkpoint.every_steps=0", "data.num_workers=0", f"nonfinite_action={action}",
            f"debug_loss_log={tmp_path}/loss.jsonl"]
    return subprocess.run([sys.executable, "-c", SCRIPT, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_skip_keeps_the_weights_finite_and_training_going(tmp_path):
    p = _run(tmp_path, "skip")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "non-finite loss and grad_norm seen by step 3 (skip)" in p.stdout
    rows = [json.loads(line) for line in (tmp_path / "loss.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[2]["loss"] != rows[2]["loss"]  # the poisoned step is NaN...
    assert all(r["loss"] == r["loss"] for r in rows[3:])  # ...and the weights stayed finite


def test_stop_ends_the_run(tmp_path):
    p = _run(tmp_path, "stop")
    assert p.returncode == 3, p.stderr[-3000:]
    assert "(stop)" in p.stdout
    rows = (tmp_path / "loss.jsonl").read_text().splitlines()
    assert len(rows) == 3
