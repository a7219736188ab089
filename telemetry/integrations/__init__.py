"""Thin adapters that let existing trainers send to the sidecar: `hf` (transformers Trainer
callback) and `lightning` (a PyTorch Lightning logger, when lightning is installed)."""
