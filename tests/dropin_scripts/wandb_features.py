"""A single-process script that uses what W&B scripts use beyond numbers: text values, prints,
define_metric with its own step metric, commit=False, an explicit step=, nested dicts, config
updates, the summary, and the run's id, name and path.

tests/test_wandb_parity.py runs it with the real wandb (offline) and unmodified under
`telemetry run --as-wandb`; the two runs, read back with W&B's schema, must be equal.
"""
import os
import sys

import wandb

run = wandb.init(project="parity", config={"lr": 0.1, "model": {"layers": 2}}, tags=["t1"], notes="a note")
wandb.config.update({"batch": 8})
wandb.define_metric("epoch")
wandb.define_metric("val/*", step_metric="epoch", summary="min")
print(f"run path {run.path.split('/')[-2]} name {run.name}")
if os.environ.get("ID_FILE"):
    with open(os.environ["ID_FILE"], "w") as f:
        f.write(f"{run.id} {run.path} {run.url}")
for i in range(6):
    wandb.log({"loss": 1.0 / (i + 1), "opt": {"lr": 0.1 * 0.5 ** i}}, commit=False)
    wandb.log({"phase": "warmup" if i < 2 else "train"})
    if i % 3 == 2:
        wandb.log({"val/loss": 2.0 / (i + 1), "epoch": i // 3})
        print(f"epoch {i // 3} done", flush=True)
wandb.log({"late": 1}, step=20)
print("a warning line", file=sys.stderr)
run.summary["best_loss"] = 1.0 / 6
run.summary.update({"final": {"step": 20}})
wandb.finish()
