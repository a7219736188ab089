"""A script that edits its run's summary the ways W&B allows: set, nested set, edit through a
nested value (a dict there replacing what was under it), arrays, delete (a logged key, a set key, a nested key, one that is not there), then log a
deleted key again. Prints what the summary reads back, for the comparison."""
import json

import numpy as np
import wandb

run = wandb.init(project="summary-edits", config={"lr": 1e-3})
for i in range(3):
    wandb.log({"loss": 1.0 / (i + 1), "acc": i, "m": {"a": i, "b": 2 * i}})
run.summary["best"] = 7
run.summary["nest"] = {"p": 1, "q": {"r": 2, "s": 3}}
run.summary["nest"]["q"]["r"] = 20
run.summary["nest"]["p"] = 5
run.summary["m"]["a"] = 100
del run.summary["nest"]["q"]["s"]
del run.summary["acc"]
del run.summary["best"]
del run.summary["not-there"]
run.summary["w"] = {"b": {"d": 3}, "c": 1}
run.summary["w"]["b"] = {"z": 1}          # replaces what was under w.b ("d" goes), c stays
run.summary["arr"] = np.array([1.5, 2.0])
run.summary["barr"] = np.array([True, False])
print(json.dumps({"nest": dict(run.summary["nest"]["q"]), "p": run.summary["nest"]["p"],
                  "m_a": run.summary["m"]["a"], "has_acc": "acc" in run.summary.keys(),
                  "has_best": "best" in run.summary.keys()}, sort_keys=True))
wandb.log({"acc": 9})
print(json.dumps({"acc": run.summary["acc"]}))
run.finish()
