"""The trainer's configuration: typed dataclasses, loaded from YAML, overridden by key=value.

    cfg = load_config("launch/configs/tiny.yaml", ["steps=20", "optim.lr=1e-4"])

Every section is a dataclass validated in `__post_init__`; loading rejects unknown keys and
wrong types with a ValueError that names the offending dotted key. Combinations that cannot
work (ZeRO with the DDP engine, flash-attention that is not installed, ...) are rejected in
`TrainConfig.__post_init__`, before any model is built.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

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
    dtype: str = "fp32"                  # fp32 | bf16 (bf16 also turns on DeepSpeed's bf16 mode)

    def __post_init__(self) -> None:
        _check(self.attn_implementation in ("sdpa", "eager", "flash_attention_2"),
               f"model.attn_implementation must be sdpa, eager or flash_attention_2, got {self.attn_implementation!r}")
        _check(self.dtype in ("fp32", "bf16"), f"model.dtype must be fp32 or bf16, got {self.dtype!r}")
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

    def __post_init__(self) -> None:
        _check(bool(self.name) and "/" not in self.name, f"dataset name {self.name!r} must be non-empty, without '/'")
        _check(self.kind in SYNTHETIC_TASKS + ("jsonl",),
               f"dataset {self.name!r}: kind must be one of {SYNTHETIC_TASKS + ('jsonl',)}, got {self.kind!r}")
        _check(self.weight > 0, f"dataset {self.name!r}: weight must be > 0, got {self.weight}")
        _check(self.kind != "jsonl" or bool(self.path), f"dataset {self.name!r}: kind jsonl needs a path")
        _check(1 <= self.min_len <= self.max_len, f"dataset {self.name!r}: need 1 <= min_len <= max_len")


@dataclass(kw_only=True, slots=True)
class DataConfig:
    datasets: list = field(default_factory=lambda: [
        {"name": "copy", "kind": "copy"}, {"name": "reverse", "kind": "reverse"},
        {"name": "sort", "kind": "sort"}, {"name": "add", "kind": "add", "min_len": 1, "max_len": 6}])
    seq_len: int = 128
    micro_batch_size: int = 8            # packed rows per rank per micro-step
    num_workers: int = 1                 # DataLoader worker processes; 0 loads on the training thread
    prefetch_factor: int = 4
    pin_memory: bool = True              # only takes effect with CUDA
    seed: int = 1234
    epoch_samples: int = 100_000         # documents per "epoch" for train/epoch (synthetic data is endless)

    def __post_init__(self) -> None:
        _check(self.epoch_samples >= 1, "data.epoch_samples must be >= 1")
        self.datasets = [d if isinstance(d, DatasetConfig) else _build(DatasetConfig, d, "data.datasets[]")
                         for d in self.datasets]
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

    def __post_init__(self) -> None:
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


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    run_name: str = "tiny"
    run_dir: str = "runs/tiny"
    steps: int = 200                     # optimizer steps
    seed: int = 0
    log_every: int = 1
    telemetry_endpoint: str | None = None   # None: $TELEMETRY_ENDPOINT or the default; "": disabled
    nonfinite_action: str = "skip"       # skip | stop (see trainer/guard.py)
    debug_loss_log: str = ""             # a JSONL of per-step losses, read back off the step path (tests)
    estimate_memory: bool = True
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        _check(self.steps >= 1, f"steps must be >= 1, got {self.steps}")
        _check(self.log_every >= 1, f"log_every must be >= 1, got {self.log_every}")
        _check(bool(self.run_dir), "run_dir must not be empty")
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
            _check(self.data.seq_len <= max_pos,
                   f"data.seq_len={self.data.seq_len} exceeds model.hf_config.max_position_embeddings={max_pos}")
        _check(not (self.model.compile and self.model.gradient_checkpointing and self.engine.zero_stage == 3),
               "model.compile with gradient_checkpointing under ZeRO-3 is not supported; drop one of them")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# -- loading -------------------------------------------------------------------------------------
def _type_ok(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is not None:
        hint = origin
    return isinstance(value, hint)


def _build(cls: type, raw: Any, prefix: str) -> Any:
    """Build dataclass `cls` from a dict, naming the dotted key of any unknown key or bad type."""
    if isinstance(raw, cls):
        return raw
    _check(isinstance(raw, dict), f"{prefix or 'config'}: expected a mapping, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in raw.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            raise ValueError(f"unknown config key {dotted!r}; known keys here: {', '.join(sorted(fields))}")
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            kwargs[key] = _build(hint, value, dotted)
            continue
        if hint is float and isinstance(value, str):
            try:  # YAML 1.1 reads "1e-4" as a string; accept what is plainly a float
                value = float(value)
            except ValueError:
                pass
        if not _type_ok(value, hint):
            raise ValueError(f"config key {dotted!r} must be {getattr(hint, '__name__', hint)}, "
                             f"got {type(value).__name__} {value!r}")
        if hint is float:
            value = float(value)
        kwargs[key] = value
    try:
        return cls(**kwargs)
    except TypeError as e:  # a missing required field
        raise ValueError(f"{prefix or 'config'}: {e}") from None


def apply_override(raw: dict, item: str) -> None:
    """Apply one `dotted.key=value` to a raw config dict; the value is parsed as YAML."""
    if "=" not in item:
        raise ValueError(f"override {item!r} is not key=value")
    key, text = item.split("=", 1)
    _check(bool(key), f"override {item!r} has an empty key")
    value = yaml.safe_load(text) if text != "" else ""
    node = raw
    parts = key.split(".")
    for p in parts[:-1]:
        child = node.setdefault(p, {})
        _check(isinstance(child, dict), f"override {key!r}: {p!r} is not a section")
        node = child
    node[parts[-1]] = value


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Load a TrainConfig from YAML (default: launch/configs/tiny.yaml) plus key=value overrides."""
    path = Path(path) if path else DEFAULT_CONFIG
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    _check(isinstance(raw, dict), f"{path}: the top level must be a mapping")
    for item in overrides:
        apply_override(raw, item)
    # A section given only partly keeps the defaults of the keys it does not name.
    return _build(TrainConfig, raw, "")


def save_config(cfg: TrainConfig, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        yaml.safe_dump(cfg.to_dict(), f, sort_keys=False)
