"""MFU three ways: the daemon's analytic MFU of a run, FlopCounterMode's count of one step, and
the device's measured matmul rate.

    python -m benchmarks.gpu.mfu_compare --config launch/configs/qwen2-0.5b-gpu.yaml \\
        [--metrics runs/.../telemetry/metrics.jsonl] [--matmul-size 8192] [key=value ...]

- analytic: perf/mfu, perf/hfu and perf/model_flops_per_second from the daemon's metrics.jsonl
  (median over the run's steps): what the sidecar reports, from tokens/s and the config.
- counted: telemetry.tools.mfu_check.count_flops (FlopCounterMode, eager attention, meta device) of
  one optimizer step of the config's shape (micro_batch_size x grad_accum rows of seq_len,
  unpacked), beside telemetry.daemon.mfu's formula for the same step; with gradient checkpointing
  also the hardware FLOPs (recompute) both ways.
- measured: an n x n x n matmul in the run's dtype (bf16 on GPU), mean of 10 after warm-up,
  timed with CUDA events (perf_counter on CPU). MFU against it = model FLOP/s / that rate: how
  far the run is from what this device does on an ideal matmul, not from the datasheet.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def analytic_from_jsonl(path: str | Path, skip_steps: int = 0) -> dict:
    """Medians of the daemon's derived perf keys over aggregated metrics records (step > skip)."""
    keys = ("perf/mfu", "perf/hfu", "perf/model_flops_per_second", "perf/tokens", "perf/attn_doc_len_sq",
            "perf/step_time", "perf/tokens_per_second")
    series: dict[str, list[float]] = {k: [] for k in keys}
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("kind") != "metrics" or "rank" in rec or rec.get("step", 0) <= skip_steps:
                continue
            for k in keys:
                v = rec["values"].get(k)
                if isinstance(v, (int, float)):
                    series[k].append(float(v))
    out = {k: statistics.median(v) for k, v in series.items() if v}
    out["num_steps"] = max((len(v) for v in series.values()), default=0)
    return out


def hf_config_of(cfg) -> object:
    """The transformers config the trainer builds for cfg.model (same vocab default)."""
    from transformers import AutoConfig

    from trainer.data import VOCAB_SIZE

    kwargs = dict(cfg.model.hf_config)
    model_type = kwargs.pop("model_type")
    kwargs.setdefault("vocab_size", VOCAB_SIZE)
    return AutoConfig.for_model(model_type, **kwargs)


def counted_step(cfg, device: str = "meta") -> dict:
    """FlopCounterMode vs the formula for one optimizer step of cfg's shape (unpacked rows)."""
    from telemetry.daemon import mfu
    from telemetry.tools.mfu_check import count_flops

    hf = hf_config_of(cfg)
    shape = mfu.model_shape(hf)
    rows = cfg.data.micro_batch_size * cfg.engine.grad_accum_steps
    seq = cfg.data.seq_len
    tokens, sum_sq = rows * seq, rows * seq * seq
    t0 = time.perf_counter()
    counted = sum(count_flops(hf, rows, seq, device).values())
    out = {"rows": rows, "seq_len": seq, "formula_flops": mfu.training_flops(shape, tokens, sum_sq),
           "counted_flops": counted, "device": device}
    out["ratio"] = counted / out["formula_flops"]
    if cfg.model.gradient_checkpointing:
        hw_counted = sum(count_flops(hf, rows, seq, device, gradient_checkpointing=True).values())
        hw_formula = mfu.hardware_flops(shape, tokens, sum_sq, gradient_checkpointing=True)
        out.update(hardware_counted_flops=hw_counted, hardware_formula_flops=hw_formula,
                   hardware_ratio=hw_counted / hw_formula)
    out["count_s"] = time.perf_counter() - t0
    return out


def matmul_rate(n: int, dtype: str, num_iters: int = 10, num_warmup: int = 3) -> dict:
    """FLOP/s of an n^3 matmul on the default device (CUDA if present), mean of num_iters."""
    import torch

    cuda = torch.cuda.is_available()
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    dev = "cuda" if cuda else "cpu"
    a = torch.randn(n, n, device=dev, dtype=dt)
    b = torch.randn(n, n, device=dev, dtype=dt)
    times_s = []
    for i in range(num_warmup + num_iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.mm(a, b)
            end.record()
            end.synchronize()  # benchmark bookkeeping
            dt_s = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            torch.mm(a, b)
            dt_s = time.perf_counter() - t0
        if i >= num_warmup:
            times_s.append(dt_s)
    mean_s = statistics.fmean(times_s)
    flops = 2 * n ** 3
    return {"n": n, "dtype": dtype, "device": torch.cuda.get_device_name() if cuda else "cpu",
            "mean_s": mean_s, "flops_per_second": flops / mean_s, "best_flops_per_second": flops / min(times_s),
            "num_iters": num_iters}


def compare(cfg, metrics_path: str | Path | None, matmul_n: int, skip_steps: int = 0) -> dict:
    out: dict = {"counted": counted_step(cfg)}
    out["matmul"] = matmul_rate(matmul_n, cfg.model.dtype)
    if metrics_path and Path(metrics_path).is_file():
        a = analytic_from_jsonl(metrics_path, skip_steps)
        out["analytic"] = a
        rate = a.get("perf/model_flops_per_second")
        if rate:
            out["mfu_vs_measured_matmul"] = rate / out["matmul"]["flops_per_second"]
    else:
        out["analytic"] = None
    return out


def main(argv: list[str] | None = None) -> int:
    from trainer.config import load_config

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--metrics", default=None, help="the daemon's metrics.jsonl of a run")
    ap.add_argument("--matmul-size", type=int, default=8192)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    print(json.dumps(compare(cfg, args.metrics, args.matmul_size), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
