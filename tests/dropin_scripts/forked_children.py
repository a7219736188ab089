"""Forked children that each make a run of their own (a data-generation or evaluation pool):
the parent imports wandb and forks; each child calls wandb.init, logs, finishes.

tests/test_wandb_parity.py runs it with the real wandb (offline) and unmodified under
`telemetry run --as-wandb`: one run per child, each with its own rows.
"""
import os
import sys

import wandb

CHILDREN = int(os.environ.get("CHILDREN", "3"))
pids = []
for i in range(CHILDREN):
    pid = os.fork()
    if pid == 0:
        wandb.init(project="fork", name=f"child-{i}", config={"child": i})
        for step in range(5):
            wandb.log({"x": 100 * i + step, "child": i})
        wandb.finish()
        # An interpreter's exit (its exit hooks run: W&B's waits for its service to write the
        # run); it never returns to the parent's loop.
        sys.exit(0)
    pids.append(pid)
sys.exit(max(os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids))
