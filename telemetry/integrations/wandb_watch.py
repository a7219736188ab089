"""`wandb.watch(model)` for `telemetry.wandb`: W&B's gradient and parameter histograms, computed
off the training thread.

W&B's hooks, as wandb 0.31 sets them (wandb/integration/torch/wandb_torch.py): a forward hook on
each watched model that every `log_freq`-th forward pass logs a 64-bin histogram of each parameter
("parameters/<prefix><name>"), and a hook on each parameter that requires a gradient that every
`log_freq`-th backward pass logs one of its gradient ("gradients/<prefix><name>"), into the row
being filled (commit=False: the row the next `wandb.log` commits). W&B computes them in the hook,
on the training thread (`.min().item()`, `histc`: host-device syncs). Here a hook only clones the
tensor (on a GPU a queued copy) and notes it; the run hands the clones to its media writer when
it commits the row (on the thread that logs: a gradient hook may run on autograd's device
thread), and the writer thread computes W&B's histogram (the same steps: finite values only,
`histc` over [min, max] in 64 bins, or one bin when min == max) and writes it for the daemon's
W&B run, which logs it as `wandb.Histogram(np_histogram=...)` at the row's step.
"""
from __future__ import annotations

from typing import Any

from telemetry.integrations import wandb_media

NUM_BINS = 64
_global_watch_idx = 0


class Histogram(wandb_media.Histogram):
    """A watched tensor's clone; its histogram is W&B's, computed by the writer thread. (Named
    Histogram: the daemon's sink logs it as one.)"""

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor
        self.num_bins = NUM_BINS
        self.np_histogram = None
        self.sequence = None

    def snapshot(self) -> "Histogram":
        return self                      # cloned in the hook already

    def write(self, path: str) -> None:
        import numpy as np
        import torch

        flat = self.tensor.detach().reshape(-1).cpu()
        if flat.is_sparse:
            flat = flat.coalesce()._values()
        if flat.dtype not in (torch.float32, torch.float64):
            flat = flat.float()
        finite = torch.isfinite(flat)
        if flat.numel() == 0 or not finite.any():
            raise ValueError("no finite values (W&B logs no histogram of it either)")
        if not finite.all():
            flat = flat[finite]
        tmin, tmax = flat.min().item(), flat.max().item()
        if tmin == tmax:
            hist, bins = torch.Tensor([flat.numel()]), torch.Tensor([tmin, tmax])
        else:
            hist = flat.histc(bins=NUM_BINS, min=tmin, max=tmax)
            bins = torch.linspace(tmin, tmax, steps=NUM_BINS + 1)
        with open(path, "wb") as f:
            np.savez(f, hist=np.asarray(hist.tolist()), bins=np.asarray(bins.tolist()))


def _due(track: list[int]) -> bool:
    """W&B's log_track_update: count up to the threshold, then reset and say so."""
    track[0] += 1
    if track[0] < track[1]:
        return False
    track[0] = 0
    return True


def watch(run: Any, models: Any, criterion: Any = None, log: str | None = "gradients", log_freq: int = 1000,
          idx: int | None = None, log_graph: bool = False) -> list:
    """wandb.watch on `run`: hooks that note clones for `run._watched` (see the module docstring)."""
    global _global_watch_idx
    if log not in {"gradients", "parameters", "all", None}:
        raise ValueError("log must be one of 'gradients', 'parameters', 'all', or None")
    if log_graph:
        raise NotImplementedError("telemetry.wandb does not support wandb.watch(log_graph=True): the graph is "
                                  "W&B's own object; watch without it")
    import torch

    if not isinstance(models, (tuple, list)):
        models = (models,)
    for model in models:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"Expected a pytorch model (torch.nn.Module). Received {type(model)}")
    pending = run._watched
    if idx is None:
        idx = _global_watch_idx
    for local_idx, model in enumerate(models):
        global_idx = idx + local_idx
        _global_watch_idx += 1
        prefix = f"graph_{global_idx}" if global_idx > 0 else ""
        handles = run._watch_handles.setdefault(id(model), [])
        if log in ("parameters", "all"):
            track = [0, log_freq]

            def on_forward(module, _inputs, output, track=track, prefix=prefix):
                if _due(track):
                    for name, p in module.named_parameters():
                        pending.append(("parameters/" + prefix + name, p.detach().clone()))

            handles.append(model.register_forward_hook(on_forward))
        if log in ("gradients", "all"):
            for name, p in model.named_parameters():
                if not p.requires_grad:
                    continue
                track = [0, log_freq]
                key = "gradients/" + prefix + name

                def on_grad(grad, track=track, key=key):
                    if _due(track):
                        pending.append((key, grad.detach().clone()))

                handles.append(p.register_hook(on_grad))
    return []


def unwatch(run: Any, models: Any = None) -> None:
    """Remove the hooks of `models` (all watched models when None)."""
    if models is None:
        keys = list(run._watch_handles)
    else:
        keys = [id(m) for m in (models if isinstance(models, (tuple, list)) else (models,))]
    for key in keys:
        for handle in run._watch_handles.pop(key, []):
            handle.remove()
