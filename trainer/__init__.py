"""The reference trainer: a DeepSpeed / torch training loop that reports through the telemetry sidecar."""
