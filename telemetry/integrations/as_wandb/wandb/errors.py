"""`import wandb.errors` under `telemetry run --as-wandb`: the error classes the drop-in raises."""
from telemetry.wandb import errors as _errors

Error = _errors.Error
CommError = _errors.CommError
AuthenticationError = _errors.AuthenticationError
UsageError = _errors.UsageError
UnsupportedError = _errors.UnsupportedError
__all__ = _errors.__all__
