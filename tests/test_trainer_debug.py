"""The `debug:` section: fault injection that is off by default, refused outside `debug:`, and real."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from trainer.config import load_config
from trainer.faults import Faults, NoFaults, make_faults

ROOT = Path(__file__).resolve().parent.parent


def test_off_by_default_and_in_every_shipped_config():
    for path in [None, *sorted((ROOT / "launch" / "configs").glob("*.yaml"))]:
        try:
            cfg = load_config(path)
        except ValueError as e:  # a GPU config on a machine without flash_attn / deepspeed
            assert "not installed" in str(e)
            continue
        assert not cfg.debug.enabled
        assert isinstance(make_faults(cfg.debug, rank=0), NoFaults)


@pytest.mark.parametrize("override", ["nan_step=3", "slow_s=1", "hang_step=2", "raise_step=2",
                                      "model.nan_step=3", "engine.slow_rank=1"])
def test_fault_keys_are_refused_outside_debug(override):
    with pytest.raises(ValueError, match="unknown config key"):
        load_config(None, [override])


@pytest.mark.parametrize("override, needle", [
    ("debug.slow_phase=lunch", "debug.slow_phase must be one of forward, backward, optimizer, data"),
    ("debug.hang_phase=x", "debug.hang_phase must be one of"),
    ("debug.nan_rank=-2", "debug.nan_rank must be a rank or -1"),
    ("debug.slow_s=-1", "debug.slow_s must be >= 0"),
    ("debug.nan_step=-1", "debug.nan_step must be >= 0"),
    ("debug.bogus=1", "unknown config key 'debug.bogus'"),
])
def test_bad_debug_values_name_the_key(override, needle):
    with pytest.raises(ValueError, match=needle):
        load_config(None, [override])


def test_nan_and_slow_hit_only_the_configured_rank_step_and_phase(monkeypatch):
    import trainer.faults

    cfg = load_config(None, ["debug.nan_step=3", "debug.nan_rank=1", "debug.slow_s=0.3",
                             "debug.slow_rank=-1", "debug.slow_phase=backward", "debug.slow_from_step=2"]).debug
    r0, r1 = make_faults(cfg, 0), make_faults(cfg, 1)
    assert isinstance(r1, Faults)
    loss = torch.tensor(2.0)
    assert torch.isnan(r1.poison(loss, 3)) and r1.poison(loss, 2) == 2.0 and r0.poison(loss, 3) == 2.0
    # The sleeps it asks for, not the clock (which a loaded machine stretches).
    slept: list[float] = []
    monkeypatch.setattr(trainer.faults.time, "sleep", slept.append)
    r0.phase("forward", 5)
    r0.phase("backward", 1)
    assert slept == []             # neither the phase nor the step is the configured one
    r0.phase("backward", 2)
    r1.phase("backward", 9)
    assert slept == [0.3, 0.3]     # both ranks (-1), from step 2 on


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "TELEMETRY_DISABLED": "1"}


BASE = ["engine.backend=ddp", "engine.zero_stage=0", "telemetry_endpoint=", "eval.every_steps=0",
        "checkpoint.every_steps=0", "checkpoint.save_final=false", "data.num_workers=0", "data.seq_len=64",
        "data.micro_batch_size=2"]


@pytest.mark.slow
def test_slow_data_phase_lands_in_data_loading_time(tmp_path):
    """debug.slow_phase=data: the delay shows where a slow input pipeline's would."""
    p = subprocess.run([sys.executable, "-m", "trainer.train", *BASE, "steps=3", f"run_dir={tmp_path}",
                        "debug.slow_s=2", "debug.slow_phase=data", "debug.slow_rank=0", "debug.slow_from_step=2",
                        f"debug_loss_log={tmp_path}/loss.jsonl"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120, env=_env())
    assert p.returncode == 0, p.stderr[-3000:]
    assert "debug fault injection on: 2.0 s extra per data from step 2 on rank 0" in p.stdout
    rows = [json.loads(line) for line in (tmp_path / "loss.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    # At least the 2 s where it was injected; under it where not (a tiny batch's read: a loaded
    # machine's seconds stay under 2 s here, where 0.5 s did not).
    assert rows[0]["data_loading_time"] < 2.0 <= rows[1]["data_loading_time"] and rows[2]["data_loading_time"] >= 2.0


def test_hang_blocks_the_rank_at_the_step(tmp_path):
    """debug.hang_step: the rank stops stepping at that step and stays alive (until killed)."""
    log = tmp_path / "loss.jsonl"
    p = subprocess.Popen([sys.executable, "-m", "trainer.train", *BASE, "steps=50", f"run_dir={tmp_path}",
                          "debug.hang_step=3", "debug.hang_phase=optimizer", f"debug_loss_log={log}"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (log.is_file() and len(log.read_text().splitlines()) >= 2):
            assert p.poll() is None, p.stdout.read()[-3000:]
            time.sleep(0.2)
        time.sleep(3)  # plenty for a 64-token step; a working rank would have logged more
        assert p.poll() is None, "the hung rank exited"
        assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [1, 2]
    finally:
        p.kill()
        out = p.communicate(timeout=30)[0]
    assert "debug.hang_step: hanging in optimizer of step 3" in out
