"""`wandb.wandb_run` under `telemetry run --as-wandb`: the run type integrations check runs against
(Lightning's WandbLogger: isinstance(experiment, Run))."""
from telemetry.integrations.wandb_run import Run  # noqa: F401
