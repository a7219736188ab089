"""A script whose working directory holds W&B's `config-defaults.yaml` (written here): W&B's
init loads it into run.config, under the config given. Prints the config as read back and loops
over one of its defaults, for the comparison."""
import json

import wandb

with open("config-defaults.yaml", "w") as f:
    f.write("epochs:\n  desc: passes over the data\n  value: 3\nbatch_size:\n  value: 32\n"
            "opt:\n  value: {name: adam, betas: [0.9, 0.99]}\n")
run = wandb.init(project="config-defaults", config={"lr": 0.1, "batch_size": 64})
for epoch in range(wandb.config.epochs):
    wandb.log({"epoch": epoch, "bs": run.config.batch_size})
print(json.dumps(dict(run.config), sort_keys=True))
wandb.finish()
