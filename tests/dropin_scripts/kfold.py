"""Two runs in one process, as a k-fold loop makes them: init, log, finish, then the next fold
(REINIT unset), or both folds' runs open at once (REINIT=create_new), each logged to by its own
run object.

tests/test_wandb_parity.py runs it with the real wandb (offline) and unmodified under
`telemetry run --as-wandb`: two runs, each with its own fold's config and rows.
"""
import os

import wandb

FOLDS = 2
if os.environ.get("REINIT") == "create_new":
    runs = [wandb.init(project="kfold", name=f"fold-{k}", config={"fold": k}, reinit="create_new")
            for k in range(FOLDS)]
    for step in range(4):
        for k, run in enumerate(runs):
            run.log({"val/loss": 1.0 + k - 0.125 * step, "fold": k})
    for run in runs:
        run.finish()
else:
    for k in range(FOLDS):
        run = wandb.init(project="kfold", name=f"fold-{k}", config={"fold": k})
        for step in range(4):
            wandb.log({"val/loss": 1.0 + k - 0.125 * step, "fold": k})
        run.summary["best"] = 1.0 + k - 0.375
        wandb.finish()
