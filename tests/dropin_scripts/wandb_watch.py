"""`wandb.watch(model, log="all", log_freq=2)` in a plain loop: W&B's gradient and parameter
histograms every second step, in the rows the loop's `wandb.log` commits; a second model is
watched with its own prefix ("graph_1"). tests/test_wandb_api_parity.py runs it with the real
wandb and under `telemetry run --as-wandb`."""
import torch

import wandb

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
head = torch.nn.Linear(1, 1)
opt = torch.optim.SGD(list(model.parameters()) + list(head.parameters()), lr=0.1)
run = wandb.init(project="parity", name="watch")
wandb.watch(model, log="all", log_freq=2)
wandb.watch(head, log="gradients", log_freq=3)
for step in range(6):
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(step))
    loss = head(model(x)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    wandb.log({"loss": loss.item()})
wandb.unwatch(head)
wandb.log({"loss": 0.0})
run.finish()
