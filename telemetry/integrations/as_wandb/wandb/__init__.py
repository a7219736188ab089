"""`import wandb` under `telemetry run --as-wandb`: telemetry.wandb, W&B's API over the sidecar.

`telemetry run --as-wandb` puts this directory's parent first on the script's PYTHONPATH (never
the daemon's, whose W&B sink is the real W&B), so an unmodified `import wandb`, and the
integrations that import it (transformers' WandbCallback via report_to="wandb", Lightning's
WandbLogger, Accelerate's log_with="wandb"), log through the sidecar. What telemetry.wandb does
not support raises an error naming it (see telemetry/wandb.py). The package's submodules
(`wandb.sdk...`) hold the few names those integrations import from inside W&B.
"""
import telemetry.wandb as _impl
from telemetry.wandb import *  # noqa: F401,F403  (init, log, finish, define_metric, Image, ...)
from telemetry.wandb import __all__  # noqa: F401

# The version of the real W&B these integrations read (they check for features by version); the
# drop-in follows W&B's semantics, so it answers with the installed one's, or a recent one.
try:
    from importlib.metadata import version as _version

    __version__ = _version("wandb")
except Exception:
    __version__ = "0.19.0"


def __getattr__(name):
    # wandb.run, wandb.config, wandb.summary: the drop-in's current ones, looked up at each access.
    return getattr(_impl, name)
