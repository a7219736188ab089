"""diagnosis/nonfinite suggests only what the trainer's config allows (issue 29, item 9): it said
"fp16 loss scaling", and the config refuses model.dtype=fp16. And only to our trainer's run: a
plain script's (the W&B drop-in's hello, or none) is told the remedies in general words, not
settings it does not have (optim.lr, nonfinite_action=skip)."""
from __future__ import annotations

import re

import pytest

from test_diagnosis_rules import metrics, only
from trainer.config import load_config


@pytest.mark.parametrize("values", [{"train/loss": float("nan")}, {"train/grad_norm": float("inf")}])
def test_the_nonfinite_text_suggests_only_settings_the_config_takes(values):
    d = only("nonfinite")
    # The trainer's hello (trainer/train.py): its run_name and its whole config.
    assert d.consume({"kind": "hello", "t": 1.0, "rank": 0,
                      "info": {"run_name": "r", "config": load_config(None).to_dict()}}) == []
    (ev,) = d.consume(metrics(5, values))
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


TRAINER_WORDS = re.compile(r"\b(optim\.[a-z_]+|model\.dtype|nonfinite_action)\b")


@pytest.mark.parametrize("hello", [
    None,                                                                  # no hello seen
    {"framework": "wandb", "config": {"lr": 0.1, "optim": {"lr": 0.1}, "nonfinite_action": "x"},
     "wandb": {"name": "my-script"}, "world_size": 1},                    # the W&B drop-in's
    {"run_name": "s", "config": {"lr": 0.1}},                             # a plain client's
])
def test_the_nonfinite_text_of_a_plain_script_names_no_setting_of_our_trainer(hello):
    d = only("nonfinite")
    if hello is not None:
        d.consume({"kind": "hello", "t": 1.0, "rank": 0, "info": hello})
    (ev,) = d.consume(metrics(5, {"train/loss": float("nan")}))
    msg = ev["data"]["message"]
    assert TRAINER_WORDS.findall(msg) == [], msg
    assert "learning rate" in msg and "train/loss is nan at step 5" in msg, msg
