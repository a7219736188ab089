"""TelemetryTracker with a real Accelerator on 2 CPU processes, against Accelerate's W&B tracker."""
from __future__ import annotations

import glob
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from wandb_offline import config, history_rows, run_info, wait_finished

pytest.importorskip("accelerate")
pytest.importorskip("wandb")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "dropin_scripts" / "accelerate_ddp.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_two(env: dict[str, str], cwd: Path) -> None:
    cwd.mkdir(parents=True, exist_ok=True)
    port = str(_free_port())
    procs = []
    for rank in range(2):
        e = {**os.environ, **env, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
             "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WANDB_SILENT": "true",
             "WANDB_DIR": str(cwd), "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        procs.append(subprocess.Popen([sys.executable, str(SCRIPT)], env=e, cwd=str(cwd), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    for rank, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        assert p.returncode == 0, f"rank {rank}:\n{out[-4000:]}"


def test_tracker_is_a_general_tracker():
    from accelerate.tracking import GeneralTracker

    from telemetry.integrations.accelerate import TelemetryTracker

    t = TelemetryTracker()
    assert isinstance(t, GeneralTracker) and t.name == "telemetry" and not t.requires_logging_directory


@pytest.mark.slow
def test_accelerate_two_processes_match_accelerates_wandb_tracker(make_daemon, tmp_path, tmp_path_factory):
    from test_wandb_parity import real_run, shared_run

    d = make_daemon(wandb="offline", per_rank=True)
    _run_two({"TRACKER": "telemetry", "TELEMETRY_ENDPOINT": d.ingest}, tmp_path / "ours")
    assert d.stop(timeout_s=60) == 0
    # Accelerate's W&B tracker, the same 6 steps on 2 processes (torchrun): the reference run
    # tests/test_wandb_parity.py makes, made once for both.
    real, _, _ = shared_run(tmp_path_factory, real_run, SCRIPT, 2, {"STEPS": "6", "TRACKER": "wandb"})
    # The ranks set $WANDB_DIR (as the reference run does): the daemon's W&B run writes there, as W&B's would.
    (ours,) = [wait_finished(f) for f in glob.glob(str(tmp_path / "ours" / "wandb" / "offline-run-*" / "run-*.wandb"))]
    expected = {r["_step"]: (r["train/loss"], r["train/lr"]) for r in history_rows(real) if "train/loss" in r}
    got = {r["_step"]: (r["train/loss"], r["train/lr"]) for r in history_rows(ours) if "train/loss" in r}
    assert expected and got.keys() == expected.keys()
    for s, v in expected.items():
        assert got[s] == pytest.approx(v, rel=1e-6), s
    # Every process's own loss reached the daemon under its rank; the W&B row holds their mean.
    per_rank = {(r["rank"], r["step"]): r["values"]["rank_loss"] for r in d.read_jsonl(kind="metrics", aggregated=False)
                if "rank_loss" in r["values"]}
    assert {rank for rank, _ in per_rank} == {0, 1}
    means = {r["_step"]: r["rank_loss"] for r in history_rows(ours) if "rank_loss" in r}
    for s, m in means.items():
        assert m == pytest.approx((per_rank[(0, s)] + per_rank[(1, s)]) / 2, rel=1e-6)
    assert len(means) == len(expected)
    assert not any(r.get("missing_ranks") for r in d.read_jsonl(kind="metrics", aggregated=True))
    # log_images and log_table: the same W&B values at the same _step (a list of 2 images, a table).
    def media(path: str) -> dict:
        keep = ("_type", "count", "width", "height", "ncols", "nrows")
        return {(r["_step"], k.split("/")[0]): {f: r[f"{k.split('/')[0]}/{f}"] for f in keep
                                                 if f"{k.split('/')[0]}/{f}" in r}
                for r in history_rows(path) for k in r if k.split("/")[0] in ("samples", "preds")}

    assert media(ours) == media(real) and {k for _, k in media(real)} == {"samples", "preds"}, (media(ours), media(real))
    # The daemon kept them for the dashboard too, at the same steps (a list of 2 images, a table).
    import json

    kept = {(e["step"], e["key"]): e for e in map(json.loads, (d.log_dir / "media" / "index.jsonl").read_text().splitlines())}
    assert {(s, k) for s, k in media(ours)} == set(kept), (sorted(kept), sorted(media(ours)))
    assert all(len(e["images"]) == 2 and e["list"] for (s, k), e in kept.items() if k == "samples")
    assert all(e["type"] == "Table" and e["rows"] == media(ours)[(s, k)]["nrows"] for (s, k), e in kept.items()
               if k == "preds")
    info = run_info(ours)
    assert (info["project"], info["name"], info["group"]) == ("dropin", "accelerate-ddp", "ddp")
    assert config(ours)["lr"] == config(real)["lr"] == 0.05
