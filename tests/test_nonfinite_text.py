"""diagnosis/nonfinite suggests only what the trainer's config allows (issue 29, item 9): it said
"fp16 loss scaling", and the config refuses model.dtype=fp16."""
from __future__ import annotations

import re

import pytest

from test_diagnosis_rules import metrics, only
from trainer.config import load_config


@pytest.mark.parametrize("values", [{"train/loss": float("nan")}, {"train/grad_norm": float("inf")}])
def test_the_nonfinite_text_suggests_only_settings_the_config_takes(values):
    (ev,) = only("nonfinite").consume(metrics(5, values))
    msg = ev["data"]["message"]
    assert "fp16" not in msg and "loss scaling" not in msg, msg
    with pytest.raises(ValueError, match="model.dtype"):      # what the old text suggested is refused
        load_config(None, ["model.dtype=fp16"])
    # Every setting it names is a key of the trainer's config, and the values it names are taken.
    keys = re.findall(r"\b((?:optim|model)\.[a-z_]+|nonfinite_action)\b", msg)
    assert {"optim.lr", "optim.warmup_steps", "optim.grad_clip", "model.dtype", "nonfinite_action"} <= set(keys), msg
    cfg = load_config(None).to_dict()
    for key in keys:
        node = cfg
        for part in key.split("."):
            assert part in node, (key, msg)
            node = node[part]
    load_config(None, ["model.dtype=fp32", "nonfinite_action=skip"])
    load_config(None, ["nonfinite_action=stop"])
