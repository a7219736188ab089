"""A W&B script with command-line args and its own `dir=`: the W&B run's metadata (program, code
path, args, host) is this process's, its `_runtime` this run's lifetime, and its files under
`<dir>/wandb/`, as W&B makes them.

tests/test_wandb_parity.py runs it with the real wandb (offline) and unmodified under
`telemetry run --as-wandb`; it prints when init was called and when finish returned.
"""
import argparse
import os
import time

import wandb

ap = argparse.ArgumentParser()
ap.add_argument("--lr", type=float)
ap.add_argument("--files")
args = ap.parse_args()
t0 = time.time()
run = wandb.init(project="parity", name="meta", dir=args.files, config={"lr": args.lr})
for i in range(5):
    wandb.log({"loss": 1.0 / (i + 1)})
    time.sleep(0.2)
wandb.finish()
print("LIFETIME", time.time() - t0, flush=True)
