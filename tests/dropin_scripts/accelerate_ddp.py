"""An Accelerate training loop on 2 CPU processes (torchrun's environment, gloo).

TRACKER=wandb: Accelerate's own W&B tracker (offline, main process); TRACKER=telemetry:
TelemetryTracker. Both log through `accelerator.log`; with TelemetryTracker every rank also
logs its own loss through the tracker it holds (Accelerate calls trackers on the main process
only), which the daemon means across ranks.
"""
import os

import torch
from accelerate import Accelerator

STEPS = int(os.environ.get("STEPS", "6"))

if os.environ["TRACKER"] == "telemetry":
    from telemetry.integrations.accelerate import TelemetryTracker

    tracker = TelemetryTracker()          # project, name and group from init_trackers, as Accelerate's W&B tracker
    accelerator = Accelerator(cpu=True, log_with=[tracker])
else:
    tracker = None
    accelerator = Accelerator(cpu=True, log_with="wandb")
accelerator.init_trackers("dropin", config={"lr": 0.05, "steps": STEPS},
                          init_kwargs={"wandb": {"name": "accelerate-ddp", "group": "ddp",
                                                 "dir": os.environ["WANDB_DIR"]}})
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
model, optimizer = accelerator.prepare(model, optimizer)
data = torch.Generator().manual_seed(10 + accelerator.process_index)
for step in range(STEPS):
    x = torch.randn(8, 4, generator=data)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    optimizer.zero_grad()
    accelerator.backward(loss)
    optimizer.step()
    mean_loss = accelerator.reduce(loss.detach(), reduction="mean")
    accelerator.log({"train/loss": mean_loss, "train": {"lr": 0.05}}, step=step)
    if tracker is not None:
        tracker.log({"rank_loss": loss.detach()}, step=step)
    if step == STEPS - 1 and accelerator.is_main_process:
        # What Accelerate's W&B tracker offers beyond log: images and a table.
        t = accelerator.get_tracker("telemetry" if tracker is not None else "wandb")
        t.log_images({"samples": [torch.rand(3, 4, 5, generator=torch.Generator().manual_seed(s)) for s in (1, 2)]},
                     step=step)
        t.log_table("preds", columns=["x", "y"], data=[[1, 2.5], [2, 3.5]], step=step)
accelerator.wait_for_everyone()
accelerator.end_training()
# A clean teardown: the prepared (DDP) model collected, then the process group destroyed. A DDP
# wrapper left to the cyclic collector at exit aborts a rank with gloo in about 1 run in 10 on a
# busy machine (torch 2.13: "terminate called without an active exception"; see nanogpt_wandb.py).
import gc  # noqa: E402

import torch.distributed as dist  # noqa: E402

accelerator.free_memory()
del model
gc.collect()
if dist.is_initialized():
    dist.destroy_process_group()
