"""Engines: one interface over DeepSpeed (ZeRO 0-3) and plain torch / DDP.

    engine = make_engine(cfg, model, dist_info)
    loss = engine.forward_loss(batch)      # one micro-batch
    engine.backward(loss)
    grad_norm = engine.step()              # at the accumulation boundary; a 0-dim device tensor

Both engines use the same AdamW (trainer/optim.py), the same LambdaLR schedule (warmup, then
cosine / linear / constant) and return the pre-clip global grad norm as a device tensor, never a
float. A step whose gradients are not finite is never applied, on either engine: DeepSpeed's
ZeRO and bf16 optimizers drop it themselves (reading their overflow flag on the host, their
sync, not ours); where DeepSpeed or torch calls our optimizer directly (DDP, ZeRO stage 0 in
fp32) the norm's finiteness goes to the optimizer as a device flag (`apply_if`).
DeepSpeed is imported only when this engine is chosen: it costs seconds at import.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any

import torch

from trainer.config import TrainConfig
from trainer.optim import SkippingAdamW


@dataclass(slots=True)
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device


def lr_lambda(cfg: TrainConfig):
    """The LR multiplier per optimizer step: linear warmup, then the configured decay."""
    o, total = cfg.optim, cfg.steps

    def f(step: int) -> float:
        if step < o.warmup_steps:
            return (step + 1) / (o.warmup_steps + 1)
        if o.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - o.warmup_steps) / max(1, total - o.warmup_steps))
        decay = 0.5 * (1 + math.cos(math.pi * progress)) if o.schedule == "cosine" else 1 - progress
        return o.min_lr_ratio + (1 - o.min_lr_ratio) * decay
    return f


def make_optimizer(cfg: TrainConfig, model: torch.nn.Module) -> SkippingAdamW:
    o = cfg.optim
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            # Norms, biases and embeddings-as-vectors do not take weight decay.
            (no_decay if p.ndim < 2 else decay).append(p)
    groups = [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return SkippingAdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps)


def deepspeed_config(cfg: TrainConfig, world_size: int) -> dict[str, Any]:
    """The generated DeepSpeed config. Every DeepSpeed monitor and timer that syncs is off."""
    e = cfg.engine
    zero = {"stage": e.zero_stage, "overlap_comm": False, "contiguous_gradients": True}
    if e.zero3_persistence_threshold >= 0:
        zero["stage3_param_persistence_threshold"] = e.zero3_persistence_threshold
    return {
        "train_micro_batch_size_per_gpu": cfg.data.micro_batch_size,
        "gradient_accumulation_steps": e.grad_accum_steps,
        "train_batch_size": cfg.data.micro_batch_size * e.grad_accum_steps * world_size,
        "gradient_clipping": cfg.optim.grad_clip,
        "zero_optimization": zero,
        # Our AdamW (trainer/optim.py): ZeRO only calls its step() on the flat fp32 partitions.
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": cfg.model.dtype == "bf16"},
        "fp16": {"enabled": False},
        # Telemetry goes through our client: DeepSpeed's own monitors would log from the step.
        "tensorboard": {"enabled": False}, "wandb": {"enabled": False},
        "csv_monitor": {"enabled": False}, "comet": {"enabled": False},
        "flops_profiler": {"enabled": False},
        # The throughput timer synchronizes the device every step unless told otherwise.
        "timers": {"throughput": {"enabled": False, "synchronized": False}},
        "wall_clock_breakdown": False,
        "memory_breakdown": False,
        "steps_per_print": 2 ** 62,
        # No "comms_logger" key at all: DeepSpeed turns its comms logger on whenever the key is
        # present, {"enabled": false} included, and that logger synchronizes after every collective.
        # The tag is always "ds"; validating it across ranks reads a device flag on the host.
        "checkpoint": {"tag_validation": "Ignore"},
    }


def resolve_backend(cfg: TrainConfig) -> str:
    if cfg.engine.backend != "auto":
        return cfg.engine.backend
    import importlib.util
    return "deepspeed" if importlib.util.find_spec("deepspeed") is not None else "ddp"


class TorchEngine:
    """Plain torch, wrapped in DistributedDataParallel when world_size > 1."""

    name = "ddp"

    def __init__(self, cfg: TrainConfig, model: torch.nn.Module, dist_info: DistInfo) -> None:
        from trainer.model import forward_loss
        self._forward_loss = forward_loss
        self.cfg = cfg
        self.module = model.to(dist_info.device)
        self.model = model
        if dist_info.world_size > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP
            ids = [dist_info.device.index] if dist_info.device.type == "cuda" else None
            self.model = DDP(model, device_ids=ids)
        if cfg.model.compile:
            self.model = torch.compile(self.model)
        self.optimizer = make_optimizer(cfg, self.module)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg))
        self.accum = cfg.engine.grad_accum_steps
        self._micro = 0
        self._sync_ctx = contextlib.nullcontext()
        self._autocast = (torch.autocast(dist_info.device.type, dtype=torch.bfloat16)
                          if cfg.model.dtype == "bf16" else contextlib.nullcontext())

    def forward_loss(self, batch: dict):
        last = (self._micro + 1) % self.accum == 0
        # Gradients all-reduce only at the boundary micro-batch.
        sync_ctx = contextlib.nullcontext() if last or not hasattr(self.model, "no_sync") else self.model.no_sync()
        sync_ctx.__enter__()
        try:
            with self._autocast:
                out = self._forward_loss(self.model, batch)
        except BaseException:
            # Leave no_sync() now: entered, it would keep the next boundary from all-reducing.
            sync_ctx.__exit__(None, None, None)
            raise
        self._sync_ctx = sync_ctx
        return out

    def backward(self, loss: torch.Tensor) -> None:
        sync_ctx, self._sync_ctx = self._sync_ctx, contextlib.nullcontext()
        try:
            (loss / self.accum).backward()
        finally:
            sync_ctx.__exit__(None, None, None)
        self._micro += 1

    gathers_in_forward = False  # DDP: the parameters are whole on every rank

    @property
    def update_optimizer(self) -> torch.optim.Optimizer:
        """The optimizer whose step() is this rank's own update (no collective in it)."""
        return self.optimizer

    def step(self) -> torch.Tensor:
        params = [p for p in self.module.parameters() if p.grad is not None]
        max_norm = self.cfg.optim.grad_clip if self.cfg.optim.grad_clip > 0 else float("inf")
        # foreach, no error_if_nonfinite: returns the norm as a device tensor, no sync. DDP has
        # averaged the gradients, so the norm, and with it the flag, is the same on every rank.
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
        self.optimizer.apply_if = torch.isfinite(grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm.detach()

    @property
    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def state_dict(self) -> dict:
        return {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        self.module.load_state_dict(sd["model"])
        self.optimizer.load_state_dict(sd["optimizer"])
        self.scheduler.load_state_dict(sd["scheduler"])

    def train(self, mode: bool = True) -> None:
        self.model.train(mode)


def skip_inference_shm_build() -> bool:
    """On a CPU accelerator, DeepSpeed's communication builds its shared-memory all-reduce op as it
    starts (g++, about a minute the first time on a machine, cached after). Only
    inference_all_reduce uses it; training's collectives go through torch.distributed either
    way. Marking the op incompatible in the probe's dict (DeepSpeed caches that dict in its
    module, so the edit holds) skips the build. True if it was skipped; a DeepSpeed without these
    names builds as before."""
    try:
        import deepspeed.ops
        from deepspeed.accelerator import get_accelerator

        accel = get_accelerator()
        if accel.device_name() != "cpu":
            return False
        builder = accel.create_op_builder("ShareMemCommBuilder")
        if builder is None:
            return False
        deepspeed.ops.__compatible_ops__[builder.NAME] = False
        return True
    except (ImportError, AttributeError, TypeError, KeyError):
        return False


class DeepSpeedEngine:
    """DeepSpeed with ZeRO stage 0-3 and our optimizer and schedule."""

    name = "deepspeed"

    def __init__(self, cfg: TrainConfig, model: torch.nn.Module, dist_info: DistInfo) -> None:
        import deepspeed  # seconds to import: only here
        from trainer.model import forward_loss
        self._forward_loss = forward_loss
        self.cfg = cfg
        optimizer = make_optimizer(cfg, model)
        self._adamw = optimizer
        self.device = dist_info.device
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
        self.ds_config = deepspeed_config(cfg, dist_info.world_size)
        skip_inference_shm_build()
        self.model, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=self.ds_config,
            dist_init_required=False)
        self.module = self.model.module
        if cfg.model.compile:
            self.model.compile()

    def forward_loss(self, batch: dict):
        return self._forward_loss(self.model, batch)

    def backward(self, loss: torch.Tensor) -> None:
        self.model.backward(loss)  # scales by 1/grad_accum itself
        if not self.model.is_gradient_accumulation_boundary():
            self.model.step()      # DeepSpeed counts micro-steps in step(); no update here

    @property
    def gathers_in_forward(self) -> bool:
        """Whether forward gathers parameters from the other ranks (ZeRO-3: DeepSpeed's forward
        pre-hooks all-gather each module's partitioned parameters)."""
        return self.cfg.engine.zero_stage == 3

    @property
    def update_optimizer(self) -> torch.optim.Optimizer:
        """The optimizer whose step() is this rank's own update: ours, which DeepSpeed calls on
        this rank's partition under ZeRO 1-3 (once per parameter group), between the collectives
        of its step (the norm's all-reduce before; the parameters' all-gather after under ZeRO
        1-2, the next forward's gathers under ZeRO-3)."""
        return self._adamw

    def step(self) -> torch.Tensor:
        if self.model.optimizer is self._adamw:
            # ZeRO stage 0 in fp32: DeepSpeed calls our optimizer directly and keeps no norm
            # (get_global_grad_norm() is None). The gradients are all-reduced by now, so the
            # norm taken here, on device, is the global one and the same on every rank.
            grads = [p.grad for p in self.module.parameters() if p.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads, foreach=True)
            self._adamw.apply_if = torch.isfinite(norm)
            self.model.step()
            return norm.detach()
        # ZeRO 1-3 and bf16: DeepSpeed's optimizer computes the global norm (a device tensor)
        # and drops a non-finite step itself, reporting inf as its norm.
        self.model.step()
        if not self.model.was_step_applied():  # a host flag DeepSpeed has already read: no sync
            # DeepSpeed then leaves the LR schedule where it was; DDP and ZeRO 0 count every
            # step, so advance it here too and the engines keep one schedule.
            self.scheduler.step()
        norm = self.model.get_global_grad_norm()
        if isinstance(norm, torch.Tensor):
            return norm.detach()
        # inf after a dropped step (a Python float): a fill on the device, beside the loss.
        return torch.full((), float("nan") if norm is None else float(norm), device=self.device)

    @property
    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def save(self, path: str, client_state: dict) -> None:
        self.model.save_checkpoint(path, tag="ds", client_state=client_state, save_latest=False)

    def load(self, path: str) -> dict:
        _, client_state = self.model.load_checkpoint(path, tag="ds", load_optimizer_states=True,
                                                     load_lr_scheduler_states=True)
        return client_state or {}

    def train(self, mode: bool = True) -> None:
        self.model.train(mode)


def make_engine(cfg: TrainConfig, model: torch.nn.Module, dist_info: DistInfo):
    backend = resolve_backend(cfg)
    if backend == "deepspeed":
        return DeepSpeedEngine(cfg, model, dist_info)
    return TorchEngine(cfg, model, dist_info)
