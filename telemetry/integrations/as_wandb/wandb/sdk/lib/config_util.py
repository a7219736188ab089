"""`wandb.sdk.lib.config_util` under `telemetry run --as-wandb` (transformers' WandbCallback
catches its ConfigError around `wandb.config.update`)."""

from telemetry.integrations.wandb_objects import ConfigError  # noqa: F401  (what the drop-in raises)
