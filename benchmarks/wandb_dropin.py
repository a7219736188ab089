"""What `wandb.log` costs the training thread: `import telemetry.wandb as wandb` against the real one.

One process, one after the other, the same workload: `wandb.log({10 values})` with no step (so
each call commits a row and advances W&B's step), timed per call with perf_counter_ns on the
caller's thread after a warm-up. The values are 10 CPU 0-dim tensors (one set reused, as a loop
that keeps its accumulators on device does), then 10 Python floats.

    telemetry.wandb      wandb.init() then wandb.log: flattening, W&B's step rule, then
                         TelemetryClient.log (tensors take its deferred path, read on its sender
                         thread); the receiver is a bare PULL socket in another process, as the
                         daemon is
    telemetry.wandb, paced  the same, but between two timed calls the sender thread finishes the
                         previous record (untimed), as between two training steps
    wandb (offline)      the real wandb.init(mode="offline") then wandb.log

`--init N` also times `wandb.init()` N times each, in fresh processes (imports not counted, as
a script pays them once either way): telemetry.wandb's with no daemon running, so it starts one
for the node and waits for its ready line, W&B offline; and the real wandb.init(mode="offline").

    .venv/bin/python benchmarks/wandb_dropin.py [--calls 5000] [--init 5] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from client_cost import _SINK, KEYS, WARMUP_CALLS, summarize, time_calls  # noqa: E402


def workloads(num_calls: int) -> dict[str, list[dict[str, Any]]]:
    import torch

    floats = [{k: 1.0 / (i + j + 1) for j, k in enumerate(KEYS)} for i in range(num_calls)]
    tensors = {k: torch.tensor(v) for k, v in floats[0].items()}
    return {"10 CPU 0-dim tensors": [tensors] * num_calls, "10 floats": floats}


def bench_ours(endpoint: str, steps: list[dict], paced: bool) -> tuple[dict, dict]:
    os.environ["TELEMETRY_ENDPOINT"] = endpoint
    import telemetry.wandb as wandb

    run = wandb.init(project="bench", name="dropin")
    client = run._client.get()
    settle = None
    if paced:
        pending = client._deferred.pending

        def settle() -> None:
            # As client_cost.py's paced rows: the sender sends the previous record, then back
            # to a hot caller, as between two training steps.
            while pending():
                time.sleep(0)
            t_end = time.perf_counter_ns() + 100_000
            while time.perf_counter_ns() < t_end:
                pass
    res = summarize(time_calls(lambda step, values: wandb.log(values), steps,
                               warmup=min(WARMUP_CALLS, len(steps)), settle=settle))
    stats = client.stats()
    wandb.finish()
    return res, stats


def bench_real(tmp: Path, steps: list[dict]) -> dict:
    os.environ.update({"WANDB_MODE": "offline", "WANDB_DIR": str(tmp), "WANDB_SILENT": "true"})
    import wandb

    run = wandb.init(mode="offline", dir=str(tmp), project="bench",
                     settings=wandb.Settings(silent=True, console="off", x_disable_stats=True))
    res = summarize(time_calls(lambda step, values: run.log(values), steps, warmup=min(WARMUP_CALLS, len(steps))))
    run.finish()
    return res


_INIT = """
import os, sys, time
which = sys.argv[1]
if which == "ours":
    import telemetry.wandb as wandb
else:
    import wandb
t0 = time.perf_counter()
run = wandb.init(project="bench", config={"lr": 0.1})
t1 = time.perf_counter()
wandb.finish()
print("INIT", t1 - t0)
"""


def bench_init(n: int) -> dict:
    """Seconds per wandb.init (median, all), ours starting its daemon, and the real one."""
    out: dict[str, list[float]] = {"ours": [], "real": []}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRY_", "WANDB_"))}
    env.update({"PYTHONPATH": str(ROOT), "WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    for _ in range(n):
        for which in ("ours", "real"):
            with tempfile.TemporaryDirectory() as tmp:
                e = {**env, "WANDB_DIR": tmp, "TELEMETRY_RUNTIME_DIR": os.path.join(tmp, "rt")}
                p = subprocess.run([sys.executable, "-c", _INIT, which], cwd=tmp, env=e, capture_output=True,
                                   text=True, timeout=300)
                line = [ln for ln in p.stdout.splitlines() if ln.startswith("INIT ")]
                if p.returncode != 0 or not line:
                    raise RuntimeError(f"init ({which}) failed: {p.stderr[-2000:]}")
                out[which].append(float(line[0].split()[1]))
    import statistics

    return {w: {"median_s": statistics.median(v), "all_s": [round(x, 3) for x in v]} for w, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=5000, help="timed calls per row")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--init", type=int, default=0, metavar="N", help="also time wandb.init N times each")
    args = ap.parse_args(argv)
    sink = subprocess.Popen([sys.executable, "-c", _SINK], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    endpoint = f"tcp://127.0.0.1:{sink.stdout.readline().strip()}"
    results: dict[str, Any] = {"conditions": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg(),
                                              "calls": args.calls, "python": sys.version.split()[0]}}
    rows: dict[str, dict] = {}
    stats: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp_s:
        for what, steps in workloads(args.calls).items():
            rows[f"telemetry.wandb, {what}"], stats[what] = bench_ours(endpoint, steps, paced=False)
            rows[f"telemetry.wandb, {what}, paced"], stats[what + ", paced"] = bench_ours(endpoint, steps, paced=True)
            rows[f"wandb (offline), {what}"] = bench_real(Path(tmp_s), steps)
        time.sleep(1.0)
        sink.stdin.write("\n")
        sink.stdin.flush()
        results["sink_received"] = int(sink.stdout.readline())
        sink.kill()
    results["rows"] = rows
    if args.init:
        results["init"] = bench_init(args.init)
        for w, r in results["init"].items():
            print(f"wandb.init, {w}: median {r['median_s']:.3f} s  ({r['all_s']})")
    results["ours_stats"] = stats
    results["conditions"]["loadavg_end"] = os.getloadavg()
    print(f"{'wandb.log of one row':58s} {'median µs':>10s} {'p99 µs':>10s}")
    for name, r in rows.items():
        print(f"{name:58s} {r['median_us']:10.1f} {r['p99_us']:10.1f}")
    print(json.dumps({"sink_received": results["sink_received"], "ours_stats": stats,
                      "conditions": results["conditions"]}))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
