"""AdamW whose update can be dropped by a device flag, so a non-finite step is skipped without a sync.

    opt = SkippingAdamW(groups, lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    opt.apply_if = torch.isfinite(grad_norm)   # a 0-dim device bool, the same on every rank
    opt.step()                                 # where it is False: nothing changes

Skipping a step by an `if` would need the flag on the host: a host-device sync every step.
Here the flag stays on the device and scales the update instead: weights, both moments and
the step count move by exactly zero when it is False (NaN gradients are zeroed first, since
NaN * 0 is NaN). The math is AdamW's (Loshchilov & Hutter: decoupled weight decay, bias
corrected moments), written with foreach ops so the step is a handful of kernels (only the overloads that take a
0-dim tensor as a tensor: one that takes a Scalar would read it on the host); the step
count is a device tensor (as in torch's `capturable=True`) so a dropped step does not count.
The state dict has torch.optim.AdamW's keys (step, exp_avg, exp_avg_sq).
"""
from __future__ import annotations

import torch


class SkippingAdamW(torch.optim.Optimizer):
    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01) -> None:
        # capturable: torch's load_state_dict then puts `step` on the parameter's device (a
        # checkpoint read with map_location="cpu" would otherwise leave it on the host).
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                                  "capturable": True})
        self.apply_if: torch.Tensor | None = None   # set before each step(); None: apply

    @torch.no_grad()
    def step(self, closure=None):
        apply_if, self.apply_if = self.apply_if, None
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                self._step_group(group, params, apply_if)

    def _step_group(self, group: dict, params: list[torch.Tensor], apply_if: torch.Tensor | None) -> None:
        lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        device = params[0].device
        for p in params:
            state = self.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        grads = [p.grad for p in params]
        exp_avgs = [self.state[p]["exp_avg"] for p in params]
        exp_avg_sqs = [self.state[p]["exp_avg_sq"] for p in params]
        steps = [self.state[p]["step"] for p in params]
        if apply_if is None:
            on = torch.ones((), dtype=torch.float32, device=device)
        else:
            on = apply_if.to(device=device, dtype=torch.float32)
            for g in grads:  # NaN * 0 is NaN: zero the non-finite entries before scaling by `on`
                g.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
            torch._foreach_mul_(grads, on)
        torch._foreach_add_(steps, [on] * len(steps))  # the List overload: `on` stays a tensor
        # clamp: a first step that is dropped would divide by 1 - beta**0 = 0 (and 0 * inf is NaN).
        step = steps[0].clamp(min=1.0)
        bias_correction1 = 1 - beta1 ** step
        bias_correction2_sqrt = (1 - beta2 ** step).sqrt()
        torch._foreach_mul_(params, 1 - lr * wd * on)
        # m <- m + w (g - m), w = 1 - beta1 (0 when dropped). Not _foreach_lerp_: it has no
        # overload for a tensor weight and would turn this one into a Python number (a sync).
        weight = (1 - beta1) * on
        torch._foreach_mul_(exp_avgs, 1 - weight)
        torch._foreach_add_(exp_avgs, torch._foreach_mul(grads, weight))
        # v <- v * beta2 + (1 - beta2) g², with beta2 -> 1 when dropped (g is 0 then).
        torch._foreach_mul_(exp_avg_sqs, 1 - (1 - beta2) * on)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
        denom = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denom, bias_correction2_sqrt)
        torch._foreach_add_(denom, eps)
        update = torch._foreach_div(exp_avgs, denom)
        torch._foreach_mul_(update, -lr * on / bias_correction1)
        torch._foreach_add_(params, update)
