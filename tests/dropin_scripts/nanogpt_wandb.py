"""A nanoGPT-style training loop that logs to W&B the way people write it.

tests/test_wandb_dropin.py runs this file as it is with the real wandb, and with only its
`import wandb` line changed to `import telemetry.wandb as wandb`. Two ranks (torchrun's
environment, gloo on CPU). LOG_ON=rank0: nanoGPT's `master_process` guard around init and log;
LOG_ON=all: every rank calls wandb.init and logs.
"""
import gc
import os

import torch
import torch.distributed as dist
import wandb

LOG_ON = os.environ.get("LOG_ON", "rank0")
STEPS = int(os.environ.get("STEPS", "8"))

dist.init_process_group("gloo")
rank = dist.get_rank()
master_process = rank == 0
logs = master_process or LOG_ON == "all"
torch.manual_seed(1234)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
ddp = torch.nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
data = torch.Generator().manual_seed(100 + rank)
config = {"learning_rate": 0.05, "max_iters": STEPS, "batch_size": 16, "model": {"n_embd": 16}}
if logs:
    run = wandb.init(project="dropin", name=f"nano-{LOG_ON}", config=config, group="ddp", tags=["cpu", "test"],
                     dir=os.environ["WANDB_DIR"])
    wandb.config.update({"world": dist.get_world_size()})
best_loss = float("inf")
for it in range(STEPS):
    x = torch.randn(16, 8, generator=data)
    y = x.sum(1, keepdim=True)
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
    optimizer.step()
    if logs:
        wandb.log({"train/loss": loss.detach(), "train/grad_norm": grad_norm}, commit=False)
        wandb.log({"lr": 0.05, "iter": it, "extra": {"double_iter": it * 2.0, "rank": {"plus_iter": rank + it}}})
        if it % 3 == 2:   # an eval at an explicit step: a row of its own, filled by the next iteration
            wandb.log({"val/loss": loss.detach() * 0.5}, step=run.step + 1)
        if it == 5:
            wandb.log({"stale": 1.0}, step=1)   # below the current step: W&B drops it, with a warning
    best_loss = min(best_loss, loss.item())  # note: a CPU-GPU sync point on GPU, as nanoGPT has
if logs:
    run.summary["best_loss"] = best_loss
    wandb.summary["final_iter"] = STEPS
    wandb.finish()
dist.barrier()   # every rank leaves together: gloo aborts a rank whose peer closed first
# The DDP wrapper is collected before the group is destroyed: left to the cyclic collector, torch
# 2.13 with gloo aborts a rank at exit ("terminate called without an active exception") in about
# 1 run in 10 on a busy machine, with or without telemetry (measured: 0 in 80 runs this way).
del ddp
gc.collect()
dist.destroy_process_group()
