"""A script that logs the same name flat and nested: W&B keeps a flat "a/b" and a nested
{"a": {"b": v}} as two keys (its history and summary hold the path ("a", "b") beside the key
"a/b"), and so a flat "a.b.c" beside a nested a -> b -> c, in one row or in different ones, on
W&B's fast rows too, and in the summary (update, set, an edit through a nested value, a delete).
define_metric names a nested key with "." ("m.x") and the flat "m/x" as it is. Prints what the
summary reads back, for the comparison."""
import json

import wandb


def plain(v):
    """A summary value as plain JSON (W&B's nested values are views of the summary)."""
    return {k: plain(v[k]) for k in v.keys()} if hasattr(v, "keys") else v


run = wandb.init(project="flat-nested")
run.define_metric("m.x", summary="max")       # the nested key m -> x
run.define_metric("m/x", summary="min")       # the flat key "m/x"
wandb.log({"a/b": 1.0, "a": {"b": 2.0}})                                  # one row, flat first
wandb.log({"c": {"d": 3.0}})                                              # nested first ...
wandb.log({"c/d": 4.0})                                                   # ... then flat, a row of its own
wandb.log({"k": {"v": 5.0}}, commit=False)                                # one row of two calls
wandb.log({"k/v": 6.0})
wandb.log({"d": {"e": {"f": 7.0}}, "d/e/f": 8.0, "d.e.f": 9.0, "d/e": {"f": 10.0}})    # deeper
wandb.log({"x.y": 11.0, "x": {"y": 12.0}})                                # a "." in a top-level key
wandb.log({"t": {"num": 13.0, "txt": "hi"}, "t/num": 14.0, "t/txt": "flat"})          # text too
for i in range(3):                                                        # plain float rows
    wandb.log({"c/d": 20.0 + i, "p/q": 30.0 + i})
wandb.log({"p": {"q": 40.0}, "p/q": 41.0})                                # flat ones first, nested late
for i in range(3):
    wandb.log({"m/x": 50.0 - i, "m": {"x": 60.0 + i}})
run.summary.update({"s": {"t": 1}, "s/t": 2})
run.summary["u"] = {"v": {"w": 3}}
run.summary["u/v/w"] = 4
run.summary["u.v.w"] = 5
run.summary["a"]["b"] = 20.0                 # the nested one; "a/b" stays
del run.summary["c/d"]                       # the flat one; c -> d stays
keys = sorted(k for k in run.summary.keys() if not k.startswith("_"))
print(json.dumps({"keys": keys, **{k: plain(run.summary[k]) for k in keys}}, sort_keys=True))
run.finish()
