"""What one logging call costs the training thread: our client against the loggers people use.

Every logger gets the same workload, one step of 10 scalars per call, and is timed per call
with perf_counter_ns on the caller's thread (after a warm-up), in one process, one after the
other. The record receiver is a separate process, as the daemon is: a receiver thread in this
process would fight the caller for the GIL and inflate every figure.

    ours (floats)        TelemetryClient.log(step, {10 Python floats})
    ours (CPU tensors)   TelemetryClient.log(step, {10 CPU 0-dim tensors}): the deferred path
    ours, paced          the same, but between two timed calls the sender thread finishes the
                         previous record (untimed), as between two training steps; back to back,
                         tensor records outrun the sender, which then drops (counted) and
                         competes with the caller for the GIL
    raw pyzmq (floor)    msgspec encode of the same record tuple + PUSH send(NOBLOCK)
    wandb.log            wandb 'offline' mode, run dir in a temp dir
    TensorBoard          SummaryWriter.add_scalar x10
    MLflow async         mlflow.log_metrics(..., synchronous=False), local file store

Then the start-up cost, each in a fresh interpreter: `import telemetry` + TelemetryClient()
(connect + hello) against `import wandb` + wandb.init(mode="offline").

    .venv/bin/python benchmarks/client_cost.py [--calls 20000] [--json OUT]
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
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent

KEYS = ["train/loss", "train/lr", "train/grad_norm", "train/epoch", "perf/step_time",
        "perf/tokens_per_second", "perf/samples_per_second", "perf/mfu", "memory/allocated_gb",
        "perf/data_loading_time"]
WARMUP_CALLS = 2000
PACED_CALLS = 5000

# The receiver: a bare PULL socket in its own process that counts what it gets.
_SINK = r"""
import sys, zmq
ctx = zmq.Context(); s = ctx.socket(zmq.PULL); s.setsockopt(zmq.RCVHWM, 0)
port = s.bind_to_random_port("tcp://127.0.0.1"); print(port, flush=True)
n = 0
poller = zmq.Poller(); poller.register(s, zmq.POLLIN); poller.register(sys.stdin, zmq.POLLIN)
while True:
    ev = dict(poller.poll())
    if s in ev:
        while True:
            try: s.recv(zmq.NOBLOCK); n += 1
            except zmq.Again: break
    if sys.stdin.fileno() in ev or sys.stdin in ev:
        sys.stdin.readline(); print(n, flush=True)
"""


def _steps(num_calls: int) -> list[dict[str, float]]:
    # Distinct values per step, built before timing: every logger needs the dict anyway.
    return [{k: 1.0 / (i + j + 1) for j, k in enumerate(KEYS)} for i in range(num_calls)]


def time_calls(fn: Callable[[int, Any], None], steps: list[Any], warmup: int = WARMUP_CALLS,
               settle: Callable[[], None] | None = None) -> list[int]:
    """Per-call nanoseconds of fn(step, values) over `steps`, after `warmup` untimed calls;
    `settle` (untimed) runs after each call."""
    for i in range(warmup):
        fn(i, steps[i % len(steps)])
        if settle is not None:
            settle()
    pc = time.perf_counter_ns
    out = [0] * len(steps)
    for i, values in enumerate(steps):
        t0 = pc()
        fn(i, values)
        out[i] = pc() - t0
        if settle is not None:
            settle()
    return out


def summarize(ns: list[int]) -> dict[str, float]:
    s = sorted(ns)
    return {"median_us": s[len(s) // 2] / 1000, "p99_us": s[int(len(s) * 0.99)] / 1000,
            "mean_us": statistics.fmean(s) / 1000, "calls": len(s)}


def bench_ours(endpoint: str, steps: list[dict], tensors: bool, paced: bool = False) -> tuple[dict, dict]:
    """Our client. `paced`: between two timed calls, wait (untimed) until the sender thread
    has sent the previous record, as in a training loop where a step takes milliseconds;
    unpaced, the tensor path's sender competes with the caller for the GIL on every call."""
    from telemetry import TelemetryClient

    tm = TelemetryClient(endpoint, sndhwm=1_000_000)
    log = tm.log
    if tensors:
        import torch

        # Fresh tensors per step would time torch.tensor(); one set reused is what a loop
        # that keeps its accumulators on device does.
        ts = {k: torch.tensor(v) for k, v in steps[0].items()}
        steps = [ts] * len(steps)
    if paced:
        steps = steps[:PACED_CALLS]  # each waits for the sender's next poll (~2 ms)
        pending = tm._deferred.pending

        def settle() -> None:
            # Yield the GIL (sleep(0)) until the sender has sent, then a little longer so it is
            # back asleep, as between two training steps. A call after such a pause is several
            # times slower than back to back on this box, floats too (cold caches once other
            # threads ran): compare a paced row with the other paced row only.
            while pending():
                time.sleep(0)
            t_end = time.perf_counter_ns() + 100_000
            while time.perf_counter_ns() < t_end:  # holding the GIL: the caller stays hot
                pass
        res = summarize(time_calls(log, steps, settle=settle))
    else:
        res = summarize(time_calls(log, steps))
    tm.close(timeout_s=5.0)
    return res, tm.stats()


