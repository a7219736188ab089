"""Fault injection from the config's `debug:` section: a NaN loss, a slow, hung or failing rank.

    faults = make_faults(cfg.debug, rank)
    faults.phase("forward", step)          # at the start of each phase: sleeps or hangs if told to
    faults.phase("optimizer_update", step) # at the start of the optimizer's own update (its step())
    faults.phase("checkpoint", step)       # at the start of a checkpoint save: debug.slow_checkpoint_s
    loss = faults.poison(loss, step)       # NaN at debug.nan_step on debug.nan_rank

For tests and for users who want to see the alarms work (nonfinite, straggler, rank_stopped)
without patching the trainer. With nothing configured, `make_faults` returns `NoFaults`,
whose methods do nothing, so the step path carries no branches for it.
"""
from __future__ import annotations

import time

import torch

from trainer.config import DebugConfig


class NoFaults:
    """The stand-in when `debug:` asks for nothing."""

    def phase(self, phase: str, step: int) -> None:
        pass

    def poison(self, loss: torch.Tensor, step: int) -> torch.Tensor:
        return loss

    def describe(self) -> str:
        return ""


# Where a slow phase sleeps. A slow optimizer sleeps inside the optimizer's own update, where a
# slow device or host spends the time: under ZeRO 1-3 that is between the collectives of
# DeepSpeed's step, not before its first one (what no phase timing could tell apart).
SLOW_SITE = {"forward": "forward", "backward": "backward", "data": "data", "optimizer": "optimizer_update"}


class Faults:
    """The faults `debug:` configures for this rank."""

    def __init__(self, cfg: DebugConfig, rank: int) -> None:
        self.cfg, self.rank = cfg, rank
        self._update_slept = 0  # the step whose update slept already

    def _mine(self, target_rank: int) -> bool:
        return target_rank == -1 or target_rank == self.rank

    def phase(self, phase: str, step: int) -> None:
        """Called when `phase` of optimizer step `step` (counted from 1) begins."""
        c = self.cfg
        if phase == "checkpoint":
            if c.slow_checkpoint_s:
                time.sleep(c.slow_checkpoint_s)   # a slow file system under every save
            return
        if (c.slow_s and phase == SLOW_SITE[c.slow_phase] and step >= c.slow_from_step and self._mine(c.slow_rank)
                and (phase != "optimizer_update" or self._update_slept != step)):
            self._update_slept = step  # DeepSpeed updates once per parameter group: sleep once a step
            time.sleep(c.slow_s)
        if c.hang_step and phase == c.hang_phase and step == c.hang_step and self._mine(c.hang_rank):
            print(f"[trainer rank {self.rank}] debug.hang_step: hanging in {phase} of step {step}", flush=True)
            while True:  # what a stuck collective or a dead NFS mount looks like from outside
                time.sleep(3600)
        if c.raise_step and phase == "optimizer" and step == c.raise_step and self._mine(c.raise_rank):
            raise RuntimeError(f"debug.raise_step: injected failure at step {step} on rank {self.rank}")

    def poison(self, loss: torch.Tensor, step: int) -> torch.Tensor:
        """The loss times NaN at debug.nan_step: a device op, no host read; the gradients become NaN too."""
        if self.cfg.nan_step == step and self._mine(self.cfg.nan_rank):
            return loss * float("nan")
        return loss

    def describe(self) -> str:
        c, parts = self.cfg, []
        if c.nan_step:
            parts.append(f"NaN loss at step {c.nan_step} on rank {c.nan_rank}")
        if c.slow_s:
            parts.append(f"{c.slow_s} s extra per {c.slow_phase} from step {c.slow_from_step} on rank {c.slow_rank}")
        if c.hang_step:
            parts.append(f"hang in {c.hang_phase} at step {c.hang_step} on rank {c.hang_rank}")
        if c.raise_step:
            parts.append(f"an exception at step {c.raise_step} on rank {c.raise_rank}")
        if c.slow_checkpoint_s:
            parts.append(f"{c.slow_checkpoint_s} s extra in every checkpoint save")
        return "; ".join(parts)


def make_faults(cfg: DebugConfig, rank: int) -> Faults | NoFaults:
    return Faults(cfg, rank) if cfg.enabled else NoFaults()
