"""`wandb.sdk.lib` under `telemetry run --as-wandb`: the names integrations import from it."""


class RunDisabled:
    """W&B's type for a run made with mode="disabled" (Lightning's WandbLogger checks runs against
    it); a disabled telemetry.wandb run is a TelemetryClient stand-in, never one of these."""
