"""Processes of one script that make runs of different ids, as sweep drivers and retry loops do.

HOW=child_then_parent: a subprocess makes a run named by its id, then the script makes its own
(no id); HOW=noid_child_then_parent: the same, neither with an id. HOW=retry: two subprocesses
one after the other, each `wandb.init(id="same", resume="allow")`, as a retry of a failed trial;
HOW=retry_beside_driver: the script makes that run itself, finishes it, then a subprocess makes
it again while the script still runs. HOW=rank_named: under torchrun, rank 0 names its run, rank 1
makes one without an id.

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
CHILD_ID = {"child_then_parent": "child1", "noid_child_then_parent": None}.get(HOW, "same")


def attempt(n: int) -> None:
    name = "child" if HOW.endswith("child_then_parent") else f"attempt-{n}"
    wandb.init(project="claims", name=name, resume="allow", config={"attempt": n},
               **({"id": CHILD_ID} if CHILD_ID else {}))
    for step in range(3):
        wandb.log({"v": 10.0 * (n + 1) + step})
    wandb.finish()


if len(sys.argv) > 1:                       # a subprocess
    attempt(int(sys.argv[1]))
    sys.exit(0)
if HOW == "retry_beside_driver":
    attempt(0)
for n in range(1 if HOW.endswith("child_then_parent") else 2):
    if HOW != "retry_beside_driver" or n:
        subprocess.run([sys.executable, __file__, str(n)], check=True)
if HOW.endswith("child_then_parent"):
    wandb.init(project="claims", name="parent", config={"parent": 1})
    for step in range(3):
        wandb.log({"v": -1.0 - step})
    wandb.finish()
