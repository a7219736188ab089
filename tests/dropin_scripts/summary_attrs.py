"""A script that reads, sets and deletes `run.summary` keys as attributes, as W&B's summary
allows (nested too), and sets one through `wandb.summary`. Prints what each read gave (or the
error it raised), for the comparison."""
import json

import wandb

said = {}
run = wandb.init(project="summary-attrs")
wandb.log({"acc": 0.5, "eval": {"loss": 2.5}, "gone": 1.5})


def read(name, get):
    try:
        said[name] = get()
    except Exception as exc:      # what a script catches: a KeyError, as W&B raises
        said[name] = ["KeyError" if isinstance(exc, KeyError) else type(exc).__name__, str(exc)]


read("acc", lambda: run.summary.acc)
read("eval_loss", lambda: run.summary.eval.loss)
run.summary.best_acc = 0.75
wandb.summary.note = "ok"
run.summary.eval.loss = 1.25
run.summary.eval.extra = 0.5
read("best_acc", lambda: run.summary["best_acc"])
read("eval", lambda: {k: run.summary["eval"][k] for k in run.summary["eval"].keys()})
read("missing", lambda: run.summary.nope)
del run.summary.gone
read("gone", lambda: run.summary["gone"])
print(json.dumps(said, sort_keys=True))
wandb.finish()
