"""The trainer's configuration: typed dataclasses, loaded from YAML, overridden by key=value.

    cfg = load_config("launch/configs/tiny.yaml", ["steps=20", "optim.lr=1e-4"])

Every section is a dataclass validated in `__post_init__`; loading (telemetry.shared.config, the
one loader of the project) rejects unknown keys and wrong types with a ConfigError (a ValueError)
that names the offending dotted key. Combinations that cannot
work (ZeRO with the DDP engine, flash-attention that is not installed, ...) are rejected in
`TrainConfig.__post_init__`, before any model is built.
"""
from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from telemetry.shared import config as shared_config
from telemetry.shared.numbers import is_int

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "launch" / "configs" / "tiny.yaml"
SYNTHETIC_TASKS = ("copy", "reverse", "sort", "add")


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """The model: built from `hf_config` (a Hugging Face config dict) or loaded from `path`."""
    path: str = ""                       # a local HF model directory; "" builds from hf_config
    hf_config: dict = field(default_factory=lambda: {
        "model_type": "qwen2", "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
        "tie_word_embeddings": True})
    attn_implementation: str = "sdpa"    # sdpa | eager | flash_attention_2
    gradient_checkpointing: bool = False
    compile: bool = False                # torch.compile the model
    dtype: str = "fp32"                  # fp32 | bf16 (bf16 also turns on DeepSpeed's bf16 mode); no fp16

    def __post_init__(self) -> None:
        _check(self.attn_implementation in ("sdpa", "eager", "flash_attention_2"),
               f"model.attn_implementation must be sdpa, eager or flash_attention_2, got {self.attn_implementation!r}")
        _check(self.dtype in ("fp32", "bf16"), f"model.dtype must be fp32 or bf16, got {self.dtype!r}"
               + (" (fp16 would need loss scaling; bf16 has fp32's range and needs none)" if self.dtype == "fp16" else ""))
        _check(bool(self.path) or "model_type" in self.hf_config,
               "model.hf_config needs a model_type (e.g. qwen2) when model.path is empty")


@dataclass(kw_only=True, slots=True)
class DatasetConfig:
    """One named data source. kind: a synthetic task (copy, reverse, sort, add) or jsonl."""
    name: str
    kind: str
    weight: float = 1.0
    path: str = ""           # jsonl only: one {"text": ...} object per line
    min_len: int = 4         # synthetic only: operand length range, in characters
    max_len: int = 12
    eval_fraction: float = 0.05   # jsonl only: the share of lines held out for eval (by a hash of the line)

    def __post_init__(self) -> None:
        _check(bool(self.name) and "/" not in self.name, f"dataset name {self.name!r} must be non-empty, without '/'")
        _check(self.kind in SYNTHETIC_TASKS + ("jsonl",),
               f"dataset {self.name!r}: kind must be one of {SYNTHETIC_TASKS + ('jsonl',)}, got {self.kind!r}")
        _check(self.weight > 0, f"dataset {self.name!r}: weight must be > 0, got {self.weight}")
        _check(self.kind != "jsonl" or bool(self.path), f"dataset {self.name!r}: kind jsonl needs a path")
        _check(1 <= self.min_len <= self.max_len, f"dataset {self.name!r}: need 1 <= min_len <= max_len")
        _check(0 < self.eval_fraction < 1, f"dataset {self.name!r}: eval_fraction must be in (0, 1), "
                                           f"got {self.eval_fraction}")


@dataclass(kw_only=True, slots=True)
class DataConfig:
    datasets: list[DatasetConfig] = field(default_factory=lambda: [
        DatasetConfig(name="copy", kind="copy"), DatasetConfig(name="reverse", kind="reverse"),
        DatasetConfig(name="sort", kind="sort"), DatasetConfig(name="add", kind="add", min_len=1, max_len=6)])
    seq_len: int = 128
    micro_batch_size: int = 8            # packed rows per rank per micro-step
    num_workers: int = 1                 # DataLoader worker processes; 0 loads on the training thread
    prefetch_factor: int = 4
    pin_memory: bool = True              # only takes effect with CUDA
    seed: int = 1234
    epoch_samples: int = 100_000         # documents per "epoch" for train/epoch (synthetic data is endless)

    def __post_init__(self) -> None:
        _check(self.epoch_samples >= 1, "data.epoch_samples must be >= 1")
        _check(len(self.datasets) > 0, "data.datasets must name at least one dataset")
        names = [d.name for d in self.datasets]
        _check(len(set(names)) == len(names), f"data.datasets: duplicate names in {names}")
        _check(self.seq_len >= 16, f"data.seq_len must be >= 16, got {self.seq_len}")
        _check(self.micro_batch_size >= 1, "data.micro_batch_size must be >= 1")
        _check(self.num_workers >= 0, "data.num_workers must be >= 0")
        _check(self.prefetch_factor >= 1, "data.prefetch_factor must be >= 1")