def bench_floor_and_ours(endpoint: str, steps: list[dict], rounds: int = 10) -> tuple[dict, dict, dict, dict]:
    """The raw pyzmq floor and our client with floats, interleaved in `rounds` blocks, so that
    load from other processes on a shared box hits both alike (their p99s are load-bound)."""
    import msgspec
    import zmq

    from telemetry import TelemetryClient

    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, 1_000_000)
    sock.connect(endpoint)
    enc = msgspec.msgpack.Encoder()
    import msgpack

    packer = msgpack.Packer(use_bin_type=True)
    send, NOBLOCK, tns = sock.send, zmq.NOBLOCK, time.time_ns

    def raw(step: int, values: dict) -> None:
        try:
            send(enc.encode((2, 1, 12345, 0, step, 0, tns(), step, values)), NOBLOCK)
        except zmq.Again:
            pass

    def raw_msgpack(step: int, values: dict) -> None:
        # The same floor with the encoder our client uses (msgpack: cheaper to import).
        try:
            send(packer.pack((2, 1, 12345, 0, step, 0, tns(), step, values)), NOBLOCK)
        except zmq.Again:
            pass

    tm = TelemetryClient(endpoint, sndhwm=1_000_000)
    per = max(1, len(steps) // rounds)
    ns: dict[str, list[int]] = {"raw": [], "raw_msgpack": [], "ours": []}
    for r in range(rounds):
        block = steps[r * per:(r + 1) * per]
        ns["raw"] += time_calls(raw, block, warmup=WARMUP_CALLS // rounds)
        ns["raw_msgpack"] += time_calls(raw_msgpack, block, warmup=WARMUP_CALLS // rounds)
        ns["ours"] += time_calls(tm.log, block, warmup=WARMUP_CALLS // rounds)
    sock.close(linger=2000)
    ctx.term()
    tm.close(timeout_s=5.0)
    return summarize(ns["raw"]), summarize(ns["raw_msgpack"]), summarize(ns["ours"]), tm.stats()


def bench_wandb(tmp: Path, steps: list[dict]) -> dict:
    os.environ["WANDB_MODE"] = "offline"
    os.environ["WANDB_DIR"] = str(tmp)
    os.environ["WANDB_SILENT"] = "true"
    import wandb

    run = wandb.init(mode="offline", dir=str(tmp), project="client-cost")
    res = summarize(time_calls(lambda step, values: run.log(values, step=step), steps))
    run.finish()
    return res


def bench_tensorboard(tmp: Path, steps: list[dict]) -> dict:
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(tmp / "tb"))

    def log(step: int, values: dict) -> None:
        for k, v in values.items():
            w.add_scalar(k, v, step)

    res = summarize(time_calls(log, steps))
    w.close()
    return res


def bench_mlflow(tmp: Path, steps: list[dict]) -> dict:
    # The file store is what the issue asks for (local, no server); MLflow 3 keeps it behind this.
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    import mlflow

    mlflow.set_tracking_uri((tmp / "mlruns").as_uri())
    mlflow.start_run()
    res = summarize(time_calls(lambda step, values: mlflow.log_metrics(values, step=step, synchronous=False),
                               steps))
    mlflow.end_run()
    return res


def startup(code: str, repeats: int) -> dict:
    """Median wall time of `code` (prints its own seconds) in fresh interpreters, our modules
    compiled to bytecode first (ab.compile_bytecode)."""
    from benchmarks.ab import compile_bytecode      # ROOT is on sys.path (PYTHONPATH, the install)

    compile_bytecode(ROOT)
    times = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(out.stderr)
        times.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {"median_ms": statistics.median(t["s"] for t in times) * 1000,
            "runs_ms": [round(t["s"] * 1000, 1) for t in times], "extra": times[-1].get("extra")}


_OURS_STARTUP = """
import time, json, sys
{pre}
t0 = time.perf_counter()
import telemetry
from telemetry import TelemetryClient
tm = TelemetryClient({ep!r})
t1 = time.perf_counter()
tm.close(timeout_s=1.0)
print(json.dumps({{"s": t1 - t0, "extra": {{"torch_in_sys_modules": "torch" in sys.modules}}}}))
"""
_WANDB_STARTUP = """
import time, json, os
{pre}
t0 = time.perf_counter()
import wandb
t1 = time.perf_counter()
run = wandb.init(mode="offline", dir={tmp!r}, project="client-cost")
t2 = time.perf_counter()
run.finish()
print(json.dumps({{"s": t2 - t0, "extra": {{"import_s": t1 - t0, "init_s": t2 - t1}}}}))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=20_000, help="timed calls per logger")
    ap.add_argument("--startup-repeats", type=int, default=5)
    ap.add_argument("--skip", default="", help="comma list of: wandb,tensorboard,mlflow,startup")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))

    sink = subprocess.Popen([sys.executable, "-c", _SINK], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    endpoint = f"tcp://127.0.0.1:{sink.stdout.readline().strip()}"
    steps = _steps(args.calls)
    results: dict[str, Any] = {"conditions": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg(),
                                              "calls": args.calls, "python": sys.version.split()[0]}}
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        (rows["raw pyzmq + msgspec (floor)"], rows["raw pyzmq + msgpack (floor, our encoder)"],
         rows["ours, 10 floats"], st_f) = bench_floor_and_ours(endpoint, steps)
        rows["ours, 10 CPU 0-dim tensors"], st_t = bench_ours(endpoint, steps, tensors=True)
        rows["ours, 10 floats, paced"], st_fp = bench_ours(endpoint, steps, tensors=False, paced=True)
        rows["ours, 10 CPU 0-dim tensors, paced"], st_tp = bench_ours(endpoint, steps, tensors=True,
                                                                      paced=True)
        results["ours_stats"] = {"floats": st_f, "tensors": st_t, "floats_paced": st_fp,
                                 "tensors_paced": st_tp}
        baselines = {"wandb": ("wandb.log (offline)", bench_wandb),
                     "tensorboard": ("TensorBoard add_scalar x10", bench_tensorboard),
                     "mlflow": ("MLflow log_metrics async", bench_mlflow)}
        for key, (name, bench) in baselines.items():
            if key in skip:
                continue
            try:
                rows[name] = bench(tmp, steps)
            except Exception as exc:  # a baseline that cannot run here is reported, not fatal
                results.setdefault("baseline_errors", {})[name] = repr(exc)
        time.sleep(1.0)  # let the last records arrive
        sink.stdin.write("\n")
        sink.stdin.flush()
        results["sink_received"] = int(sink.stdout.readline())
        sink.kill()
        if "startup" not in skip:
            # Fresh interpreter, and after `import torch` (untimed): a trainer has torch loaded,
            # and with it much of what both clients import (typing, enum, json, re, inspect).
            n_ours, n_wandb = args.startup_repeats, max(1, args.startup_repeats // 2)
            results["startup"] = {
                "ours: import telemetry + TelemetryClient()": startup(
                    _OURS_STARTUP.format(ep=endpoint, pre=""), n_ours),
                "import wandb + wandb.init(offline)": startup(
                    _WANDB_STARTUP.format(tmp=str(tmp), pre=""), n_wandb),
                "ours, torch already imported": startup(
                    _OURS_STARTUP.format(ep=endpoint, pre="import torch"), n_ours),
                "wandb, torch already imported": startup(
                    _WANDB_STARTUP.format(tmp=str(tmp), pre="import torch"), n_wandb),
            }
    results["loggers"] = rows
    results["conditions"]["loadavg_end"] = os.getloadavg()

    wb = rows.get("wandb.log (offline)")
    print(f"per-call cost of one step of 10 scalars, {args.calls} calls each "
          f"({os.cpu_count()} CPUs, load {results['conditions']['loadavg_start'][0]:.2f})")
    print("| logger | median µs | p99 µs | mean µs | wandb / this (median) |")
    print("|---|---:|---:|---:|---:|")
    for name, r in rows.items():
        x = wb["median_us"] / r["median_us"] if wb else None
        ratio = "-" if x is None else (f"{x:.0f}x" if x >= 10 else f"{x:.2f}x")
        print(f"| {name} | {r['median_us']:.2f} | {r['p99_us']:.2f} | {r['mean_us']:.2f} | {ratio} |")
    if "startup" in results:
        print("\n| start-up | median ms | runs ms |")
        print("|---|---:|---|")
        for name, r in results["startup"].items():
            print(f"| {name} | {r['median_ms']:.1f} | {r['runs_ms']} |")
        print("extras:", {k: v["extra"] for k, v in results["startup"].items()})
    if results.get("baseline_errors"):
        print("baselines that failed:", results["baseline_errors"])
    print("ours stats:", results["ours_stats"], "sink received:", results["sink_received"])
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
