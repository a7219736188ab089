"""What runs inside the training process: the client (core.py), the background sender that reads
device tensors without a sync (deferred.py) and the phase timers (spans.py).

Nothing here imports the daemon's side (sinks, pollers, wandb, pynvml): a rank pays only for
pyzmq and msgpack.
"""
from telemetry.client.core import DisabledClient, TelemetryClient

__all__ = ["TelemetryClient", "DisabledClient"]
