"""Rows W&B writes as they are: an empty row (`wandb.log({})`), numpy and tensor bools (true and
false, not 1 and 0); define_metric made before the first row (a step metric) and after rows (a
summary over the values from the current one on, read back in the script), and what it returns.
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
seen = {"metric": [type(m).__name__, m.name, list(m.summary)], "after_define": dict(run.summary["a"])}
wandb.log({"a": 3, "epoch": 1, "epoch_loss": 0.4})
seen["after_log"] = dict(run.summary["a"])
wandb.log({"b": 2})
run.summary["b"] = 10
wandb.define_metric("b", summary="min")
print(json.dumps(seen, sort_keys=True))
run.finish()
