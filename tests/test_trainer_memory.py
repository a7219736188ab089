"""The memory pre-flight: a loud warning, naming the knobs that help, when the estimate exceeds the device."""
import os
import subprocess
import sys
from pathlib import Path

from trainer.memory_estimate import estimate, memory_warning

ROOT = Path(__file__).resolve().parent.parent


def _est(**kw):
    args = dict(num_params=500_000_000, hidden_size=896, num_layers=24, num_heads=14, vocab_size=151936,
                seq_len=2048, micro_batch_size=8, dtype="bf16", zero_stage=0, world_size=8,
                gradient_checkpointing=False)
    args.update(kw)
    return estimate(**args)


def test_no_warning_when_it_fits():
    est = _est()
    assert memory_warning(est, est.total_gb * 1.01, device="cuda:0", zero_stage=0, world_size=8,
                          gradient_checkpointing=False, micro_batch_size=8) is None


def test_warning_names_the_knobs_that_apply():
    est = _est()
    msg = memory_warning(est, est.total_gb / 2, device="cuda:0", zero_stage=0, world_size=8,
                         gradient_checkpointing=False, micro_batch_size=8)
    assert f"{est.total_gb:.2f} GB per rank" in msg and "cuda:0" in msg
    assert "engine.zero_stage=1" in msg and "model.gradient_checkpointing=true" in msg
    assert "data.micro_batch_size" in msg and "engine.grad_accum_steps" in msg
    # Knobs already turned are not suggested again.
    msg = memory_warning(est, est.total_gb / 2, device="cuda:0", zero_stage=3, world_size=8,
                         gradient_checkpointing=True, micro_batch_size=1)
    assert "zero_stage" not in msg and "gradient_checkpointing" not in msg and "micro_batch_size" not in msg
    assert "a smaller model or data.seq_len" in msg


def test_the_trainer_warns_before_training(tmp_path):
    """The tiny model with a micro batch far beyond this machine's memory: the warning comes at
    start-up, on stderr, before any step (the run itself is not waited for)."""
    args = [sys.executable, "-m", "trainer.train", "steps=1", f"run_dir={tmp_path}", "engine.backend=ddp",
            "engine.zero_stage=0", "telemetry_endpoint=", "eval.every_steps=0", "checkpoint.save_final=false",
            "data.num_workers=0", "data.seq_len=512", "data.micro_batch_size=100000"]
    p = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "TELEMETRY_DISABLED": "1"})
    err = ""
    try:
        for line in p.stderr:
            err += line
            if "WARNING: the memory estimate" in line:
                break
    finally:
        p.kill()
        p.communicate(timeout=30)
    assert "WARNING: the memory estimate" in err, err[-3000:]
    assert "data.micro_batch_size" in err and "model.gradient_checkpointing=true" in err
