"""`wandb.sdk` under `telemetry run --as-wandb`: the names integrations import from it."""
