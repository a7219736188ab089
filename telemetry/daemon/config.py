"""The daemon's configuration: typed, validated at load, from YAML with command-line overrides.

    telemetry daemon --config daemon.yaml --log-dir runs/x/telemetry --wandb offline

YAML keys mirror the dataclasses below (nested sections by name, each section its own typed
dataclass: the pollers', the diagnosis rules', security's and forwarding's live beside the code
that uses them); an unknown key, a wrong type or an impossible value raises ConfigError naming
the dotted key (telemetry.shared.config does the loading for every config of the project).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from telemetry.daemon.diagnosis.config import DiagnosisConfig
from telemetry.daemon.peaks import normalize_dtype
from telemetry.daemon.pollers.config import MIN_INTERVAL_S, PollersConfig
from telemetry.daemon.sinks.config import SinkConfig
from telemetry.daemon.sinks.forward import ForwardConfig
from telemetry.shared import config as shared_config
from telemetry.shared.config import ConfigError  # noqa: F401  (part of this module's API)
from telemetry.shared.files import FilesConfig
from telemetry.shared.security.curve import SecurityConfig



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
        if self.rotate_mb < 0:
            raise ConfigError(f"jsonl.rotate_mb must be >= 0 (0 = never rotate), got {self.rotate_mb}")


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
        if self.finish_timeout_s <= 0:
            raise ConfigError(f"wandb.finish_timeout_s must be > 0, got {self.finish_timeout_s}")
        from telemetry.shared.config import WANDB_PROJECT_FORBIDDEN, wandb_name_problem

        # W&B refuses these only at its init, in the sink's thread: the run went on without W&B.
        for key in ("project", "entity"):
            value = getattr(self, key)
            why = None if value is None else wandb_name_problem(value, f"wandb.{key}", WANDB_PROJECT_FORBIDDEN)
            if why:
                raise ConfigError(why)


@dataclass(kw_only=True, slots=True)
class PubConfig(SinkConfig):
    pass


@dataclass(kw_only=True, slots=True)
class TensorBoardConfig(SinkConfig):
    enabled: bool = False


@dataclass(kw_only=True, slots=True)
class OtlpConfig(SinkConfig):
    """OpenTelemetry export over OTLP/HTTP (telemetry/daemon/sinks/otlp.py); off by default."""
    enabled: bool = False
    endpoint: str = "http://127.0.0.1:4318/v1/metrics"   # a collector's OTLP/HTTP receiver
    export_interval_s: float = 10.0
    timeout_s: float = 10.0
    headers: dict[str, str] = field(default_factory=dict)
    job: str = ""                                         # the resource's service.namespace (default: the run name)

    def __post_init__(self) -> None:
        SinkConfig.__post_init__(self)
        if not self.endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"otlp.endpoint {self.endpoint!r}: expected an http:// or https:// URL")
        from urllib.parse import urlsplit

        try:
            url = urlsplit(self.endpoint)
            port = url.port                    # ValueError beyond 0..65535 or not a number
        except ValueError as exc:
            raise ConfigError(f"otlp.endpoint {self.endpoint!r}: {exc}") from None
        if not url.hostname:
            raise ConfigError(f"otlp.endpoint {self.endpoint!r}: no host")
        if port == 0:
            raise ConfigError(f"otlp.endpoint {self.endpoint!r}: port 0 is no port to send to")
        for name in ("export_interval_s", "timeout_s"):
            v = getattr(self, name)
            if not 0 < v < 86400:
                raise ConfigError(f"otlp.{name} must be > 0 (seconds), got {v!r}")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.headers.items()):
            raise ConfigError("otlp.headers: a map of header names to strings")


@dataclass(kw_only=True, slots=True)
class MediaConfig:
    """The run's media (W&B images, histograms, tables) kept in <log_dir>/media for the dashboard
    (telemetry/daemon/media_keeper.py)."""
    keep: bool = True
    max_mb: float = 1024.0             # past it a value is not kept (counted); W&B still gets it

    def __post_init__(self) -> None:
        if not 0 <= self.max_mb <= 1 << 30:     # (NaN fails this too)
            raise ConfigError(f"media.max_mb must be 0..{1 << 30}, got {self.max_mb!r}")


@dataclass(kw_only=True, slots=True)
class CustomSinkConfig(SinkConfig):
    """A sink of your own: `class` is "package.module:ClassName", a telemetry.daemon.sinks.base.Sink
    subclass built as ClassName(log_dir=..., **options) on the daemon's thread."""
    cls: str = field(default="", metadata={"key": "class"})   # `class` in YAML: a Python keyword
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        SinkConfig.__post_init__(self)
        mod, _, name = self.cls.partition(":")
        if not mod or not name.isidentifier():
            raise ConfigError(f"class {self.cls!r}: expected 'package.module:ClassName'")


