"""`wandb.sdk.lib.config_util` under `telemetry run --as-wandb` (transformers' WandbCallback
catches its ConfigError around `wandb.config.update`)."""


class ConfigError(Exception):
    pass
