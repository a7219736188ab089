"""W&B's own Lightning Fabric logger (`from wandb.integration.lightning.fabric import WandbLogger`),
the way its docs use it: Fabric on CPU, hyperparameters, a few logged losses. Run unmodified with
the real wandb and under `telemetry run --as-wandb` (tests/test_wandb_api_parity.py)."""
import torch
from lightning.fabric import Fabric
from wandb.integration.lightning.fabric import WandbLogger
logger = WandbLogger(project="parity", name="fabric")
fabric = Fabric(accelerator="cpu", devices=1, loggers=[logger])
fabric.launch()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = fabric.setup(model, opt)
fabric.log_dict({"lr": 0.1, "batch_size": 8})
logger.log_hyperparams({"lr": 0.1, "layers": 1})
for step in range(4):
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step))
    loss = model(x).pow(2).mean()
    fabric.backward(loss)
    opt.step()
    opt.zero_grad()
    fabric.log("train/loss", loss.item(), step=step)
logger.finalize("success")
import wandb  # noqa: E402

wandb.finish()
