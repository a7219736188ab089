"""Public path of the sink interface: see telemetry/daemon/sinks/base.py."""
from telemetry.daemon.sinks.base import Out, Sink

__all__ = ["Out", "Sink"]
