"""A script whose config holds what W&B's config takes and turns into JSON by its rules: ints
beyond 64 bits, bytes, an Enum, dates, a set, a slice, a dataclass, a function, NaN, numpy
values and arrays (a long double too), a tensor, a bytearray, a deque, a frozenset, an OrderedDict;
then a config update after rows. Prints what the config reads
back (the big ints apart: W&B reads the init's back as floats, a later update's as ints)."""
import collections
import dataclasses
import datetime
import enum
import json

import numpy as np
import torch
import wandb


class Color(enum.Enum):
    RED = 1


@dataclasses.dataclass
class Opt:
    name: str = "adamw"
    betas: tuple = (0.9, 0.95)


def schedule():
    return 1.0


config = {"lr": 0.1, "seed": 2**64, "neg": -2**64, "huge": 2**70, "raw": b"ab", "color": Color.RED,
          "day": datetime.date(2020, 1, 2), "at": datetime.datetime(2020, 1, 2, 3, 4, 5), "tags": {3},
          "window": slice(1, 5), "opt": Opt(), "fn": schedule, "nan": float("nan"), "one": np.array([7]),
          "small": np.arange(3), "big": np.arange(40), "npnan": np.float32("nan"), "t": torch.tensor([1.0, 2.0]),
          "t0": torch.tensor(3), "nested": {"x": b"z", "y": [Color.RED, {5}], "d": datetime.date(2021, 5, 6)},
          "ld": np.longdouble(1.5), "cld": np.clongdouble(1 + 2j), "ba": bytearray(b"ab"),
          "dq": collections.deque([1, 2]), "fs": frozenset([1]), "od": collections.OrderedDict(a=1)}
run = wandb.init(project="config-values", config=config)
for i in range(3):
    run.log({"loss": 1.0 / (i + 1)})
run.config.update({"later": 2**65, "later_raw": b"cd"})
run.log({"loss": 0.1})
print(json.dumps({k: run.config[k] for k in [*config, "later_raw"] if k not in ("seed", "neg", "huge")},
                 sort_keys=True))
run.finish()
