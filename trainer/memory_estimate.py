"""A pre-flight estimate of training memory per rank: params, grads, optimizer state, activations.

Rules of thumb, stated so they can be checked:
- weights in the compute dtype (bf16: 2 B, fp32: 4 B); bf16 training also keeps an fp32 master
  copy (4 B) in the optimizer; AdamW keeps two fp32 moments (8 B);
- gradients in the compute dtype;
- ZeRO-1 shards optimizer state (and master weights) across ranks, ZeRO-2 also gradients,
  ZeRO-3 also weights;
- activations per layer and micro-batch ~ S*B*H*(34 + 5*a*S/H) bytes in 16-bit without
  recomputation (Korthikanti et al., 2022, "Reducing Activation Recomputation"), doubled for
  fp32; with gradient checkpointing only each layer's input (2*S*B*H bytes) is kept, plus one
  layer's full set during its recomputation; the logits ([B,S,V] plus an fp32 copy for the loss).
"""
from __future__ import annotations

from dataclasses import dataclass

GB = 1024 ** 3


@dataclass(slots=True)
class MemoryEstimate:
    params_gb: float
    grads_gb: float
    optimizer_gb: float
    activations_gb: float

    @property
    def total_gb(self) -> float:
        return self.params_gb + self.grads_gb + self.optimizer_gb + self.activations_gb

    def table(self) -> str:
        rows = [("params", self.params_gb), ("grads", self.grads_gb), ("optimizer", self.optimizer_gb),
                ("activations", self.activations_gb), ("total", self.total_gb)]
        return "\n".join(f"  {name:<12}{v:10.3f} GB" for name, v in rows)


def estimate(*, num_params: int, hidden_size: int, num_layers: int, num_heads: int, vocab_size: int,
             seq_len: int, micro_batch_size: int, dtype: str, zero_stage: int, world_size: int,
             gradient_checkpointing: bool) -> MemoryEstimate:
    """Per-rank bytes, in GB, of one training step at peak."""
    w = 2 if dtype == "bf16" else 4
    shard = max(1, world_size)
    params = num_params * w / (shard if zero_stage >= 3 else 1)
    grads = num_params * w / (shard if zero_stage >= 2 else 1)
    opt_bytes = 8 + (4 if dtype == "bf16" else 0)
    optimizer = num_params * opt_bytes / (shard if zero_stage >= 1 else 1)
    S, B, H, a, L = seq_len, micro_batch_size, hidden_size, num_heads, num_layers
    per_layer = S * B * H * (34 + 5 * a * S / H) * (w / 2)
    acts = (L * 2 * S * B * H * (w / 2) + per_layer) if gradient_checkpointing else L * per_layer
    acts += B * S * vocab_size * (w + 4)
    return MemoryEstimate(params / GB, grads / GB, optimizer / GB, acts / GB)


def device_memory_gb(device) -> float | None:
    """The memory one rank can use: the GPU's, or the host's physical memory on CPU; None if unknown."""
    import os

    import torch
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory / GB
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GB
    except (ValueError, OSError, AttributeError):
        return None


def memory_warning(est: MemoryEstimate, capacity_gb: float | None, *, device: str, zero_stage: int,
                   world_size: int, gradient_checkpointing: bool, micro_batch_size: int) -> str | None:
    """A warning naming the knobs that shrink the estimate, when it exceeds `capacity_gb`; else None."""
    if capacity_gb is None or est.total_gb <= capacity_gb:
        return None
    knobs = []
    if world_size > 1 and zero_stage < 3:
        knobs.append(f"engine.zero_stage={zero_stage + 1} (shards "
                     + ("optimizer state" if zero_stage == 0 else "gradients too" if zero_stage == 1
                        else "the weights too") + f" across the {world_size} ranks; needs engine.backend=deepspeed)")
    if world_size == 1 and zero_stage < 3:
        knobs.append("more ranks with engine.zero_stage>=1 (ZeRO shards state across ranks)")
    if not gradient_checkpointing:
        knobs.append("model.gradient_checkpointing=true (activations: keeps one layer's, recomputes the rest)")
    if micro_batch_size > 1:
        knobs.append(f"a smaller data.micro_batch_size (now {micro_batch_size}; raise engine.grad_accum_steps "
                     "to keep the batch)")
    advice = "; ".join(knobs) if knobs else "a smaller model or data.seq_len"
    return (f"the memory estimate, {est.total_gb:.2f} GB per rank, exceeds the {capacity_gb:.2f} GB of {device}: "
            f"this run will likely run out of memory. What helps: {advice}.")
