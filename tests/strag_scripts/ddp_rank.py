"""One rank of a tiny DDP run on gloo that sends the trainer's phase metrics through TelemetryClient,
with a fault injected on one rank (the tests of issue 19 start 2-4 of these).

    python ddp_rank.py --endpoint E --rank R --world W --port P --steps N
        [--slow-rank R --slow-phase data_loading|forward|backward|optimizer --slow-s S]
        [--hang-rank R --hang-step K]      # that rank sleeps forever in data loading at step K

The phases are timed as trainer/train.py times them: data loading, forward, backward (DDP's
gradient all-reduce runs inside it), optimizer step.
"""
from __future__ import annotations

import argparse
import gc
import os
import time

import torch
import torch.distributed as dist

from telemetry import TelemetryClient


def load_batch(gen: torch.Generator, hang: bool) -> tuple[torch.Tensor, torch.Tensor]:
    while hang:                       # the injected hang: never leaves data loading
        time.sleep(3600)
    x = torch.randn(16, 32, generator=gen)
    return x, x.sum(dim=1, keepdim=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-phase", default="")
    ap.add_argument("--slow-s", type=float, default=0.0)
    ap.add_argument("--hang-rank", type=int, default=-1)
    ap.add_argument("--hang-step", type=int, default=-1)
    a = ap.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=a.rank, world_size=a.world)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(a.rank)
    tm = TelemetryClient(endpoint=a.endpoint, rank=a.rank)
    tm.hello({"world_size": a.world})
    slow = a.slow_s if a.rank == a.slow_rank else 0.0

    def maybe_slow(phase: str) -> None:
        if slow and phase == a.slow_phase:
            time.sleep(slow)

    for step in range(a.steps):
        t0 = time.perf_counter()
        x, y = load_batch(gen, a.rank == a.hang_rank and step == a.hang_step)
        maybe_slow("data_loading")
        t1 = time.perf_counter()
        maybe_slow("forward")
        loss = torch.nn.functional.mse_loss(model(x), y)
        t2 = time.perf_counter()
        maybe_slow("backward")
        loss.backward()               # DDP: the gradient all-reduce, where fast ranks wait
        t3 = time.perf_counter()
        maybe_slow("optimizer")
        opt.step()
        opt.zero_grad()
        t4 = time.perf_counter()
        step_s = t4 - t0
        tm.log(step, {"train/loss": float(loss.detach()), "perf/step_time": step_s,
                      "perf/data_loading_time": t1 - t0, "perf/forward_time": t2 - t1,
                      "perf/backward_time": t3 - t2, "perf/optimizer_time": t4 - t3,
                      "perf/data_loading_ratio": (t1 - t0) / step_s})
    tm.close()
    dist.barrier()
    del model          # collected before the group goes (see tests/dropin_scripts/nanogpt_wandb.py)
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
