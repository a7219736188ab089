"""A sweep's trials started at once on one node, as a sweep agent starts them: each trial a
process of its own that names its run (`wandb.init(id=...)`) and logs its own rows.

tests/test_wandb_parity.py runs it with the real wandb (offline) and unmodified under
`telemetry run --as-wandb`: each trial must be a run of its own, with its rows only.
"""
import os
import subprocess
import sys

import wandb

TRIALS = int(os.environ.get("TRIALS", "4"))

if len(sys.argv) > 1:                      # one trial
    i = int(sys.argv[1])
    lr = 0.1 * (i + 1)
    wandb.init(project="sweep", id=f"trial-{i}", name=f"trial-{i}", group="sweep", config={"lr": lr, "trial": i})
    for step in range(5):
        wandb.log({"loss": 10.0 * (i + 1) - step * lr, "trial": i})
    wandb.finish()
    sys.exit(0)

trials = [subprocess.Popen([sys.executable, __file__, str(i)]) for i in range(TRIALS)]
sys.exit(max(p.wait() for p in trials))
