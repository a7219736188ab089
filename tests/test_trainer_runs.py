"""End-to-end trainer runs on CPU: 2 ranks under torchrun with gloo, real processes and files."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            "-m", "trainer.train"]
# Small and quick: eval and checkpoints on, data workers on (the real path).
COMMON = ["eval.every_steps=4", "checkpoint.every_steps=4", "log_every=1", "telemetry_endpoint="]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "TELEMETRY_DISABLED": "1"}


def _run(args, timeout=240):
    p = subprocess.run(TORCHRUN + args, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=_env())
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-4000:]
    return p


def _losses(path):
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in rows}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["deepspeed", "ddp"])
def test_resume_reproduces_the_uninterrupted_loss_curve(tmp_path, backend):
    """8 steps straight equal 4 steps + resume + 4 steps on both ranks: the loss, the grad norm and
    train/epoch at every step. A short epoch (100 samples) puts the resume in the middle of the
    second epoch: the data order after a wrap is restored too."""
    engine = [f"engine.backend={backend}", f"engine.zero_stage={2 if backend == 'deepspeed' else 0}",
              "data.epoch_samples=100", "data.seq_len=64", "data.micro_batch_size=4"]
    a, b = tmp_path / "straight", tmp_path / "resumed"
    _run(COMMON + engine + ["steps=8", f"run_dir={a}", f"debug_loss_log={a}/loss{{rank}}.jsonl"])
    _run(COMMON + engine + ["steps=4", f"run_dir={b}", f"debug_loss_log={b}/loss{{rank}}.jsonl"])
    assert (b / "checkpoints" / "step_00000004" / "meta.json").is_file()
    _run(COMMON + engine + ["steps=8", f"run_dir={b}", f"debug_loss_log={b}/loss{{rank}}.jsonl"])
    for rank in (0, 1):
        straight, resumed = _losses(a / f"loss{rank}.jsonl"), _losses(b / f"loss{rank}.jsonl")
        assert sorted(straight) == sorted(resumed) == list(range(1, 9))
        assert straight == resumed, (rank, straight, resumed)
        rows = {d.name: map(json.loads, (d / f"loss{rank}.jsonl").read_text().splitlines()) for d in (a, b)}
        epochs = {name: {r["step"]: r["epoch"] for r in it} for name, it in rows.items()}
        assert epochs["straight"] == epochs["resumed"], (rank, epochs)
        # It counts documents, forwards only, and the resume (after step 4) lies in the second epoch.
        e = epochs["straight"]
        assert all(e[s] < e[s + 1] for s in range(1, 8)) and 1 < e[4] < 2 < e[8], e
    # The two ranks saw different data.
    assert _losses(a / "loss0.jsonl") != _losses(a / "loss1.jsonl")


@pytest.mark.slow
def test_sigterm_writes_an_emergency_checkpoint_and_exits_cleanly(tmp_path):
    args = ["steps=100000", f"run_dir={tmp_path}", "engine.backend=ddp", "engine.zero_stage=0",
            "checkpoint.every_steps=0", "eval.every_steps=0", "telemetry_endpoint=",
            f"debug_loss_log={tmp_path}/loss.jsonl"]
    p = subprocess.Popen(TORCHRUN + args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=_env(), start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        log = tmp_path / "loss.jsonl"
        while time.monotonic() < deadline and not (log.is_file() and len(log.read_text().splitlines()) >= 3):
            time.sleep(0.2)
        assert log.is_file(), "the trainer never started stepping"
        # What a scheduler does: SIGTERM to every process of the job.
        os.killpg(p.pid, signal.SIGTERM)
        out, _ = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    ckpts = sorted((tmp_path / "checkpoints").glob("step_*"))
    assert ckpts, out[-3000:]
    meta = json.loads((ckpts[-1] / "meta.json").read_text())
    assert meta["reason"] == "SIGTERM" and meta["world_size"] == 2 and meta["step"] >= 3
    assert (ckpts[-1] / "rank_00000.pt").is_file() and (ckpts[-1] / "rank_00001.pt").is_file()
    assert "emergency checkpoint (SIGTERM)" in out
    # torchrun's agent prints its own SignalException traceback; none may pass through the trainer.
    assert f'File "{ROOT / "trainer"}' not in out, out[-3000:]


@pytest.mark.slow
def test_trains_20_steps_without_a_daemon_and_leaves_a_checkpoint(tmp_path):
    """The default config and engine, no daemon anywhere (the default endpoint, in a runtime
    directory nobody listens in): every record is dropped and counted, training is unaffected."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TELEMETRY_RUNTIME_DIR": str(tmp_path / "nobody")}
    for k in ("TELEMETRY_DISABLED", "TELEMETRY_ENDPOINT"):
        env.pop(k, None)
    p = subprocess.run([sys.executable, "-m", "trainer.train", "steps=20", f"run_dir={tmp_path}/run",
                        f"debug_loss_log={tmp_path}/loss.jsonl"], cwd=ROOT, capture_output=True, text=True,
                       timeout=240, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert f"no daemon serves {tmp_path / 'nobody'}: this process's records are dropped (and counted)" in p.stderr
    meta = json.loads((tmp_path / "run" / "checkpoints" / "step_00000020" / "meta.json").read_text())
    assert meta["step"] == 20
    assert (tmp_path / "run" / "checkpoints" / "config.yaml").is_file()
    losses = _losses(tmp_path / "loss.jsonl")
    assert len(losses) == 20 and all(v[0] == v[0] for v in losses.values())
    # It learns: the last steps' loss is well below the first's.
    assert sum(losses[s][0] for s in (18, 19, 20)) / 3 < losses[1][0] - 0.5


def test_exception_writes_an_emergency_checkpoint(tmp_path):
    """An exception mid-run (debug.raise_step): the trainer saves, reports and exits non-zero."""
    p = subprocess.run([sys.executable, "-m", "trainer.train", "steps=10", f"run_dir={tmp_path}", "engine.backend=ddp",
                        "engine.zero_stage=0", "telemetry_endpoint=", "checkpoint.every_steps=0",
                        "debug.raise_step=3"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120, env=_env())
    assert p.returncode == 1
    assert "debug.raise_step: injected failure at step 3 on rank 0" in p.stderr
    meta = json.loads((tmp_path / "checkpoints" / "step_00000002" / "meta.json").read_text())
    assert meta["reason"] == "exception" and meta["step"] == 2