@dataclass(kw_only=True, slots=True)
class AggregatorConfig:
    step_timeout_s: float = 10.0       # emit a step without the ranks that have not reported by then
    per_rank: bool = False             # also write each rank's own record (with "rank")
    world_size: int = 0                # ranks to wait for; 0 = from the hello records / ranks seen
    first_rank: int = 0                # the first of them (a node daemon: node_rank x ranks per node)
    reductions: dict[str, str] = field(default_factory=dict)   # metric name or prefix* -> reduction
    # Over a sink's downsampling window (every_n_steps): kept apart from `reductions`, which is
    # across ranks (tokens/s of 8 ranks add up; tokens/s over 4 steps does not).
    window_reductions: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.step_timeout_s <= 0:
            raise ConfigError(f"aggregator.step_timeout_s must be > 0, got {self.step_timeout_s}")
        from telemetry.daemon.aggregator import MAX_WORLD_SIZE
        from telemetry.daemon.reductions import parse   # the one spelling of a reduction

        if not 0 <= self.world_size <= MAX_WORLD_SIZE:
            raise ConfigError(f"aggregator.world_size (--world-size) must be 0..{MAX_WORLD_SIZE} "
                              f"(0: from the hellos), got {self.world_size}")
        if not 0 <= self.first_rank <= MAX_WORLD_SIZE:
            raise ConfigError(f"aggregator.first_rank must be 0..{MAX_WORLD_SIZE}, got {self.first_rank}")

        for key, rules in (("reductions", self.reductions), ("window_reductions", self.window_reductions)):
            for k, v in rules.items():
                if not isinstance(k, str) or not k.strip():
                    raise ConfigError(f"aggregator.{key}[{k!r}]: a metric name or prefix* is needed")
                try:
                    parse(v)
                except ValueError as exc:
                    raise ConfigError(f"aggregator.{key}[{k!r}] = {exc}") from None


@dataclass(kw_only=True, slots=True)
class MfuConfig:
    peak_flops: float = 0.0            # per-device peak override (FLOP/s); 0 = from the device name
    dtype: str = ""                    # override the dtype the ranks report (bf16, fp16, tf32, fp32)
    halve_causal: bool = False         # count half the attention FLOPs of causal models; off = PaLM/Megatron

    def __post_init__(self) -> None:
        if self.peak_flops < 0:
            raise ConfigError(f"mfu.peak_flops must be >= 0 (0 = from the device name), got {self.peak_flops}")
        if self.dtype and normalize_dtype(self.dtype) is None:
            raise ConfigError(f"mfu.dtype {self.dtype!r}: expected bf16, fp16, tf32 or fp32 (or empty)")


# The most ingest connections one daemon may be configured for (each costs a descriptor).
MAX_CONNECTIONS = 65_536
# A head's connections beyond two per node: its own node's ranks, `telemetry` tools, a spare.
HEAD_OWN_CONNECTIONS = 64
# The least queue a connection gets, whatever rcvhwm // max_connections says.
MIN_CONNECTION_HWM = 100
# libzmq's high-water marks are C ints.
MAX_RCVHWM = 2**31 - 1


