"""A script that logs nested dicts whose keys are not text (ints, floats, bools, None, tuples, an
Enum, numpy scalars, a date), sets and bytes, as W&B takes them, and the keys and bytes W&B
refuses. Prints what each refused call raised and what the summary reads back, for the
comparison. Sets hold numbers: a set of text iterates in an order of its process's own."""
import datetime
import enum
import json

import numpy as np
import wandb


class Split(enum.Enum):
    TRAIN = "train"


said = {}
run = wandb.init(project="keys-and-values")
wandb.log({"loss": 0.5, "acc_per_class": {0: 0.9, 1: 0.8}})
wandb.log({"by": {0.5: 1, float("nan"): 2, float("-inf"): 3, 1e16: 4, True: 5, False: 6, None: 7, (1, 2): 8,
                  Split.TRAIN: 9, np.int64(3): 10, np.float32(0.25): 11, datetime.date(2024, 1, 2): 12,
                  b"raw": 13, 7: {8: 0.5}}})
wandb.log({"seen": {3, 1, 2}, "frozen": frozenset({4}), "raw": b"ok", "buf": bytearray(b"hi"),
           "nested": {"s": {5}, "b": b"in"}})
for name, data in [("top_int", {0: 1.0}), ("bad_bytes", {"b": b"\xff\xfe", "kept": 1.0}),
                   ("object_key", {"k": {object(): 1}})]:
    try:
        wandb.log(data)
        said[name] = None
    except Exception as exc:
        said[name] = [type(exc).__name__, str(exc).split(" at 0x")[0]]
wandb.log({"loss": 0.25})
said["summary"] = {k: run.summary.get(k) for k in ("seen", "frozen", "raw", "buf")}
said["per_class"] = {k: run.summary["acc_per_class"][k] for k in run.summary["acc_per_class"].keys()}
print(json.dumps(said, sort_keys=True))
wandb.finish()
