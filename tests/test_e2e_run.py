"""The foundation's acceptance: run.sh end to end, and a trainer the daemon's death does not stop (one
that never had a daemon: test_trainer_runs.py)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from protocol import output

ROOT = Path(__file__).resolve().parents[1]


def read_jsonl(path: Path) -> list[dict]:
    """The file's records, each checked against its declaration (protocol/output.py)."""
    lines = path.read_bytes().splitlines()
    for line in lines:
        output.check(line)
    return [json.loads(line) for line in lines]


@pytest.mark.slow
def test_run_sh_two_ranks_thirty_steps(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "TELEMETRY_WANDB": "disabled"}
    env.pop("TELEMETRY_RUNTIME_DIR", None)
    proc = subprocess.run([str(ROOT / "launch/run.sh"), "--steps", "30", "--nproc", "2", "--run-dir", str(run_dir)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = read_jsonl(run_dir / "telemetry" / "metrics.jsonl")
    steps = [r for r in records if r["kind"] == "metrics" and "rank" not in r]
    loss_steps = sorted({r["step"] for r in steps if "train/loss" in r["values"]})
    assert len(loss_steps) == 30, loss_steps
    assert all("missing_ranks" not in r for r in steps), "every step should have both ranks"
    assert any(r["values"].get("perf/tokens_per_second", 0) > 0 for r in steps)
    daemon = [r for r in records if r["kind"] == "daemon"]
    assert daemon and daemon[-1]["values"]["telemetry/records_lost"] == 0
    assert daemon[-1]["values"]["telemetry/records_in"] >= 60
    assert "run summary" in proc.stdout
    assert (run_dir / "checkpoints").is_dir()


def _trainer(tmp_path, steps, env_extra):
    env = {**os.environ, **env_extra, "WANDB_MODE": "disabled"}
    return subprocess.Popen([sys.executable, "-m", "trainer.train", "--config", str(ROOT / "launch/configs/tiny.yaml"),
                             f"steps={steps}", f"run_dir={tmp_path / 'run'}"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
@pytest.mark.timeout(1200)    # hang detectors below, generous for a loaded machine (5 s a step and more there)
def test_killing_the_daemon_does_not_stop_the_trainer(tmp_path):
    from daemon_util import start_daemon

    steps = 20
    d = start_daemon(tmp_path)
    p = None
    try:
        p = _trainer(tmp_path, steps, {"TELEMETRY_ENDPOINT": d.ingest})
        # Kill the daemon hard once it has seen some of the run, before the run ends.
        d.wait_for(lambda recs: any(r["kind"] == "metrics" for r in recs), timeout_s=300)
        d.kill()
        seen = sorted({r["step"] for r in d.read_jsonl("metrics")})
        try:
            out, _ = p.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            raise AssertionError(f"the trainer did not exit within 900 s of the daemon's death; its output: "
                                 f"{out[-3000:]}") from None
        assert p.returncode == 0, out[-3000:]
        assert f"done: {steps} steps" in out
        # Steps ran with the daemon dead: it saw only the first of them.
        assert seen and seen[-1] < steps, seen
    finally:
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()
        d.cleanup()
