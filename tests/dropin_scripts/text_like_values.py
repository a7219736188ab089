"""Values W&B's history keeps as something else: datetimes, dates and times as ISO text, Decimals
and Fractions as their text, Enums as their value (at the top and nested)."""
import datetime
import decimal
import enum
import fractions

import wandb


class Split(enum.Enum):
    TRAIN = 1
    EVAL = "eval"


wandb.init(project="text-like")
wandb.log({"loss": 0.5, "eval_time": datetime.datetime(2020, 1, 2, 3, 4, 5), "day": datetime.date(2021, 5, 6),
           "at": datetime.time(7, 8, 9), "lr_exact": decimal.Decimal("2.5"), "ratio": fractions.Fraction(1, 3),
           "split": Split.TRAIN, "phase": Split.EVAL, "meta": {"when": datetime.date(2021, 5, 6)}})
wandb.log({"loss": 0.25})
wandb.finish()
