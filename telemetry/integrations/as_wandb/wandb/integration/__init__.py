"""`wandb.integration` under `telemetry run --as-wandb` (or `import telemetry.wandb as wandb`):
W&B's own integrations (`wandb.integration.lightning.fabric`'s WandbLogger, `...keras`, ...),
run over the drop-in. Their source is the installed W&B's, found by path and executed as
submodules of this package, so their `import wandb` is the drop-in's and they log through the
sidecar as they would log through W&B; W&B itself is never imported. What one needs of W&B
beyond the drop-in raises when it is used, naming it; without W&B installed there is no source
to run, and the import says so.
"""
import os as _os


def _installed_integrations() -> list:
    try:
        from importlib.metadata import distribution

        path = str(distribution("wandb").locate_file("wandb/integration"))
    except Exception:
        return []
    return [path] if _os.path.isfile(_os.path.join(path, "__init__.py")) else []


__path__ = [_os.path.dirname(_os.path.abspath(__file__)), *_installed_integrations()]


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise ModuleNotFoundError(f"wandb.integration.{name}: telemetry.wandb runs W&B's own integrations from the "
                              f"installed wandb's source; install wandb (pip install wandb) where the script runs")
