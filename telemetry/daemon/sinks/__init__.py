"""Where the daemon's output records go; each sink runs on its own thread (see base.py)."""
from telemetry.daemon.sinks.base import Out, Sink, SinkRunner

__all__ = ["Out", "Sink", "SinkRunner"]
