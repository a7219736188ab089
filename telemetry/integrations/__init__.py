"""Thin adapters that let existing trainers send to the sidecar, all inside the training process:
`hf` (transformers Trainer callback), `lightning` (a Lightning logger, when lightning is
installed), `accelerate` (an Accelerate tracker), and the run behind the W&B drop-in
`telemetry.wandb` (`wandb_run`, `wandb_objects`, `wandb_media`). They share `_client` (the lazily
opened TelemetryClient and the process's rank)."""
