"""The daemon's pipeline stages (telemetry/daemon/pipeline.py says how they fit together)."""
