"""The daemon's configuration: typed, validated at load, from YAML with command-line overrides.

    telemetry daemon --config daemon.yaml --log-dir runs/x/telemetry --wandb offline

YAML keys mirror the dataclasses below (nested sections by name); an unknown key, a wrong type or
an impossible value raises ConfigError naming the key.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REDUCTIONS = ("mean", "sum", "max", "min", "last")


from telemetry.configutil import ConfigError, from_dict  # noqa: F401  (part of this module's API)


@dataclass(kw_only=True, slots=True)
class SinkConfig:
    enabled: bool = True
    max_queued: int = 100_000          # records waiting for this sink before drops are counted
    every_n_steps: int = 1             # downsample: one record per N steps (window reduced)
    max_per_second: float = 0.0        # downsample: at most this many metrics records/s; 0 = off

    def __post_init__(self) -> None:
        if self.max_queued < 1:
            raise ConfigError(f"max_queued must be >= 1, got {self.max_queued}")
        if self.every_n_steps < 1:
            raise ConfigError(f"every_n_steps must be >= 1, got {self.every_n_steps}")
        if self.max_per_second < 0:
            raise ConfigError(f"max_per_second must be >= 0, got {self.max_per_second}")


@dataclass(kw_only=True, slots=True)
class JsonlConfig(SinkConfig):
    fsync_interval_s: float = 5.0
    rotate_mb: float = 0.0             # rotate metrics.jsonl past this size; 0 = never

    def __post_init__(self) -> None:
        SinkConfig.__post_init__(self)
        if not self.enabled:
            raise ConfigError("jsonl.enabled: the JSONL sink is the source of truth and cannot be disabled")
        if self.fsync_interval_s <= 0:
            raise ConfigError(f"jsonl.fsync_interval_s must be > 0, got {self.fsync_interval_s}")


@dataclass(kw_only=True, slots=True)
class WandbConfig(SinkConfig):
    mode: str = "offline"              # disabled | offline | online
    project: str = "telemetry"
    entity: str | None = None
    finish_timeout_s: float = 30.0
    max_queued: int = 20_000

    def __post_init__(self) -> None:
        SinkConfig.__post_init__(self)
        if self.mode not in ("disabled", "offline", "online"):
            raise ConfigError(f"wandb.mode {self.mode!r}: expected disabled, offline or online")


@dataclass(kw_only=True, slots=True)
class PubConfig(SinkConfig):
    pass


@dataclass(kw_only=True, slots=True)
class TensorBoardConfig(SinkConfig):
    enabled: bool = False


@dataclass(kw_only=True, slots=True)
class CustomSinkConfig(SinkConfig):
    """A sink of your own: `class` is "package.module:ClassName", a telemetry.sinks.base.Sink
    subclass built as ClassName(log_dir=..., **options) on the daemon's thread."""
    cls: str = ""
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        SinkConfig.__post_init__(self)
        mod, _, name = self.cls.partition(":")
        if not mod or not name.isidentifier():
            raise ConfigError(f"class {self.cls!r}: expected 'package.module:ClassName'")

    @classmethod
    def from_mapping(cls, item: Any, index: int) -> "CustomSinkConfig":
        if not isinstance(item, dict):
            raise ConfigError(f"custom_sinks[{index}]: expected a mapping")
        data = dict(item)
        data["cls"] = data.pop("class", "")
        try:
            return from_dict(cls, data, prefix=f"custom_sinks[{index}].")
        except TypeError as exc:
            raise ConfigError(f"custom_sinks[{index}]: {exc}") from None


@dataclass(kw_only=True, slots=True)
class AggregatorConfig:
    step_timeout_s: float = 10.0       # emit a step without the ranks that have not reported by then
    per_rank: bool = False             # also write each rank's own record (with "rank")
    world_size: int = 0                # ranks to wait for; 0 = from the hello records / ranks seen
    first_rank: int = 0                # the first of them (a node daemon: node_rank x ranks per node)
    reductions: dict[str, str] = field(default_factory=dict)   # metric name or prefix* -> reduction

    def __post_init__(self) -> None:
        if self.step_timeout_s <= 0:
            raise ConfigError(f"aggregator.step_timeout_s must be > 0, got {self.step_timeout_s}")
        for k, v in self.reductions.items():
            if v not in REDUCTIONS:
                raise ConfigError(f"aggregator.reductions[{k!r}] = {v!r}: expected one of {', '.join(REDUCTIONS)}")


