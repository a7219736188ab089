"""TelemetryLogger with a real lightning.Trainer (optional extra; skipped without lightning)."""
from __future__ import annotations

import importlib

import pytest


def test_module_imports_without_lightning():
    mod = importlib.import_module("telemetry.integrations.lightning")
    assert mod.__doc__


def test_lightning_losses_arrive(make_daemon, tmp_path):
    pytest.importorskip("lightning")
    import lightning
    import torch

    from telemetry.integrations.lightning import TelemetryLogger

    class Tiny(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def training_step(self, batch, i):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.lin(x), y)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    d = make_daemon(world_size=1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    trainer = lightning.Trainer(max_steps=10, logger=TelemetryLogger(endpoint=d.ingest), log_every_n_steps=1,
                                accelerator="cpu", enable_progress_bar=False, enable_checkpointing=False,
                                default_root_dir=str(tmp_path))
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=8))
    d.wait_for(lambda rs: sum(1 for r in rs if "train/loss" in r.get("values", {})) >= 5)
