"""A run that ends badly, as HOW says: "crash" (an uncaught exception), "exit3" (sys.exit(3)),
"finish3" (wandb.finish(exit_code=3)), "sigterm" (it says "logged" and waits to be killed by
SIGTERM, as a scheduler's preemption does).

tests/test_wandb_parity.py runs it with the real wandb (offline) and unmodified under
`telemetry run --as-wandb`: the run records the exit code W&B records.
"""
import os
import signal
import sys

import wandb

wandb.init(project="exits", name="ends-" + os.environ["HOW"], config={"how": os.environ["HOW"]})
for step in range(3):
    wandb.log({"loss": 1.0 / (step + 1)})
how = os.environ["HOW"]
if how == "crash":
    raise RuntimeError("boom")
if how == "exit3":
    sys.exit(3)
if how == "finish3":
    wandb.finish(exit_code=3)
if how == "sigterm":
    print("logged", flush=True)
    signal.pause()
