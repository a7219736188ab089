"""A W&B script that names no project and gives its config as a YAML file (W&B's format), then
updates it from another: W&B files the run under "uncategorized" and reads both files."""
import os

import wandb

with open("my_cfg.yaml", "w") as f:
    f.write("lr:\n  desc: learning rate\n  value: 0.01\nbatch:\n  value: 32\n")
with open("more.yaml", "w") as f:
    f.write("dropout:\n  value: 0.1\n")
run = wandb.init(config=os.path.abspath("my_cfg.yaml"))
print("PROJECT", run.project, run.path.split("/")[0])
run.config.update(os.path.abspath("more.yaml"))
try:
    wandb.config.update("no-such-file.yaml")
except Exception as exc:
    print("MISSING", type(exc).__name__)
run.log({"x": 1.0})
run.finish()
