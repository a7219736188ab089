"""Nothing vanishes while a counter says 0 (issue 26): every record a client sent is written or
counted, whatever goes wrong around the daemon: a drain under load, idle connections that never
become clients, a run directory deleted or moved, a full disk, a step W&B cannot take."""
from __future__ import annotations

import glob

import pytest

from telemetry.client import TelemetryClient


# -- W&B: one absurd step does not make every later step one W&B refuses ------------------------
def test_wandb_one_absurd_step_does_not_swallow_the_rest(tmp_path, make_daemon):
    pytest.importorskip("wandb")
    from wandb_offline import history_rows, wait_finished

    log_dir = tmp_path / "tel"
    d = make_daemon(wandb="offline", world_size=1, log_dir=log_dir, run_name="wb-jump")
    tm = TelemetryClient(d.ingest, rank=0)
    tm.log(10**12, {"train/loss": -1.0})
    for s in range(1, 2001):
        tm.log(s, {"train/loss": float(s)})
    tm.log(1000, {"train/loss": 0.5})          # back in step: W&B cannot take it; counted
    tm.close()
    d.wait_for(lambda recs: any(r.get("step") == 2000 for r in recs), kind="metrics", timeout_s=60)
    status = d.status()
    assert d.stop(timeout_s=90) == 0
    run_id = (log_dir / "wandb_run_id").read_text().strip()
    (path,) = glob.glob(str(log_dir / "wandb" / f"offline-run-*-{run_id}" / f"run-{run_id}.wandb"))
    steps = [r["train/step"] for r in history_rows(wait_finished(path)) if "train/loss" in r]
    final = (log_dir / "drain.json").read_text()
    import json

    w = json.loads(final)["sinks"]["wandb"]
    # Every aggregated step is in W&B's history or counted as dropped, by reason; none is silent.
    assert steps == list(range(1, 2001)), (steps[:5], steps[-5:], len(steps))
    assert w["dropped_by_reason"] == {"step_jump": 1, "step_backwards": 1}, w
    assert w["dropped"] >= 2 and w["written"] + w["dropped"] == w["in"], w
    assert status["sinks"]["wandb"]["in"] > 0