@dataclass(kw_only=True, slots=True)
class MfuConfig:
    peak_flops: float = 0.0            # per-device peak override (FLOP/s); 0 = from the device name
    dtype: str = ""                    # override the dtype the ranks report (bf16, fp16, tf32, fp32)
    halve_causal: bool = False         # count half the attention FLOPs of causal models; off = PaLM/Megatron


@dataclass(kw_only=True, slots=True)
class DaemonConfig:
    ingest: str | None = None          # endpoints; None = $TELEMETRY_* or the private ipc default
    pub: str | None = None
    control: str | None = None
    log_dir: str = "telemetry"
    run_name: str = ""
    daemon_record_interval_s: float = 10.0
    drain_timeout_s: float = 12.0      # shutdown deadline; W&B offline start+finish alone takes seconds
    rcvhwm: int = 1_000_000            # records libzmq may queue for us before senders see backpressure
    jsonl: JsonlConfig = field(default_factory=JsonlConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    pub_sink: PubConfig = field(default_factory=PubConfig)
    tensorboard: TensorBoardConfig = field(default_factory=TensorBoardConfig)
    aggregator: AggregatorConfig = field(default_factory=AggregatorConfig)
    mfu: MfuConfig = field(default_factory=MfuConfig)
    pollers: dict[str, Any] = field(default_factory=dict)     # telemetry.pollers.config.PollersConfig
    diagnosis: dict[str, Any] = field(default_factory=dict)   # telemetry.diagnosis DiagnosisConfig
    remote_ingest: str | None = None   # a second ingest listener for node daemons (TCP, CURVE beyond loopback)
    security: dict[str, Any] = field(default_factory=dict)    # telemetry.security.curve.SecurityConfig
    forward: dict[str, Any] = field(default_factory=dict)     # telemetry.sinks.forward.ForwardConfig
    custom_sinks: list[Any] = field(default_factory=list)     # [{class: "mod:Cls", options: {...}, max_queued: N}]

    def __post_init__(self) -> None:
        # The pollers and diagnosis sections have their own typed configs: validate them here,
        # at load, so a typo fails with the key's name before any socket is bound.
        from telemetry.diagnosis.config import DiagnosisConfig
        from telemetry.pollers.config import PollersConfig

        for key, cls in (("pollers", PollersConfig), ("diagnosis", DiagnosisConfig)):
            try:
                cls.from_dict(getattr(self, key))
            except (ValueError, TypeError) as exc:
                raise ConfigError(f"{key}: {exc}") from None
        if not self.run_name:
            self.run_name = Path(self.log_dir).resolve().parent.name or "run"
        if self.daemon_record_interval_s <= 0:
            raise ConfigError("daemon_record_interval_s must be > 0")
        if self.drain_timeout_s <= 0:
            raise ConfigError("drain_timeout_s must be > 0")
        if not isinstance(self.custom_sinks, list):
            raise ConfigError("custom_sinks: expected a list")
        self.custom_sinks = [c if isinstance(c, CustomSinkConfig) else CustomSinkConfig.from_mapping(c, i)
                             for i, c in enumerate(self.custom_sinks)]
        # Checked here so a bad security/forward section fails at load with the key named.
        if self.security:
            from telemetry.security.curve import SecurityConfig

            try:
                SecurityConfig.from_dict(self.security)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        if self.forward:
            from telemetry.sinks.forward import ForwardConfig

            try:
                fwd = ForwardConfig.from_dict(self.forward)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            # A node daemon's --world-size is its ranks per node; they start at node_rank x that.
            if self.aggregator.world_size and not self.aggregator.first_rank:
                self.aggregator.first_rank = fwd.node_rank * self.aggregator.world_size


def load(path: str | os.PathLike | None, overrides: dict[str, Any]) -> DaemonConfig:
    """YAML file (optional) then overrides ({"wandb.mode": "offline", "log_dir": ...})."""
    data: dict[str, Any] = {}
    if path:
        import yaml

        try:
            with open(path) as f:
                loaded = yaml.safe_load(f) or {}
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level")
        data = loaded
    for dotted, value in overrides.items():
        if value is None:
            continue
        node = data
        parts = dotted.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return from_dict(DaemonConfig, data)
