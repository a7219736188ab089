"""Zero host-device syncs in the trainer's step with our client, on a real GPU.

The trainer (trainer.train.main, bf16) runs with our TelemetryClient to a live daemon under
torch.cuda.set_sync_debug_mode from a warm-up step to the end, log_every=2 so log steps and
other steps are both checked (benchmarks/gpu/bench.py, part nosync): the plain torch engine in
"error" mode (no sync at all), DeepSpeed ZeRO-2 in "warn" mode (DeepSpeed's own syncs listed,
none of ours). The trainer's CUDA-event phase timer and host flag, alone, under "error" mode.
Skipped without CUDA.
"""
from __future__ import annotations

import importlib.util
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
    p, results = _nosync(tmp_path, "--sync-mode", "error")
    check = results["parts"]["nosync"]["checks"][0]
    assert check["ok"], json.dumps(check, indent=1) + p.stderr[-2000:]
    assert "sync debug 'error'" in check["mode"]
    assert check["num_log_steps_checked"] >= 1 and check["num_steps_checked"] > check["num_log_steps_checked"]


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed")
def test_deepspeed_zero2_bf16_step_with_client_adds_no_sync_of_ours(tmp_path):
    """DeepSpeed's ZeRO-2 bf16 optimizer reads its overflow flag / global norm on the host (its
    sync, listed); the trainer and the client add none."""
    p, results = _nosync(tmp_path, "--sync-mode", "warn", "--sync-engines", "deepspeed")
    check = results["parts"]["nosync"]["checks"][0]
    assert check["engine"] == "deepspeed" and check["rc"] == 0, json.dumps(check, indent=1) + p.stderr[-3000:]
    assert check["ok"], json.dumps(check, indent=1)
    assert check["num_reads"] == 0 and not check["sync_errors"]
    assert all("deepspeed" in r["site"] or "transformers" in r["site"] for r in check["library_reads"] or []), \
        check["library_reads"]


@pytest.mark.parametrize("mode", ["error", "warn"])
def test_sync_debug_mode_catches_an_added_sync(tmp_path, mode):
    p, results = _nosync(tmp_path, "--inject-sync", "--sync-mode", mode)
    check = results["parts"]["nosync"]["checks"][0]
    assert not check["ok"]
    assert check["sync_errors"] or check["num_reads"] >= 1
    if mode == "warn":  # attributed to the line that made it, not to a library
        assert any("benchmarks/gpu/child.py" in r["site"] for r in check["reads"]), check["reads"]


def test_phase_timer_and_host_flag_never_wait_for_the_device():
    """The trainer's CUDA-event phase timer and its host flag, under sync debug "error": a phase
    still running on the GPU is not read (the older reading stays), a finished one is, in seconds."""
    from trainer.metrics import HostFlag, PhaseTimer

    dev = torch.device("cuda")
    timer, flag = PhaseTimer(dev), HostFlag(dev)
    one = torch.ones(1, device=dev)
    # Set-up: every kernel below launched once. CUDA loads a kernel at its first launch and that
    # load waits for the device (lazy loading): in a training loop, the first step's cost only.
    timer.start("warm-up")
    torch.cuda._sleep(1000)
    flag.add(one)
    timer.stop("warm-up")
    timer.end_step()
    flag.start_readback()
    torch.cuda.synchronize()
    assert set(timer.latest()) == {"warm-up"} and flag.poll() == [1.0]
    torch.cuda.set_sync_debug_mode("error")
    try:
        timer.start("forward")
        torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU time at ~2 GHz, queued, not waited on
        flag.add(one)
        timer.stop("forward")
        timer.end_step()
        flag.start_readback()
        assert set(timer.latest()) == {"warm-up"}   # this step's events have not completed: the older reading
        assert flag.poll() is None        # the copy has not landed: no answer, no wait
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()  # test only: now everything has completed
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = timer.latest()
        assert flag.poll() == [2.0]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert set(got) == {"forward"} and 0.05 < got["forward"] < 60, got
