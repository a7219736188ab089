"""A Lightning script on 2 CPU processes (strategy="ddp": Lightning re-runs this file for rank 1).

LOGGER=telemetry: TelemetryLogger on every rank; LOGGER=wandb: Lightning's own WandbLogger
(offline, rank 0). The loss is logged with sync_dist=True, so both see the cross-rank mean.
"""
import os

import lightning
import torch

STEPS = int(os.environ.get("STEPS", "6"))


class Tiny(lightning.LightningModule):
    def __init__(self, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.lin = torch.nn.Linear(4, 1)

    def training_step(self, batch, i):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.lin(x), y)
        self.log("loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


if __name__ == "__main__":
    if os.environ["LOGGER"] == "telemetry":
        from telemetry.integrations.lightning import TelemetryLogger

        logger = TelemetryLogger(name="lightning-ddp")
    else:
        from lightning.pytorch.loggers import WandbLogger

        logger = WandbLogger(project="dropin", name="lightning-ddp", offline=True, save_dir=os.environ["WANDB_DIR"])
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(256, 4), torch.randn(256, 1))
    trainer = lightning.Trainer(devices=2, accelerator="cpu", strategy="ddp", max_steps=STEPS, logger=logger,
                                log_every_n_steps=1, enable_progress_bar=False, enable_checkpointing=False,
                                enable_model_summary=False, default_root_dir=os.environ["WANDB_DIR"])
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=8))
    if os.environ["LOGGER"] == "wandb" and trainer.global_rank == 0:
        import wandb

        wandb.finish()   # WandbLogger leaves its run open; finished here, its file is whole
