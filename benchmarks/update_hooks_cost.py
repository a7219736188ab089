"""What timing the optimizer's own update costs the training step (issue 19).

    .venv/bin/python benchmarks/update_hooks_cost.py [--calls 200] [--rounds 20] [--config launch/configs/tiny.yaml]
                                                     [--one-param] [--gathers]

The trainer times the optimizer's update apart (trainer.metrics.time_update: a step pre- and
post-hook that stamp the PhaseTimer, perf_counter on CPU, a CUDA event on GPU). Here the same
optimizer (the trainer's SkippingAdamW over the config's model, gradients set once) is stepped
with those hooks registered and without, in alternating rounds on the same process so a shared
machine's drift hits both; per call the host time of optimizer.step(), then the median and p99
per variant over all rounds, and the difference of the medians. On a GPU the step only enqueues
kernels, so the host time is what the training thread pays. --one-param steps an optimizer of a
single one-element parameter instead, so that the hooks' own cost is most of what is timed.
--gathers measures trainer.metrics.time_gather_waits instead (ZeRO-3: two forward pre-hooks on
each module with parameters of its own): the call of a one-element Linear inside a training
forward phase, with and without them, --calls calls a block, blocks alternated --rounds times;
the difference is the cost per hooked module, which times the config's number of such modules
gives the cost per forward. Under ZeRO-3 DeepSpeed has a forward pre-hook on every module
already, so torch's module call takes its hook path either way: both variants carry a no-op
pre-hook standing in for DeepSpeed's (the bracket holds nothing: no gather without DeepSpeed).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainer.config import load_config  # noqa: E402
from trainer.engine import make_optimizer  # noqa: E402
from trainer.faults import NoFaults  # noqa: E402
from trainer.metrics import PhaseTimer, time_gather_waits, time_update  # noqa: E402
from trainer.model import build_model  # noqa: E402


def _calls(opt, timer: PhaseTimer, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        opt.step()
        out.append(time.perf_counter() - t0)
        timer.end_step()
        timer.latest()
    return out


def _gathers(args, model: torch.nn.Module) -> int:
    one = torch.nn.Linear(1, 1)
    one.register_forward_pre_hook(lambda *_: None)       # DeepSpeed's gathering hook's stand-in
    x, timer = torch.ones(1, 1), PhaseTimer(torch.device("cpu"))
    times: dict[str, list[float]] = {"without": [], "with": []}
    for r in range(args.rounds):
        for variant in (("without", "with") if r % 2 == 0 else ("with", "without")):
            hooks = time_gather_waits(one, timer) if variant == "with" else ()
            timer.start("forward")
            t0 = time.perf_counter()
            with torch.no_grad():
                for _ in range(args.calls):
                    one(x)
            times[variant].append((time.perf_counter() - t0) / args.calls)
            timer.stop("forward")
            timer.end_step()
            timer.latest()
            for h in hooks:
                h.remove()
    med = {k: statistics.median(v) for k, v in times.items()}
    per_module = med["with"] - med["without"]
    hooked = sum(next(m.parameters(recurse=False), None) is not None for m in model.modules())
    print(f"a module's call in a training forward, {args.rounds} blocks of {args.calls} per variant, alternated")
    for k in times:
        print(f"  {k:8s} gather-wait hooks: median {med[k] * 1e6:7.2f} us per call")
    print(f"  per hooked module: {per_module * 1e6:+.2f} us; the config's model has {hooked} modules with "
          f"parameters of their own: {hooked * per_module * 1e6:+.0f} us per forward")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200, help="optimizer.step() calls per round and variant")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--config", default=str(ROOT / "launch" / "configs" / "tiny.yaml"))
    ap.add_argument("--one-param", action="store_true", help="a one-element model: the hooks' own cost")
    ap.add_argument("--gathers", action="store_true", help="the forward with and without the gather-wait hooks")
    args = ap.parse_args()
    cfg = load_config(args.config)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = (torch.nn.Linear(1, 1, bias=False) if args.one_param else build_model(cfg.model)).to(device)
    if args.gathers:
        return _gathers(args, model)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    opt = make_optimizer(cfg, model)
    timer, faults = PhaseTimer(device), NoFaults()
    _calls(opt, timer, 20)                          # warm up: state allocated, caches warm
    times: dict[str, list[float]] = {"without": [], "with": []}
    for r in range(args.rounds):
        for variant in (("without", "with") if r % 2 == 0 else ("with", "without")):
            hooks = time_update(opt, timer, lambda: faults.phase("optimizer_update", 1)) if variant == "with" else ()
            times[variant] += _calls(opt, timer, args.calls)
            for h in hooks:
                h.remove()
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"optimizer.step() host time, {n_params / 1e6:.2f}M params on {device}, "
          f"{args.rounds} x {args.calls} calls per variant, alternated")
    med = {}
    for k, v in times.items():
        v = sorted(v)
        med[k] = statistics.median(v)
        print(f"  {k:8s} hooks: median {med[k] * 1e6:9.1f} us   p99 {v[int(0.99 * (len(v) - 1))] * 1e6:9.1f} us")
    print(f"  with - without: {(med['with'] - med['without']) * 1e6:+.1f} us per step() "
          f"({med['with'] / med['without']:.3f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