@dataclass(kw_only=True, slots=True)
class OptimConfig:
    lr: float = 3e-3
    min_lr_ratio: float = 0.1            # the schedule decays to lr * min_lr_ratio
    warmup_steps: int = 20
    schedule: str = "cosine"             # cosine | linear | constant (after warmup)
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0               # max global grad norm; 0 disables clipping

    def __post_init__(self) -> None:
        _check(self.lr > 0, f"optim.lr must be > 0, got {self.lr}")
        _check(0 <= self.min_lr_ratio <= 1, "optim.min_lr_ratio must be in [0, 1]")
        _check(self.warmup_steps >= 0, "optim.warmup_steps must be >= 0")
        _check(self.schedule in ("cosine", "linear", "constant"),
               f"optim.schedule must be cosine, linear or constant, got {self.schedule!r}")
        _check(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "optim.beta1/beta2 must be in [0, 1)")
        _check(self.grad_clip >= 0, "optim.grad_clip must be >= 0")


@dataclass(kw_only=True, slots=True)
class EngineConfig:
    backend: str = "auto"                # auto (deepspeed if importable) | deepspeed | ddp
    zero_stage: int = 2
    grad_accum_steps: int = 1
    # ZeRO-3: parameters with fewer elements stay whole on every rank (DeepSpeed's
    # stage3_param_persistence_threshold); -1: DeepSpeed's default (100,000 elements).
    zero3_persistence_threshold: int = -1

    def __post_init__(self) -> None:
        _check(self.zero3_persistence_threshold >= -1,
               f"engine.zero3_persistence_threshold must be >= -1, got {self.zero3_persistence_threshold}")
        _check(self.backend in ("auto", "deepspeed", "ddp"),
               f"engine.backend must be auto, deepspeed or ddp, got {self.backend!r}")
        _check(self.zero_stage in (0, 1, 2, 3), f"engine.zero_stage must be 0, 1, 2 or 3, got {self.zero_stage}")
        _check(self.grad_accum_steps >= 1, "engine.grad_accum_steps must be >= 1")


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    every_steps: int = 100               # 0: only the final and emergency checkpoints
    keep_last: int = 3
    resume: str = "auto"                 # auto (latest in run_dir, if any) | none | a checkpoint dir
    save_final: bool = True

    def __post_init__(self) -> None:
        _check(self.every_steps >= 0, "checkpoint.every_steps must be >= 0")
        _check(self.keep_last >= 1, "checkpoint.keep_last must be >= 1")


@dataclass(kw_only=True, slots=True)
class EvalConfig:
    every_steps: int = 50                # 0 disables evaluation
    num_batches: int = 2                 # per dataset

    def __post_init__(self) -> None:
        _check(self.every_steps >= 0, "eval.every_steps must be >= 0")
        _check(self.num_batches >= 1, "eval.num_batches must be >= 1")


FAULT_PHASES = ("forward", "backward", "optimizer", "data")


