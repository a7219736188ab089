"""The trainer times the optimizer's own update apart (trainer.metrics.time_update), the part of
the optimizer phase that holds no collective under ZeRO (straggler_view.py): its hooks stamp a
nested "optimizer_update" phase, run the fault injection at its start, and leave the update
itself exactly as it was."""
from __future__ import annotations

import time

import torch

from trainer.metrics import PhaseTimer, time_update
from trainer.optim import SkippingAdamW


def _pair():
    torch.manual_seed(0)
    a = torch.nn.Linear(8, 4)
    b = torch.nn.Linear(8, 4)
    b.load_state_dict(a.state_dict())
    for m in (a, b):
        for p in m.parameters():
            p.grad = torch.ones_like(p)
    return a, b


def test_the_update_is_a_nested_phase_and_the_step_is_unchanged():
    a, b = _pair()
    opt_a, opt_b = SkippingAdamW(a.parameters(), lr=0.1), SkippingAdamW(b.parameters(), lr=0.1)
    timer, begun = PhaseTimer(torch.device("cpu")), []
    hooks = time_update(opt_a, timer, lambda: (begun.append(1), time.sleep(0.05)))
    timer.start("optimizer")
    opt_a.apply_if = torch.tensor(True)    # an argument-free step: a pre-hook's return would replace its args
    opt_a.step()
    opt_a.step()                           # ZeRO 1-2 call it once per parameter group: the times add up
    timer.stop("optimizer")
    timer.end_step()
    opt_b.apply_if = torch.tensor(True)
    opt_b.step()
    opt_b.step()
    phases = timer.latest()
    assert begun == [1, 1]
    assert 0.1 <= phases["optimizer_update"] <= phases["optimizer"]
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    for h in hooks:
        h.remove()
    opt_a.step()
    assert begun == [1, 1]                 # removed: nothing runs any more


def test_a_slow_optimizer_sleeps_in_its_update_once_a_step(monkeypatch):
    from trainer import faults as faults_mod
    from trainer.config import load_config

    slept = []
    monkeypatch.setattr(faults_mod.time, "sleep", slept.append)
    cfg = load_config(None, ["debug.slow_s=0.2", "debug.slow_phase=optimizer", "debug.slow_rank=1",
                             "debug.slow_from_step=2"]).debug
    mine, other = faults_mod.make_faults(cfg, 1), faults_mod.make_faults(cfg, 0)
    for step in (1, 2, 3):
        for f in (mine, other):
            f.phase("optimizer", step)              # before the engine's step: not where it sleeps
            for _ in range(2):                      # DeepSpeed: one update per parameter group
                f.phase("optimizer_update", step)
    assert slept == [0.2, 0.2]                      # steps 2 and 3, rank 1, once each


def test_gather_waits_are_timed_apart_in_a_training_forward_only(monkeypatch):
    """time_gather_waits brackets every module's forward pre-hooks registered before it (where
    DeepSpeed's ZeRO-3 gathers the module's parameters: a wait of exactly 1 s of a clock that
    only the hooks move stands in for it here, so that the figures are exact on a loaded machine)."""
    import types

    import trainer.metrics
    from trainer.metrics import time_gather_waits

    clock = [100.0]
    monkeypatch.setattr(trainer.metrics, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    def gather(*_):
        clock[0] += 1.0

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    for m in (model[0], model[2]):                  # what DeepSpeed registers at initialize()
        m.register_forward_pre_hook(gather)
    timer = PhaseTimer(torch.device("cpu"))
    hooks = time_gather_waits(model, timer)
    x = torch.randn(3, 4)
    timer.start("forward")
    y = model(x)
    timer.stop("forward")
    model(x)                                        # outside the forward phase (a recompute): not counted
    model.eval()
    timer.start("forward")
    model(x)                                        # an eval forward: not counted
    timer.stop("forward")
    timer.end_step()
    phases = timer.latest()
    assert y.shape == (3, 2)                        # the inputs went through unchanged
    # The training forward's two waits; the recompute's and the eval's are not counted (the eval
    # forward is inside the forward phase: 2 + 2).
    assert (phases["forward_gather_wait"], phases["forward"]) == (2.0, 4.0), phases
    for h in hooks:
        h.remove()
