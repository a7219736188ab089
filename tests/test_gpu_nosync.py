"""Zero host-device syncs in the trainer's step with our client, on a real GPU.

The trainer (trainer.train.main, plain torch engine, bf16) runs with our TelemetryClient to a
live daemon under torch.cuda.set_sync_debug_mode("error") from a warm-up step to the end,
log_every=2 so log steps and other steps are both checked (benchmarks/gpu/bench.py, part
nosync). Skipped without CUDA.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _nosync(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "out"
    env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_DIR": str(tmp_path)}
    env.pop("TELEMETRY_DISABLED", None)
    cmd = ["bash", str(ROOT / "benchmarks/gpu/run.sh"), "--parts", "nosync", "--sync-engines", "ddp",
           "--config", "launch/configs/tiny.yaml", "--set", "model.dtype=bf16", "--out", str(out), *extra]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return p, json.loads((out / "results.json").read_text())


def test_trainer_step_with_client_makes_no_sync(tmp_path):
    p, results = _nosync(tmp_path)
    check = results["parts"]["nosync"]["checks"][0]
    assert check["ok"], json.dumps(check, indent=1) + p.stderr[-2000:]
    assert "sync debug" in check["mode"]
    assert check["num_log_steps_checked"] >= 1 and check["num_steps_checked"] > check["num_log_steps_checked"]


def test_sync_debug_mode_catches_an_added_sync(tmp_path):
    p, results = _nosync(tmp_path, "--inject-sync")
    check = results["parts"]["nosync"]["checks"][0]
    assert not check["ok"]
    assert check["sync_errors"] or check["num_reads"] >= 1
