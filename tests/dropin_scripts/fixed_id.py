"""A script that names its run, as a resumable training script does: `wandb.init(id=...,
resume="allow")`, or the id in $WANDB_RUN_ID (HOW=env), then rows and a summary value.

tests/test_wandb_parity.py runs it with the real wandb (offline) and unmodified under
`telemetry run --as-wandb`: the launcher's run is this run (its rows, its id), not a second
daemon's beside an empty one.
"""
import os

import wandb

kwargs = {} if os.environ.get("HOW") == "env" else {"id": "fixed-run-1"}
run = wandb.init(project="fixed", name="named", resume="allow", config={"lr": 0.01}, **kwargs)
for step in range(5):
    wandb.log({"loss": 2.0 - 0.25 * step})
run.summary["best"] = 1.0
print("run id", run.id)
wandb.finish()
