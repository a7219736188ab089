"""NaN/Inf handling on every engine, with the NaN injected through the config's `debug:` section.

Every engine reports a real grad norm (ZeRO stage 0 included), healthy steps raise no
`nonfinite` event, a non-finite step leaves weights and optimizer state exactly as they were
(`skip`: training goes on), and `stop` ends the run with exit 3 and an emergency checkpoint.
"""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
ENGINES = {"ddp": ["engine.backend=ddp", "engine.zero_stage=0"],
           **{f"zero{z}": ["engine.backend=deepspeed", f"engine.zero_stage={z}"] for z in range(4)}}


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "TELEMETRY_DISABLED": "1"}


def _args(tmp_path, engine, action, extra=()):
    return [f"run_dir={tmp_path}", *ENGINES[engine], "telemetry_endpoint=", "eval.every_steps=0",
            "checkpoint.every_steps=0", "data.num_workers=0", "data.seq_len=64", "data.micro_batch_size=4",
            f"nonfinite_action={action}", f"debug_loss_log={tmp_path}/loss.jsonl", *extra]


def _train(args, timeout=240):
    return subprocess.run([sys.executable, "-m", "trainer.train", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=_env())


def _run_sh(tmp_path, nproc, args, timeout=600):
    """launch/run.sh (its daemon, W&B off) on nproc ranks with the trainer's args (run_dir and
    the endpoint are run.sh's own)."""
    env = {**os.environ, "TELEMETRY_WANDB": "disabled", "OMP_NUM_THREADS": "1"}
    for k in ("TELEMETRY_RUNTIME_DIR", "TELEMETRY_DISABLED"):
        env.pop(k, None)
    args = [a for a in args if not a.startswith(("run_dir=", "telemetry_endpoint="))]
    return subprocess.run([str(ROOT / "launch/run.sh"), "--nproc", str(nproc), "--run-dir", str(tmp_path), "--",
                           *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _rows(tmp_path, name="loss.jsonl"):
    return [json.loads(line) for line in (tmp_path / name).read_text().splitlines()]


def _tensors(obj, prefix=""):
    """Every tensor inside a (nested) checkpoint object, by its path."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _tensors(v, f"{prefix}/{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _tensors(v, f"{prefix}/{i}")


def _checkpoint_tensors(step_dir):
    """Model and optimizer tensors of a checkpoint (not the per-rank RNG files)."""
    out = {}
    for f in sorted(step_dir.rglob("*.pt")):
        if f.name.startswith("rank_"):
            continue
        for k, t in _tensors(torch.load(f, map_location="cpu", weights_only=False)):
            out[f"{f.relative_to(step_dir)}{k}"] = t
    return out


@pytest.mark.slow
@pytest.mark.parametrize("engine", list(ENGINES))
def test_skip_drops_exactly_the_bad_step_and_healthy_steps_raise_nothing(tmp_path, engine):
    p = _train(_args(tmp_path, engine, "skip", ["steps=4", "debug.nan_step=2", "checkpoint.every_steps=1",
                                                     "checkpoint.keep_last=10"]))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    # One event, for the injected step only: no false alarm on the healthy steps 1, 3 and 4.
    events = [line for line in p.stdout.splitlines() if line.startswith("[trainer") and "non-finite" in line]
    assert events == ["[trainer rank 0] non-finite loss and grad_norm seen by step 2 (skip)"], events
    rows = _rows(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert math.isnan(rows[1]["loss"]) and not math.isfinite(rows[1]["grad_norm"])
    for r in rows[:1] + rows[2:]:  # a real norm on every engine (ZeRO 0 reported null before)
        assert math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0, r
    # The LR schedule counts the dropped step on every engine (DeepSpeed alone would hold it back).
    from trainer.config import load_config
    from trainer.engine import lr_lambda
    cfg = load_config(None, ["steps=4"])
    assert [r["lr"] for r in rows] == pytest.approx([cfg.optim.lr * lr_lambda(cfg)(s) for s in range(4)], rel=1e-9)
    # The dropped step changed no weight and no optimizer state: checkpoint 2 == checkpoint 1.
    before = _checkpoint_tensors(tmp_path / "checkpoints" / "step_00000001")
    after = _checkpoint_tensors(tmp_path / "checkpoints" / "step_00000002")
    assert len(before) >= 4 and before.keys() == after.keys()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert not changed, changed[:10]
    # ...and the steps after it did train (the weights moved again).
    later = _checkpoint_tensors(tmp_path / "checkpoints" / "step_00000003")
    assert any(not torch.equal(before[k], later[k]) for k in before)


@pytest.mark.parametrize("engine", ["ddp", "zero0"])
def test_stop_exits_3_with_an_emergency_checkpoint(tmp_path, engine):
    """DDP through launch/run.sh (one rank, its daemon): run.sh exits with the trainer's 3 too."""
    args = _args(tmp_path, engine, "stop", ["steps=6", "debug.nan_step=2"])
    p = _run_sh(tmp_path, 1, args) if engine == "ddp" else _train(args)
    assert p.returncode == 3, p.stdout[-3000:] + p.stderr[-3000:]
    assert "non-finite loss and grad_norm seen by step 2 (stop)" in p.stdout
    assert "emergency checkpoint (nonfinite) at step 2" in p.stdout
    assert [r["step"] for r in _rows(tmp_path)] == [1, 2]
    meta = json.loads((tmp_path / "checkpoints" / "step_00000002" / "meta.json").read_text())
    assert meta["reason"] == "nonfinite"
    # The checkpoint holds the weights from before the bad step: all finite.
    weights = _checkpoint_tensors(tmp_path / "checkpoints" / "step_00000002")
    assert weights and all(torch.isfinite(t).all() for t in weights.values() if t.is_floating_point())


@pytest.mark.slow
def test_stop_on_two_ranks_agrees_on_the_step_and_checkpoints_together(tmp_path):
    """The NaN only on rank 1: both ranks stop at the same step and write one complete checkpoint;
    launch/run.sh exits 3, the trainer's code (torchrun alone would say 1)."""
    args = _args(tmp_path, "ddp", "stop", ["steps=8", "debug.nan_step=3", "debug.nan_rank=1",
                                           f"debug_loss_log={tmp_path}/loss{{rank}}.jsonl"])
    p = _run_sh(tmp_path, 2, args)
    assert p.returncode == 3, p.stdout[-3000:] + p.stderr[-3000:]
    assert "emergency checkpoint (nonfinite)" in p.stdout, p.stdout[-3000:]
    ckpts = sorted((tmp_path / "checkpoints").glob("step_*"))
    assert len(ckpts) == 1, ckpts
    meta = json.loads((ckpts[0] / "meta.json").read_text())
    assert meta["reason"] == "nonfinite" and meta["world_size"] == 2 and meta["step"] >= 3
    assert (ckpts[0] / "rank_00000.pt").is_file() and (ckpts[0] / "rank_00001.pt").is_file()
    steps = [[r["step"] for r in _rows(tmp_path, f"loss{rank}.jsonl")] for rank in (0, 1)]
    assert steps[0] == steps[1] == list(range(1, meta["step"] + 1))
