"""Public path of the sink interface that custom sinks subclass (`telemetry.sinks.base.Sink`);
the sinks run in the daemon and live in telemetry/daemon/sinks/."""
from telemetry.daemon.sinks.base import Out, Sink

__all__ = ["Out", "Sink"]
