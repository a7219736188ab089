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

`--ab BASE` instead compares a base commit with the working tree in one run (benchmarks/ab.py:
a worktree of BASE, one receiving process, short child processes alternating per round): each
child times `wandb.log` of 10 floats with its version's telemetry.wandb, then the real
wandb.log (offline) in the same process, and the ratio of the two. With `--daemon` the receiver
is a real daemon of the working tree: a client of a version with record rings writes its ring
(the default beside a local daemon), not the socket.

    .venv/bin/python benchmarks/wandb_dropin.py [--calls 5000] [--init 5] [--json OUT]
    .venv/bin/python benchmarks/wandb_dropin.py --ab HEAD~1 [--rounds 5] [--calls 20000] [--daemon]
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


# --ab's child: runs in a fresh interpreter with PYTHONPATH at one version's tree.
_AB_CHILD = r"""
import json, os, sys, tempfile, time
endpoint, calls, warmup = sys.argv[1], int(sys.argv[2]), 2000
os.environ.update({"TELEMETRY_ENDPOINT": endpoint, "WANDB_SILENT": "true", "WANDB_CONSOLE": "off",
                   "WANDB_MODE": "offline"})
keys = [f"train/metric_{i}" for i in range(10)]
rows = [{k: 1.0 / (s + j + 1) for j, k in enumerate(keys)} for s in range(calls + warmup)]
now = time.perf_counter_ns


def timed(log, n):
    for s in range(warmup):
        log(rows[s])
    ns = []
    for s in range(warmup, warmup + n):
        t0 = now(); log(rows[s]); ns.append(now() - t0)
    ns.sort()
    return ns[len(ns) // 2], ns[int(len(ns) * 0.99)]


import telemetry.wandb as ours
ours.init(project="bench", name="ab")
med, p99 = timed(ours.log, calls)
ours.finish()
import wandb
with tempfile.TemporaryDirectory() as tmp:
    run = wandb.init(mode="offline", dir=tmp, project="bench",
                     settings=wandb.Settings(silent=True, console="off", x_disable_stats=True))
    real_med, _ = timed(run.log, min(calls, 5000))
    run.finish()
print(json.dumps({"median": med, "p99": p99, "real_median": real_med}))
"""


def main_ab(base: str, rounds: int, calls: int, out: Path | None, daemon: bool = False) -> int:
    import statistics

    from ab import alternate, base_and_sink

    with base_and_sink(base, lambda tmp: f"ipc://{tmp}/sink.sock", daemon=daemon) as (trees, endpoint, _):
        got = alternate(trees, rounds, _AB_CHILD, [endpoint, str(calls)],
                        lambda r: f"median {r['median'] / 1000:.2f} µs, p99 {r['p99'] / 1000:.2f} µs, "
                                  f"real wandb.log {r['real_median'] / 1000:.1f} µs "
                                  f"({r['real_median'] / r['median']:.1f}x)")
    if got is None:
        return 1
    summary = {}
    for name, rs in got.items():
        med = statistics.median(r["median"] for r in rs) / 1000
        real = statistics.median(r["real_median"] for r in rs) / 1000
        summary[name] = {"median_us": med, "p99_us": statistics.median(r["p99"] for r in rs) / 1000,
                         "real_median_us": real, "times_cheaper": real / med}
        print(f"{name:>20}: wandb.log of 10 floats {med:.2f} µs (p99 {summary[name]['p99_us']:.2f}), "
              f"real wandb.log {real:.1f} µs: {real / med:.1f}x cheaper (medians over {rounds} rounds)")
    if out:
        out.write_text(json.dumps({"rounds": got, "summary": summary}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=5000, help="timed calls per row")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--init", type=int, default=0, metavar="N", help="also time wandb.init N times each")
    ap.add_argument("--ab", metavar="BASE", help="compare commit BASE with the working tree instead (10 floats)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of --ab")
    ap.add_argument("--daemon", action="store_true",
                    help="--ab's receiver a real daemon of the working tree (its clients write record rings), "
                         "not a bare PULL socket")
    args = ap.parse_args(argv)
    if args.ab:
        return main_ab(args.ab, args.rounds, args.calls, args.json, args.daemon)
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
