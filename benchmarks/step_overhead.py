"""Step-time overhead of telemetry in the real trainer (tiny model): off vs. our client vs. a seed-style monitor.

    .venv/bin/python benchmarks/step_overhead.py [--steps 200] [--rounds 2] [--out benchmarks/out/step_overhead.json]

Variants, each a fresh trainer process on one rank (engine ddp, the same config and data):
  off   telemetry disabled (the client is the do-nothing stand-in)
  ours  our TelemetryClient sending to a live daemon (started here, W&B disabled in the daemon)
  seed  an in-process monitor as the seed code base had it: per-step .item() of every value,
        per-sample accuracy/loss with argmax + .item() per sample, wandb.log (offline), a JSON
        line written and flushed, and torch.profiler(with_flops=True) over a no_grad forward
        every 50 steps.
Step time is the trainer's own perf/step_time (host time between consecutive step ends, which
includes the previous step's logging). The first WARMUP steps are dropped. Variants alternate
in rounds so drift on a shared machine hits all of them.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WARMUP = 20
PROFILE_EVERY = 50  # the seed's profiler interval

CHILD = r'''
import json, os, sys, time   # run with cwd = the repository root, which `-c` puts first on sys.path
import torch
import telemetry.client as tc
from trainer import train

variant, out_path = sys.argv[1], sys.argv[2]
step_times = []
last = {}

import trainer.model as _m
orig_forward_loss = _m.forward_loss
def forward_loss(model, batch):
    out = orig_forward_loss(model, batch)
    last["batch"], last["out"], last["model"] = batch, out, model
    return out


class SeedMonitor:
    """What the seed did inside the step (see benchmarks/gpu/seed_monitor.py and the README's opening)."""
    def __init__(self, run_dir):
        os.environ.setdefault("WANDB_MODE", "offline")
        import wandb
        self.wandb = wandb
        self.run = wandb.init(project="step-overhead", dir=run_dir, mode="offline")
        self.f = open(os.path.join(run_dir, "seed_log.jsonl"), "a")
    def hello(self, info): pass
    def event(self, name, data=None): pass
    def stats(self): return {}
    def log(self, step, values, parts=1):
        row = {k: (v.item() if hasattr(v, "item") else v) for k, v in values.items()}  # a sync per value
        batch, (loss, token_loss, correct) = last["batch"], last["out"]
        valid = batch["labels"] != -100
        for i in range(batch["input_ids"].shape[0]):  # per-sample .item(), like the seed
            pred_ok = (correct[i].sum() / valid[i].sum().clamp(min=1)).item()
            ds = batch["dataset_ids"][i, 0].item()
            row[f"sample/{ds}/acc"] = pred_ok
            row[f"sample/{ds}/loss"] = (token_loss[i].sum() / valid[i].sum().clamp(min=1)).item()
        if step % 50 == 0:  # the seed's MFU profiler: one no_grad forward with with_flops
            from torch.profiler import profile, ProfilerActivity
            with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
                last["model"](input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                              attention_mask=batch.get("attention_mask"))
            row["perf/flops"] = sum(e.flops for e in prof.key_averages())
        self.wandb.log(row, step=step)
        self.f.write(json.dumps(row) + "\n")
        self.f.flush()
    def close(self, timeout_s=None):
        self.f.close()
        self.run.finish()


class Recorder:
    """Wraps whichever client the variant uses; records the trainer's own step time."""
    def __init__(self, inner): self.inner = inner
    def hello(self, info): self.inner.hello(info)
    def event(self, name, data=None): self.inner.event(name, data)
    def stats(self): return self.inner.stats()
    def log(self, step, values, parts=1):
        if "perf/step_time" in values:
            step_times.append(values["perf/step_time"])
        self.inner.log(step, values, parts)
    def close(self, timeout_s=1.5):
        self.inner.close()


def make_client(endpoint=None, rank=None, **kw):
    if variant == "seed":
        return Recorder(SeedMonitor(os.environ["BENCH_RUN_DIR"]))
    return Recorder(tc.TelemetryClient(endpoint=endpoint, rank=rank))

import trainer.model
trainer.model.forward_loss = forward_loss  # the engine imports it when built
import telemetry
telemetry.__dict__["TelemetryClient"] = make_client
rc = train.main(sys.argv[3:])
json.dump({"variant": variant, "step_times_s": step_times}, open(out_path, "w"))
sys.exit(rc)
'''


def run_variant(variant: str, steps: int, tmp: Path, endpoint: str) -> list[float]:
    run_dir = tmp / f"run-{variant}-{time.monotonic_ns()}"
    run_dir.mkdir()
    out = run_dir / "times.json"
    env = {**os.environ, "BENCH_RUN_DIR": str(run_dir), "WANDB_MODE": "offline",
           "WANDB_DIR": str(run_dir), "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}
    env.pop("TELEMETRY_DISABLED", None)
    telemetry_ep = {"off": "", "ours": endpoint, "seed": ""}[variant]
    args = [f"steps={steps}", f"run_dir={run_dir}", "engine.backend=ddp", "engine.zero_stage=0",
            "checkpoint.every_steps=0", "checkpoint.save_final=false", "eval.every_steps=0",
            "estimate_memory=false", f"telemetry_endpoint={telemetry_ep}"]
    p = subprocess.run([sys.executable, "-c", CHILD, variant, str(out), *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"{variant} failed:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
    return json.loads(out.read_text())["step_times_s"][WARMUP:]


def start_daemon(tmp: Path) -> tuple[subprocess.Popen, str]:
    ingest = f"ipc://{tmp}/ingest.sock"
    cmd = [sys.executable, "-m", "telemetry", "daemon", "--ingest", ingest, "--pub", f"ipc://{tmp}/pub.sock",
           "--control", f"ipc://{tmp}/control.sock", "--log-dir", str(tmp / "telemetry"), "--wandb", "disabled"]
    log = open(tmp / "daemon.out", "w")  # a file, not a pipe: a full pipe would stall the daemon
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and p.poll() is None:
        if "telemetry daemon ready" in (tmp / "daemon.out").read_text():
            return p, ingest
        time.sleep(0.1)
    p.kill()
    raise RuntimeError("the telemetry daemon did not become ready:\n" + (tmp / "daemon.out").read_text()[-2000:])


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "step_overhead.json"))
    args = ap.parse_args()
    times: dict[str, list[float]] = {"off": [], "ours": [], "seed": []}
    with tempfile.TemporaryDirectory(prefix="step-overhead-") as d:
        tmp = Path(d)
        daemon, endpoint = start_daemon(tmp)
        try:
            for r in range(args.rounds):
                for v in times:
                    times[v] += run_variant(v, args.steps, tmp, endpoint)
                    print(f"round {r + 1}: {v} done", file=sys.stderr)
        finally:
            daemon.terminate()
            try:
                daemon.wait(timeout=20)
            except subprocess.TimeoutExpired:
                daemon.kill()
        metrics_lines = sum(1 for _ in open(tmp / "telemetry" / "metrics.jsonl")) if (
            tmp / "telemetry" / "metrics.jsonl").is_file() else 0
    base = statistics.median(times["off"])
    result = {"machine": f"{os.cpu_count()}-core CPU", "steps_per_run": args.steps, "rounds": args.rounds,
              "warmup_dropped": WARMUP, "daemon_metrics_lines": metrics_lines, "variants": {}}
    print(f"{'variant':<6} {'n':>5} {'median ms':>10} {'p99 ms':>8} {'vs off':>8}")
    for v, xs in times.items():
        med, p99 = statistics.median(xs), pct(xs, 0.99)
        result["variants"][v] = {"n": len(xs), "median_s": med, "p99_s": p99, "mean_s": statistics.fmean(xs),
                                 "median_vs_off": med / base}
        print(f"{v:<6} {len(xs):>5} {med * 1e3:>10.2f} {p99 * 1e3:>8.2f} {med / base:>8.3f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
