"""The model: any Hugging Face causal LM, built from a config dict or loaded from a local directory."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer.config import ModelConfig
from trainer.data import IGNORE_INDEX, VOCAB_SIZE, to_device

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build_model(cfg: ModelConfig) -> torch.nn.Module:
    """Build (model.hf_config) or load (model.path, local only: nothing is downloaded)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if cfg.path:
        model = AutoModelForCausalLM.from_pretrained(cfg.path, attn_implementation=cfg.attn_implementation,
                                                     local_files_only=True, dtype=torch.float32)
    else:
        kwargs = dict(cfg.hf_config)
        model_type = kwargs.pop("model_type")
        kwargs.setdefault("vocab_size", VOCAB_SIZE)
        hf_config = AutoConfig.for_model(model_type, **kwargs)
        model = AutoModelForCausalLM.from_config(hf_config, attn_implementation=cfg.attn_implementation)
    if model.config.vocab_size < VOCAB_SIZE:
        raise ValueError(f"model vocab_size={model.config.vocab_size} is smaller than the byte tokenizer's {VOCAB_SIZE}")
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    return model


def uses_block_mask(attn_implementation: str) -> bool:
    """flash_attention_2 takes no mask: it finds the documents from the restarting position ids."""
    return attn_implementation != "flash_attention_2"


def attention_mask_for(block_mask: torch.Tensor, attn_implementation: str, dtype: torch.dtype) -> torch.Tensor:
    """The [B, 1, S, S] block-causal mask (bool, True = may attend) in the form the attention expects.

    A 4-D mask reaches the attention function as given. sdpa reads a bool mask as "may attend";
    eager *adds* the mask to the scores, so it needs 0 where allowed and a large negative number
    elsewhere (a bool mask added as 0/1 masks nothing: every position would see the future).
    """
    if attn_implementation == "eager":
        allowed = torch.zeros((), dtype=dtype, device=block_mask.device)
        blocked = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=block_mask.device)
        return torch.where(block_mask, allowed, blocked)
    return block_mask


def prepare_batch(host_batch: dict, device: torch.device, attn_implementation: str,
                  dtype: torch.dtype) -> dict:
    """Copy a collated batch to `device` (no wait) and put its mask in the attention's form.

    The one way a batch reaches the model, in training and in eval alike.
    """
    batch = to_device(host_batch, device)
    if "attention_mask" in batch:
        batch["attention_mask"] = attention_mask_for(batch["attention_mask"], attn_implementation, dtype)
    return batch


def num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def forward_loss(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the model; return (mean loss, per-position loss [B,S] fp32, per-position correct [B,S] bool).

    Loss and correctness are per position so per-dataset metrics can be gathered on device.
    Positions without a label carry 0 in both.
    """
    kwargs = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"], "use_cache": False}
    if "attention_mask" in batch:
        kwargs["attention_mask"] = batch["attention_mask"]
    logits = model(**kwargs).logits
    labels = batch["labels"]
    flat = logits.float().view(-1, logits.shape[-1])
    token_loss = F.cross_entropy(flat, labels.view(-1), ignore_index=IGNORE_INDEX, reduction="none").view_as(labels)
    valid = labels != IGNORE_INDEX
    correct = (logits.argmax(-1) == labels) & valid
    # clamp, not max(): no host round trip to test for an empty batch.
    loss = token_loss.sum() / valid.sum().clamp(min=1)
    return loss, token_loss, correct
