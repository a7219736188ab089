"""Rows W&B writes as they are: empty rows (`wandb.log({})`, and pending ones committed later), numpy and tensor bools (true and
false, not 1 and 0); define_metric made before the first row (a step metric) and after rows (the
W&B run's summary over the values from there on), and what it returns.
Prints what the script reads back, for the comparison."""
import json

import numpy as np
import torch
import wandb

run = wandb.init(project="define-and-bools")
wandb.define_metric("epoch_loss", step_metric="epoch")
wandb.log({"a": 1})
wandb.log({})
wandb.log({"a": 5, "epoch": 0, "epoch_loss": 0.5, "flag": True, "nb": np.bool_(False), "tb": torch.tensor(True)})
m = wandb.define_metric("a", summary="max")
# (What the script reads back of "a" from here differs: W&B's aggregates over the rows before
# the define_metric too, which the drop-in does not keep; the W&B run's own summary is the same.)
seen = {"metric": [type(m).__name__, m.name, list(m.summary)]}
wandb.log({"a": 3, "epoch": 1, "epoch_loss": 0.4})
wandb.log({"b": 2})
run.summary["b"] = 10
wandb.define_metric("b", summary="min")
wandb.log({}, commit=False)      # a pending empty row: W&B writes it when the step moves on
wandb.log({"c": 1}, step=9)
wandb.log({}, step=11)           # an empty row at an explicit step, committed at finish
print(json.dumps(seen, sort_keys=True))
run.finish()
