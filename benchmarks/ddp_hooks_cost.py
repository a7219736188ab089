"""What the DDP wait timers (trainer.metrics.time_ddp_waits) cost a training step.

    .venv/bin/python -m benchmarks.ddp_hooks_cost [--rounds 10] [--steps 20]

Two gloo ranks on this machine, the default config's model (launch/configs/tiny.yaml, a Qwen2
with buffers) wrapped in DistributedDataParallel, one fixed batch. Each round runs `--steps`
forward+backward+AdamW steps without the timers and `--steps` with them (order alternated by
round), on the same processes, so drift on a shared machine hits both. Reported: the median step
time of each variant over all rounds, their ratio, and the p99. The timers are two forward
pre-hooks (the buffer broadcast apart) and a communication hook that calls torch's own
allreduce_hook per bucket (the backward compute apart).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from testkit.faults import free_port


def _rank(rank: int, world: int, port: int, args, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.nn.parallel import DistributedDataParallel

    from trainer.config import load_config
    from trainer.metrics import PhaseTimer, time_ddp_waits
    from trainer.model import build_model

    cfg = load_config(None)
    torch.manual_seed(0)
    model = build_model(cfg.model)
    ids = torch.randint(0, 256, (cfg.data.micro_batch_size, cfg.data.seq_len))
    times: dict[str, list[float]] = {"without": [], "with": []}
    for variant_order in range(args.rounds):
        for variant in (("without", "with") if variant_order % 2 == 0 else ("with", "without")):
            # A fresh wrapper per block: a communication hook cannot be taken off a DDP module.
            ddp = DistributedDataParallel(model)
            opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
            timer = PhaseTimer(torch.device("cpu"))
            hooks = time_ddp_waits(ddp, timer) if variant == "with" else []
            for _ in range(args.steps):
                dist.barrier()
                t0 = time.perf_counter()
                timer.start("forward")
                loss = ddp(input_ids=ids, labels=ids).loss
                timer.stop("forward")
                timer.start("backward")
                loss.backward()
                timer.stop("backward")
                opt.step()
                opt.zero_grad(set_to_none=True)
                timer.end_step()
                timer.latest()
                times[variant].append(time.perf_counter() - t0)
            for h in hooks:
                h.remove()
    if rank == 0:
        out.put(times)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args(argv)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, args, out)) for r in range(2)]
    for pr in procs:
        pr.start()
    times = out.get(timeout=1800)
    for pr in procs:
        pr.join(60)
    med = {k: statistics.median(v) for k, v in times.items()}
    p99 = {k: sorted(v)[int(0.99 * (len(v) - 1))] for k, v in times.items()}
    print(f"2 gloo ranks, tiny.yaml model under DDP, {args.rounds} rounds x {args.steps} steps per variant, alternated")
    for k in times:
        print(f"  {k:8s} the DDP wait timers: median {med[k] * 1e3:8.2f} ms a step, p99 {p99[k] * 1e3:8.2f} ms")
    print(f"  ratio with/without: median {med['with'] / med['without']:.3f}, p99 {p99['with'] / p99['without']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
