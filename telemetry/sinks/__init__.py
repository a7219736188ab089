"""Where the daemon's output records go; each sink runs on its own thread (see base.py)."""
from telemetry.sinks.base import NullSink, Out, Sink, SinkRunner

__all__ = ["NullSink", "Out", "Sink", "SinkRunner"]
