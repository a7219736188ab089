"""SinkConfig: the knobs every sink's section has (its runner's queue bound and downsampling).

Each sink's section of the daemon config (`jsonl:`, `wandb:`, `forward:`, a `custom_sinks` entry,
...) is a subclass; the daemon builds the sink's SinkRunner from these.
"""
from __future__ import annotations

from dataclasses import dataclass

from telemetry.shared.config import ConfigError

# The most records a sink's queue may be configured for: far more than any sink drains in a
# drain_timeout_s; the queue is bounded in bytes as well (the daemon's memory budget).
MAX_QUEUED = 10_000_000

@dataclass(kw_only=True, slots=True)
class SinkConfig:
    """Loaded with the daemon config, whose loader prefixes a message with the section's key."""

    enabled: bool = True
    max_queued: int = 100_000          # records waiting for this sink before drops are counted
    every_n_steps: int = 1             # downsample: one record per N steps (window reduced)
    max_per_second: float = 0.0        # downsample: at most this many metrics records/s; 0 = off

    def __post_init__(self) -> None:
        if not 1 <= self.max_queued <= MAX_QUEUED:
            raise ConfigError(f"max_queued must be 1..{MAX_QUEUED}, got {self.max_queued}")
        if self.every_n_steps < 1:
            raise ConfigError(f"every_n_steps must be >= 1, got {self.every_n_steps}")
        if self.max_per_second < 0:
            raise ConfigError(f"max_per_second must be >= 0, got {self.max_per_second}")
