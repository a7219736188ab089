"""The telemetry daemon: a pipeline of small stages (receiver, aggregator, derived, sinks)."""
