"""The seed code base's in-process monitor, as a client stand-in: the cost our sidecar removes.

What it does inside the training step (the culprits the README's opening paragraph names):
  - `.item()` of every logged tensor, every step: one host-device sync per value;
  - per-sample loss and accuracy from the last micro-batch: a reduction and `.item()` per
    sample (the seed's per-dataset metrics);
  - every PROFILE_EVERY steps, torch.profiler(with_flops=True) over one no_grad forward of the
    last batch (CPU and, on GPU, CUDA activity), then a `dist.broadcast` of the FLOPs when a
    process group exists;
  - `wandb.log` (offline) of the whole row, every step;
  - a JSON line written and flushed, every step.

It needs the last batch and the model outputs: `capture_forward_loss()` wraps
trainer.model.forward_loss to keep references to them (installed in every variant of the
benchmark, so all variants run the same wrapper).
"""
from __future__ import annotations

import json
import os
from typing import Any

PROFILE_EVERY = 50  # the seed's profiler interval, in steps

# The last micro-batch, its (loss, token_loss, correct) and the model, set by the wrapper below.
LAST: dict[str, Any] = {}


def capture_forward_loss() -> None:
    """Wrap trainer.model.forward_loss so the monitor sees the last batch (before engines import it)."""
    import trainer.model as model_mod

    if getattr(model_mod.forward_loss, "_captures", False):
        return
    original = model_mod.forward_loss

    def forward_loss(model, batch):
        out = original(model, batch)
        LAST["batch"], LAST["out"], LAST["model"] = batch, out, model
        return out

    forward_loss._captures = True  # type: ignore[attr-defined]
    model_mod.forward_loss = forward_loss


class SeedMonitor:
    """A TelemetryClient look-alike that does the seed's monitoring on the training thread."""

    def __init__(self, run_dir: str, profile_every: int = PROFILE_EVERY) -> None:
        os.environ.setdefault("WANDB_MODE", "offline")
        import wandb  # the seed imported it on every rank that logs

        self.wandb = wandb
        self.run = wandb.init(project="gpu-step-overhead", dir=run_dir, mode="offline")
        self.file = open(os.path.join(run_dir, "seed_log.jsonl"), "a")
        self.profile_every = profile_every
        self.num_profiles = 0

    def hello(self, info: dict) -> None:
        pass

    def event(self, name: str, data: dict | None = None) -> None:
        pass

    def stats(self) -> dict:
        return {"sent": 0, "dropped": 0, "num_profiles": self.num_profiles}

    def log(self, step: int, values: dict, parts: int = 1) -> None:  # parts: the client's signature
        import torch

        row = {k: (v.item() if hasattr(v, "item") else v) for k, v in values.items()}  # a sync per value
        batch, out = LAST.get("batch"), LAST.get("out")
        if batch is not None and out is not None:
            _, token_loss, correct = out
            valid = batch["labels"] != -100
            for i in range(batch["input_ids"].shape[0]):  # per-sample .item()s, like the seed
                n = valid[i].sum().clamp(min=1)
                ds = batch["dataset_ids"][i, 0].item()
                row[f"sample/{ds}/acc"] = (correct[i].sum() / n).item()
                row[f"sample/{ds}/loss"] = (token_loss[i].sum() / n).item()
            if step % self.profile_every == 0:
                row["perf/profiled_flops"] = self._profile(torch, batch)
        self.wandb.log(row, step=step)
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()

    def _profile(self, torch: Any, batch: dict) -> float:
        """The seed's MFU measurement: a profiled no_grad forward (so ~1/3 of a step's FLOPs)."""
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU]
        if batch["input_ids"].is_cuda:
            acts.append(ProfilerActivity.CUDA)
        kwargs = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"]}
        if "attention_mask" in batch:
            kwargs["attention_mask"] = batch["attention_mask"]
        with torch.no_grad(), profile(activities=acts, with_flops=True) as prof:
            LAST["model"](**kwargs)
        flops = float(sum(e.flops for e in prof.key_averages()))
        self.num_profiles += 1
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():  # the seed shared it with every rank
            t = torch.tensor([flops], device=batch["input_ids"].device)
            dist.broadcast(t, 0)
            flops = t.item()
        return flops

    def close(self, timeout_s: float | None = None) -> None:
        self.file.close()
        self.run.finish()
