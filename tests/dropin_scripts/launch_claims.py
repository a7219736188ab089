"""Processes of one script that make runs of different ids, as sweep drivers and retry loops do.

HOW=child_then_parent: a subprocess makes a run named by its id, then the script makes its own
(no id). HOW=retry: two subprocesses one after the other, each `wandb.init(id="same",
resume="allow")`, as a retry of a failed trial. HOW=rank_named: under torchrun, rank 0 names its
run, rank 1 makes one without an id.

tests/test_wandb_parity.py runs it with the real wandb (offline) and unmodified under
`telemetry run --as-wandb`: every run W&B makes, with its own rows only.
"""
import os
import subprocess
import sys
import time

import wandb

HOW = os.environ["HOW"]
if HOW == "rank_named":
    rank = int(os.environ.get("RANK", "0"))
    if rank == 1:
        time.sleep(3)                       # rank 0 claims first
    run = wandb.init(project="claims", name=f"rank-{rank}", **({"id": "rank0-run"} if rank == 0 else {}))
    for step in range(3):
        wandb.log({"v": 10.0 * rank + step})
    wandb.finish()
    sys.exit(0)
if len(sys.argv) > 1:                       # a subprocess
    n = int(sys.argv[1])
    name = "child" if HOW == "child_then_parent" else f"attempt-{n}"
    wandb.init(project="claims", id="child1" if HOW == "child_then_parent" else "same", name=name,
               resume="allow", config={"attempt": n})
    for step in range(3):
        wandb.log({"v": 10.0 * (n + 1) + step})
    wandb.finish()
    sys.exit(0)
for n in range(1 if HOW == "child_then_parent" else 2):
    subprocess.run([sys.executable, __file__, str(n)], check=True)
if HOW == "child_then_parent":
    wandb.init(project="claims", name="parent", config={"parent": 1})
    for step in range(3):
        wandb.log({"v": -1.0 - step})
    wandb.finish()