@dataclass(kw_only=True, slots=True)
class DebugConfig:
    """Fault injection, for tests and for seeing the alarms work. Everything is off by default.

    Steps count optimizer steps from 1 (the `step` of the metrics); a rank of -1 means every rank.
    """
    nan_step: int = 0          # the loss of this step is NaN on nan_rank (0: off)
    nan_rank: int = 0
    slow_s: float = 0.0        # extra seconds slept in slow_phase of every step on slow_rank (0: off)
    slow_rank: int = 0
    slow_phase: str = "forward"   # forward | backward | optimizer | data (per micro-batch; optimizer: in its update)
    slow_from_step: int = 1    # the delay starts at this step
    hang_step: int = 0         # at this step hang_rank blocks forever in hang_phase (0: off)
    hang_rank: int = 0
    hang_phase: str = "forward"
    raise_step: int = 0        # at the start of this step's optimizer phase raise_rank raises (0: off)
    raise_rank: int = 0
    slow_checkpoint_s: float = 0.0   # extra seconds slept at the start of every checkpoint save, every rank (0: off)

    def __post_init__(self) -> None:
        for key in ("nan_step", "hang_step", "raise_step"):
            _check(getattr(self, key) >= 0, f"debug.{key} must be >= 0 (0: off), got {getattr(self, key)}")
        for key in ("nan_rank", "slow_rank", "hang_rank", "raise_rank"):
            _check(getattr(self, key) >= -1, f"debug.{key} must be a rank or -1 (every rank), got {getattr(self, key)}")
        _check(self.slow_s >= 0, f"debug.slow_s must be >= 0, got {self.slow_s}")
        _check(self.slow_checkpoint_s >= 0, f"debug.slow_checkpoint_s must be >= 0, got {self.slow_checkpoint_s}")
        _check(self.slow_from_step >= 1, f"debug.slow_from_step must be >= 1, got {self.slow_from_step}")
        for key in ("slow_phase", "hang_phase"):
            _check(getattr(self, key) in FAULT_PHASES,
                   f"debug.{key} must be one of {', '.join(FAULT_PHASES)}, got {getattr(self, key)!r}")

    @property
    def enabled(self) -> bool:
        return bool(self.nan_step or self.slow_s or self.hang_step or self.raise_step or self.slow_checkpoint_s)


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    run_name: str = "tiny"
    run_dir: str = "runs/tiny"
    steps: int = 200                     # optimizer steps
    seed: int = 0
    log_every: int = 1
    telemetry_endpoint: str | None = None   # None: $TELEMETRY_ENDPOINT or the default; "": disabled
    nonfinite_action: str = "skip"       # skip | stop: a non-finite step is never applied; stop also ends the run
    debug_loss_log: str = ""             # a JSONL of per-step losses, read back off the step path (tests); <path>.saves: the saves' times
    estimate_memory: bool = True
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)

    def __post_init__(self) -> None:
        _check(self.steps >= 1, f"steps must be >= 1, got {self.steps}")
        _check(self.log_every >= 1, f"log_every must be >= 1, got {self.log_every}")
        _check(bool(self.run_dir), "run_dir must not be empty")
        if self.telemetry_endpoint:
            from telemetry.shared.endpoints import EndpointError, normalize

            try:
                normalize(self.telemetry_endpoint)
            except EndpointError as exc:
                raise ValueError(f"telemetry_endpoint: {exc}") from None
        _check(self.nonfinite_action in ("skip", "stop"),
               f"nonfinite_action must be skip or stop, got {self.nonfinite_action!r}")
        if self.engine.backend == "ddp":
            _check(self.engine.zero_stage == 0,
                   f"engine.backend=ddp cannot shard (engine.zero_stage={self.engine.zero_stage}); "
                   "use engine.backend=deepspeed or engine.zero_stage=0")
        if self.engine.backend == "deepspeed":
            _check(importlib.util.find_spec("deepspeed") is not None,
                   "engine.backend=deepspeed but deepspeed is not installed; use engine.backend=auto or ddp")
        if self.model.attn_implementation == "flash_attention_2":
            _check(importlib.util.find_spec("flash_attn") is not None,
                   "model.attn_implementation=flash_attention_2 but flash_attn is not installed; use sdpa")
        max_pos = self.model.hf_config.get("max_position_embeddings")
        if max_pos is not None:
            _check(is_int(max_pos),
                   f"model.hf_config.max_position_embeddings must be int, got {max_pos!r}")
            _check(self.data.seq_len <= max_pos,
                   f"data.seq_len={self.data.seq_len} exceeds model.hf_config.max_position_embeddings={max_pos}")
        _check(not (self.model.compile and self.model.gradient_checkpointing and self.engine.zero_stage == 3),
               "model.compile with gradient_checkpointing under ZeRO-3 is not supported; drop one of them")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# -- loading -------------------------------------------------------------------------------------
def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Load a TrainConfig from YAML (default: launch/configs/tiny.yaml) plus `dotted.key=value`
    overrides (values read as YAML). A section given only partly keeps the defaults of the keys it
    does not name. Raises ConfigError (a ValueError) naming the dotted key; the file included."""
    return shared_config.load(TrainConfig, path or DEFAULT_CONFIG, overrides)
