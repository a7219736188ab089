"""A script that logs what W&B takes or refuses in its own ways: numpy's str_ (text), a step
given as a bool, a list holding a Histogram, a log after finish. Prints what each raised (type
and words), for the comparison."""
import json

import numpy as np
import wandb

said = {}
run = wandb.init(project="odd-values")
run.log({"npstr": np.str_("hi"), "loss": 1.0})
for name, call in [("step_bool", lambda: run.log({"a": 1}, step=True)),
                   ("hist_in_list", lambda: run.log({"hs": [wandb.Histogram([1, 2, 3]), 5]}))]:
    try:
        call()
        said[name] = None
    except Exception as exc:
        said[name] = [type(exc).__name__, str(exc)]
run.log({"loss": 0.5})
run.finish()
try:
    run.log({"loss": 0.1})
    said["after_finish"] = None
except wandb.errors.UsageError as exc:
    said["after_finish"] = ["UsageError", str(exc).replace(run.id, "ID")]
print(json.dumps(said, sort_keys=True))