@dataclass(kw_only=True, slots=True)
class DaemonConfig:
    ingest: str | None = None          # endpoints; None = $TELEMETRY_* or the private ipc default
    pub: str | None = None
    control: str | None = None
    log_dir: str = "telemetry"
    run_name: str = ""
    daemon_record_interval_s: float = 10.0
    drain_timeout_s: float = 12.0      # shutdown deadline; W&B offline start+finish alone takes seconds
    # Records libzmq may queue for us in all, before senders see backpressure: each connection
    # gets rcvhwm // max_connections (at least MIN_CONNECTION_HWM), so the total stays bounded.
    # The default gives each 10,240, more than a client's own queue (sndhwm 10,000): over ipc,
    # libzmq discards what a rank that exits still has in the kernel while the daemon's queue for
    # it is full (counted in records_lost_in_transit), so a queue that a rank's whole backlog
    # fits keeps that to a daemon that is really behind.
    rcvhwm: int = 10 * 1024 * 1024
    max_connections: int = 1024        # ingest connections at once (a rank has 1-2, +1 at close); beyond: refused
                                       # (a head: at least 2 x its nodes + HEAD_OWN_CONNECTIONS)
    # The daemon's memory budget in MB: the whole process's RSS, its own baseline included; what
    # the baseline leaves is split across its buffers (telemetry/daemon/memory.py); what does not
    # fit is shed and counted (status: memory.shed; telemetry/memory/records_shed). A budget below what the
    # process needs is refused at start, naming the smallest that works here.
    memory_mb: float = 256.0
    jsonl: JsonlConfig = field(default_factory=JsonlConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    pub_sink: PubConfig = field(default_factory=PubConfig)
    tensorboard: TensorBoardConfig = field(default_factory=TensorBoardConfig)
    otlp: OtlpConfig = field(default_factory=OtlpConfig)
    media: MediaConfig = field(default_factory=MediaConfig)
    aggregator: AggregatorConfig = field(default_factory=AggregatorConfig)
    mfu: MfuConfig = field(default_factory=MfuConfig)
    pollers: PollersConfig = field(default_factory=PollersConfig)
    diagnosis: DiagnosisConfig = field(default_factory=DiagnosisConfig)
    remote_ingest: str | None = None   # a second ingest listener for node daemons (TCP, CURVE beyond loopback)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    forward: ForwardConfig | None = None   # a node daemon's link to the head; None on a head or single node
    custom_sinks: list[CustomSinkConfig] = field(default_factory=list)   # [{class: "mod:Cls", options: {...}}]
    files: FilesConfig = field(default_factory=FilesConfig)   # run files 0600/0700; group_readable: 0640/0750
    # A user's own metrics, declared as the catalogue declares the built-in ones (telemetry/shared/
    # catalogue.py): name or pattern -> {unit, kind, group, doc, across_ranks, over_window}.
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.run_name:
            self.run_name = Path(self.log_dir).resolve().parent.name or "run"
        # The declared metrics' rules join the overrides (an explicit aggregator.reductions or
        # window_reductions entry for the same name wins); a declaration that is not one: the
        # error names it.
        for m in self.declared_metrics():
            self.aggregator.reductions.setdefault(m.name, m.across_ranks)
            self.aggregator.window_reductions.setdefault(m.name, m.over_window)
        if self.daemon_record_interval_s < MIN_INTERVAL_S:
            # As the pollers' least: a smaller one fills metrics.jsonl with the daemon's own records.
            raise ConfigError(f"daemon_record_interval_s must be at least {MIN_INTERVAL_S} s, got "
                              f"{self.daemon_record_interval_s}")
        if self.drain_timeout_s <= 0:
            raise ConfigError(f"drain_timeout_s must be > 0, got {self.drain_timeout_s}")
        # A bound, always: 0 would be libzmq's "unlimited", a daemon that grows until it is killed.
        if not 1 <= self.rcvhwm <= MAX_RCVHWM:
            raise ConfigError(f"rcvhwm must be 1..{MAX_RCVHWM}, got {self.rcvhwm}")
        if not 1 <= self.max_connections <= MAX_CONNECTIONS:
            raise ConfigError(f"max_connections must be 1..{MAX_CONNECTIONS}, got {self.max_connections}")
        # A head (remote_ingest) that knows its nodes (aggregator.world_size: the number of nodes)
        # holds a connection per node, two while one reconnects, and its own: never fewer.
        if self.remote_ingest and self.aggregator.world_size:
            need = min(MAX_CONNECTIONS, 2 * self.aggregator.world_size + HEAD_OWN_CONNECTIONS)
            self.max_connections = max(self.max_connections, need)
        from telemetry.daemon.memory import MAX_MEMORY_MB

        # The least that works is measured at start (cli.py: memory.smallest_mb); here, a number.
        if not 0 < self.memory_mb <= MAX_MEMORY_MB:   # (NaN fails this too)
            raise ConfigError(f"memory_mb must be > 0 and <= {MAX_MEMORY_MB}, got {self.memory_mb}")
        self._check_endpoints()
        # A node daemon's --world-size is its ranks per node; they start at node_rank x that.
        if self.forward is not None and self.aggregator.world_size and not self.aggregator.first_rank:
            self.aggregator.first_rank = self.forward.node_rank * self.aggregator.world_size
            from protocol import MAX_RANK

            if self.aggregator.first_rank + self.aggregator.world_size - 1 > MAX_RANK:
                raise ConfigError(f"--node-rank {self.forward.node_rank} x --world-size {self.aggregator.world_size}: "
                                  f"its ranks would go beyond {MAX_RANK}, the largest rank a record may carry")

    def _check_endpoints(self) -> None:
        """Each given endpoint is well formed and names its own socket (ingest and pub on one
        port would fail at the second bind, after the first socket is up)."""
        from telemetry.shared.endpoints import normalize

        seen: dict[str, str] = {}
        for name in ("ingest", "pub", "control", "remote_ingest"):
            ep = getattr(self, name)
            if not ep:
                continue
            ep = normalize(ep)   # an EndpointError is a ValueError: the loader names the key
            if ep in seen and not ep.endswith(":0"):   # port 0: the OS picks one per socket
                raise ConfigError(f"{ep} is given for two sockets ({seen[ep]} and {name}); each needs its own endpoint")
            seen[ep] = name

    def head_links(self) -> int:
        """The node links a head holds (one a node: its aggregator.world_size); 0 for any other
        daemon, or a head that was not told its nodes."""
        return self.aggregator.world_size if self.remote_ingest else 0

    def connection_hwm(self) -> int:
        """Each ingest connection's queue: the rcvhwm budget shared by max_connections."""
        return max(MIN_CONNECTION_HWM, self.rcvhwm // self.max_connections)


    def declared_metrics(self) -> tuple:
        """The `metrics:` declarations (catalogue.Metric), their reductions checked."""
        from telemetry.daemon.reductions import parse
        from telemetry.shared.catalogue import declared

        try:
            out = declared(self.metrics)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        for m in out:
            for key in ("across_ranks", "over_window"):
                try:
                    parse(getattr(m, key))
                except ValueError as exc:
                    raise ConfigError(f"metrics[{m.name!r}].{key} = {exc}") from None
        return out


def load(path: str | os.PathLike | None, overrides: dict[str, Any]) -> DaemonConfig:
    """YAML file (optional) then flag overrides ({"wandb.mode": "offline", "log_dir": ...}; None = not given).

    Raises ConfigError (naming the dotted key) for anything unusable, the file included.
    """
    return shared_config.load(DaemonConfig, path, overrides)
