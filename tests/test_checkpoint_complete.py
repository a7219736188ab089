"""A checkpoint is announced only when it is complete and loadable; resume skips an incomplete
one, says so, and takes the newest complete one (issue 29, item 5)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer import checkpoint as ckpt

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            "-m", "trainer.train"]
SMALL = ["engine.backend=ddp", "engine.zero_stage=0", "eval.every_steps=0", "data.num_workers=0",
         "data.seq_len=64", "data.micro_batch_size=4", "estimate_memory=false"]


def _env(**extra):
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


def _events(recs, name):
    return [r for r in recs if r.get("kind") == "event" and r.get("name") == name]


def test_an_exception_on_rank_1_of_ddp_announces_no_incomplete_checkpoint(make_daemon, tmp_path):
    d = make_daemon(world_size=2, config={"pollers": {"nvml_enabled": False}})
    run_dir = tmp_path / "run"
    p = subprocess.run([*TORCHRUN, "--config", str(ROOT / "launch/configs/tiny.yaml"), f"run_dir={run_dir}",
                        f"telemetry_endpoint={d.ingest}", *SMALL, "steps=10", "checkpoint.every_steps=0",
                        "debug.raise_step=3", "debug.raise_rank=1"],
                       cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out[-3000:]
    d.drain()
    recs = d.read_jsonl()
    announced = _events(recs, "checkpoint_saved") + _events(recs, "emergency_checkpoint")
    assert all(e["rank"] != 1 for e in announced), announced
    for e in _events(recs, "checkpoint_saved"):      # rank 0 alone may write one: it holds the model
        assert ckpt.incomplete_reason(Path(e["data"]["path"])) == "", e
    # no directory holds rank 1's part alone
    for step_dir in ckpt.checkpoint_root(run_dir).glob("step_*"):
        assert (step_dir / "rank_00001.pt").exists() <= (step_dir / "state.pt").exists(), sorted(step_dir.iterdir())
    assert "emergency checkpoint (exception) not written: rank 1 alone holds no model state" in out, out[-4000:]


def _train(run_dir, *args):
    return subprocess.run([sys.executable, "-m", "trainer.train", "--config", str(ROOT / "launch/configs/tiny.yaml"),
                           f"run_dir={run_dir}", "telemetry_endpoint=", *SMALL, *args],
                          cwd=ROOT, env=_env(TELEMETRY_DISABLED="1"), capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_resume_skips_an_incomplete_newest_checkpoint_and_says_so(tmp_path):
    run_dir = tmp_path / "run"
    p = _train(run_dir, "steps=4", "checkpoint.every_steps=2", "checkpoint.keep_last=5")
    assert p.returncode == 0, p.stderr[-3000:]
    root = ckpt.checkpoint_root(run_dir)
    assert [c.name for c in ckpt.complete_checkpoints(run_dir)] == ["step_00000002", "step_00000004"]
    # What the old code left behind: rank 1's part alone, newest; and a save cut short before its model state.
    only_shard = root / "step_00000006"
    only_shard.mkdir()
    (root / "step_00000004" / "rank_00000.pt").rename(only_shard / "rank_00001.pt")
    (root / "step_00000004" / "state.pt").unlink()
    p = _train(run_dir, "steps=5")
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [line for line in p.stdout.splitlines() if "checkpoint" in line or "resumed" in line]
    assert f"[trainer rank 0] checkpoint {only_shard} is incomplete (no meta.json (a save that did not finish, " \
           f"or one rank's part alone)): skipped; resuming from step_00000002" in lines, lines
    assert any(f"checkpoint {root / 'step_00000004'} is incomplete (no state.pt (the model state))" in line
               for line in lines), lines
    assert f"[trainer rank 0] resumed from {root / 'step_00000002'} at step 2" in lines, lines
    assert "done: 5 steps" in p.stdout


def test_resume_from_an_incomplete_path_is_one_line_and_exit_2(tmp_path):
    shard = tmp_path / "step_00000003"
    shard.mkdir()
    (shard / "rank_00001.pt").write_bytes(b"")
    p = _train(tmp_path / "run", "steps=2", f"checkpoint.resume={shard}")
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines() == [
        f"config error: checkpoint.resume: {shard} is not a complete checkpoint: no meta.json (a save that did not "
        f"finish, or one rank's part alone)"], p.stderr
    meta = {"step": 3, "world_size": 2, "engine": "torch"}
    (shard / "meta.json").write_text(json.dumps(meta))
    p = _train(tmp_path / "run", "steps=2", f"checkpoint.resume={shard}")
    assert p.returncode == 2 and "no state.pt (the model state)" in p.stderr, p.stderr
