"""TelemetryLogger with a real lightning.Trainer (optional extra; skipped without lightning)."""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest


def test_module_imports_without_lightning():
    mod = importlib.import_module("telemetry.integrations.lightning")
    assert mod.__doc__


def _tiny_module():
    """A one-layer LightningModule that logs `loss` in training and `val/loss` in validation."""
    import lightning
    import torch

    class Tiny(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def training_step(self, batch, i):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.lin(x), y)
            self.log("loss", loss)
            return loss

        def validation_step(self, batch, i):
            x, y = batch
            self.log("val/loss", torch.nn.functional.mse_loss(self.lin(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Tiny()


def test_lightning_losses_arrive(make_daemon, tmp_path):
    pytest.importorskip("lightning")
    import lightning
    import torch

    from telemetry.integrations.lightning import TelemetryLogger

    d = make_daemon(world_size=1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    trainer = lightning.Trainer(max_steps=10, logger=TelemetryLogger(endpoint=d.ingest), log_every_n_steps=1,
                                accelerator="cpu", enable_progress_bar=False, enable_checkpointing=False,
                                default_root_dir=str(tmp_path))
    trainer.fit(_tiny_module(), torch.utils.data.DataLoader(data, batch_size=8))
    d.wait_for(lambda rs: sum(1 for r in rs if "loss" in r.get("values", {})) >= 5)


def test_versions_increase_and_keep_runs_apart(make_daemon, tmp_path):
    """Like the CSV and TensorBoard loggers: each run takes the next version_N under
    save_dir/name, so the second run's checkpoints do not land among the first's."""
    pytest.importorskip("lightning")
    import lightning
    import torch

    from telemetry.integrations.lightning import TelemetryLogger

    d = make_daemon(world_size=1)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    dirs = []
    for _ in range(2):
        logger = TelemetryLogger(endpoint=d.ingest, save_dir=str(tmp_path), name="tiny")
        trainer = lightning.Trainer(max_steps=2, logger=logger, log_every_n_steps=1, accelerator="cpu",
                                    enable_progress_bar=False, enable_model_summary=False,
                                    default_root_dir=str(tmp_path))
        trainer.fit(_tiny_module(), torch.utils.data.DataLoader(data, batch_size=8))
        dirs.append(trainer.checkpoint_callback.dirpath)
    assert [Path(p).relative_to(tmp_path).parts[:2] for p in dirs] == [("tiny", "version_0"), ("tiny", "version_1")]
    assert all(list(Path(p).glob("*.ckpt")) for p in dirs)


def test_without_a_save_dir_the_version_is_the_start_and_nothing_is_made(tmp_path, monkeypatch):
    """No save_dir: Lightning puts checkpoints under the Trainer's default_root_dir, which the logger
    does not see; its version is the run's start time and pid (unique, increasing from run to
    run), and it makes no directory in the working directory."""
    pytest.importorskip("lightning")
    from telemetry.integrations.lightning import TelemetryLogger

    monkeypatch.chdir(tmp_path)
    import os
    import re

    a = TelemetryLogger(endpoint="ipc:///nonexistent")
    assert re.fullmatch(r"\d{8}-\d{6}-\d+", a.version) and a.version.endswith(f"-{os.getpid()}"), a.version
    assert a.version == a.version                        # decided once
    assert list(tmp_path.iterdir()) == []                # nothing made in the working directory
    b = TelemetryLogger(endpoint="ipc:///nonexistent", save_dir=str(tmp_path))
    assert b.version == 0 and (tmp_path / "lightning" / "version_0").is_dir()
    assert TelemetryLogger(endpoint="ipc:///nonexistent", save_dir=str(tmp_path)).version == 1


def _run_lightning(logger: str, env: dict, tmp_path) -> str:
    import os
    import subprocess
    import sys
    from pathlib import Path

    tmp_path.mkdir(parents=True, exist_ok=True)
    root = Path(__file__).resolve().parent.parent
    script = root / "tests" / "dropin_scripts" / "lightning_ddp.py"
    full = {**os.environ, **env, "LOGGER": logger, "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true",
            "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        full.pop(k, None)
    p = subprocess.run([sys.executable, str(script)], env=full, cwd=str(tmp_path), capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout + p.stderr


@pytest.mark.slow
def test_lightning_ddp_two_devices_report_their_own_ranks(make_daemon, tmp_path, tmp_path_factory):
    """Trainer(devices=2, strategy="ddp"): each process reports as the Trainer's rank, so every
    step has both ranks and no rank is taken for hung; the W&B history equals WandbLogger's."""
    pytest.importorskip("lightning")
    pytest.importorskip("wandb")
    import glob

    from test_wandb_parity import SCRIPTS, real_run, shared_run
    from wandb_offline import history_rows, wait_finished

    d = make_daemon(wandb="offline", per_rank=True)
    _run_lightning("telemetry", {"TELEMETRY_ENDPOINT": d.ingest}, tmp_path / "ours")
    per_rank = d.wait_for(lambda rs: {r.get("rank") for r in rs if "rank" in r} == {0, 1}, kind="metrics")
    hello_ranks = {r["rank"] for r in d.read_jsonl(kind="hello")}
    assert hello_ranks == {0, 1}
    assert d.stop(timeout_s=60) == 0
    steps = d.read_jsonl(kind="metrics", aggregated=True)
    assert steps and not any(r.get("missing_ranks") for r in steps)
    assert not [e for e in d.read_jsonl(kind="event") if e.get("name") == "diagnosis/rank_stopped"]
    assert {r["rank"] for r in per_rank if "rank" in r} == {0, 1}

    # WandbLogger's run, the same 6 steps on 2 devices: the reference run tests/test_wandb_parity.py
    # makes, made once for both.
    real, _, _ = shared_run(tmp_path_factory, real_run, SCRIPTS / "lightning_ddp.py", 1,
                            {"STEPS": "6", "LOGGER": "wandb"})
    (ours,) = [wait_finished(f) for f in glob.glob(str(d.log_dir / "wandb" / "offline-run-*" / "run-*.wandb"))]
    # The keys as the module logged them, against trainer/global_step, as WandbLogger logs them.
    expected = {r["trainer/global_step"]: r["loss"] for r in history_rows(real) if "loss" in r}
    got = {r["trainer/global_step"]: r["loss"] for r in history_rows(ours) if "loss" in r}
    assert expected and got.keys() == expected.keys()
    for s, v in expected.items():
        assert got[s] == pytest.approx(v, rel=1e-6), s


def test_lightning_validation_step_is_one_record(make_daemon, tmp_path):
    """val_check_interval=4: Lightning calls log_metrics with the training values and again with
    the validation values for the same step (3 and 7). Like W&B's history (one row per step), each
    step is one record holding both, sent when the next step is logged or at the end of fit."""
    pytest.importorskip("lightning")
    import lightning
    import torch

    from telemetry.integrations.lightning import TelemetryLogger

    d = make_daemon(world_size=1)
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    trainer = lightning.Trainer(max_steps=8, logger=TelemetryLogger(endpoint=d.ingest), log_every_n_steps=1,
                                val_check_interval=4, limit_val_batches=2, num_sanity_val_steps=0,
                                accelerator="cpu", devices=1, enable_progress_bar=False,
                                enable_checkpointing=False, enable_model_summary=False,
                                default_root_dir=str(tmp_path))
    trainer.fit(_tiny_module(), loader, loader)
    d.wait_for(lambda rs: any(r.get("name") == "train_end" for r in rs), kind="event")
    assert d.stop(timeout_s=60) == 0
    recs = d.read_jsonl(kind="metrics")
    by_step: dict[int, list[dict]] = {}
    for r in recs:
        by_step.setdefault(r["step"], []).append(r)
    assert sorted(by_step) == list(range(8)), sorted(by_step)
    for s, rs in by_step.items():
        assert len(rs) == 1, (s, rs)          # one record per step: no second point, no late record
        assert "rank" not in rs[0] and not rs[0].get("missing_ranks"), rs[0]
        assert "loss" in rs[0]["values"], (s, rs[0])
    for s in (3, 7):
        assert {"loss", "val/loss"} <= by_step[s][0]["values"].keys(), by_step[s][0]
    assert not any("val/loss" in by_step[s][0]["values"] for s in by_step if s not in (3, 7))
