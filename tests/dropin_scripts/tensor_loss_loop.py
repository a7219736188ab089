"""A custom training loop as W&B users write it: the loss logged as a 0-dim torch tensor (no
.item(): no host-device sync), eval rows of Python floats between; then a tensor row and a float
row back to back. Both kinds of row must land in the run, each at its own step.

tests/test_wandb_parity.py runs it with the real wandb (offline) and unmodified under
`telemetry run --as-wandb`; the two runs, read back with W&B's schema, must be equal.
"""
import torch

import wandb

torch.manual_seed(0)
wandb.init(project="parity", config={"lr": 0.05})
w = torch.nn.Parameter(torch.tensor(2.0))
opt = torch.optim.SGD([w], lr=0.05)
for it in range(60):
    opt.zero_grad()
    loss = (w - 0.5) ** 2
    loss.backward()
    opt.step()
    wandb.log({"train/loss": loss.detach(), "train/w": w.detach().clone()})    # tensors
    if it % 10 == 9:
        wandb.log({"val/loss": float((w.detach() - 0.4) ** 2)})                 # a float
for i in range(40):                                                           # back to back
    wandb.log({"a/tensor": torch.tensor(float(i))})
    wandb.log({"b/float": float(i)})
wandb.finish()
