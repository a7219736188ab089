"""Stand-alone commands that neither train nor attach to a run: `telemetry mfu-check` (the FLOPs
formula beside FlopCounterMode) and `telemetry keygen` (CURVE key pairs)."""
