"""What `tm.log()` costs a training loop at its own cadence: a base commit against the working tree,
side by side in one run, each measured against the raw floor in the same process.

A training loop calls log() once per step, after milliseconds to seconds of other work; back to
back calls (benchmarks/client_cost.py, log_cost_ab.py) keep every cache and ZeroMQ's I/O thread
hot and say little about that. Each child process (one per version, alternately, the order
flipping every round: benchmarks/ab.py) runs these cadences, one record of 10 Python floats per
step:

    back to back   no work between calls
    busy 1 ms      ~1 ms of pure-Python work between calls (holds the GIL: the worst case for a
                   sender thread, which must take the GIL from it to run)
    numpy 1 ms     ~1 ms of 128x128 matrix products between calls (BLAS on one thread, the GIL
                   released while it runs; skipped without numpy)
    sleep 1 ms     time.sleep(0.001) between calls (the caller's thread waits on I/O or a device)
    busy 100 ms    ~100 ms of pure-Python work between calls
    sleep 100 ms   time.sleep(0.1) between calls

and at each, in blocks that alternate within the process (so load from other processes hits
all alike):

    raw      the floor: msgpack.Packer.pack of the record tuple + PUSH send(NOBLOCK), on the
             caller's thread
    ours     TelemetryClient.log(step, values)
    encode   the raw floor's encode alone (no send): what a call that encodes on the caller's
             thread cannot go below at that cadence (caches cold after the step)
    none     no call: the step alone

Reported per cadence and variant: the call's median and p99 (ns, perf_counter_ns around the call
only); the CPU time one call costs the whole process (time.process_time_ns over the block, every
thread included: the caller, a sender thread, ZeroMQ's I/O thread; minus the `none` block's, per
call; each block ends with 20 ms of sleep inside its CPU window, so work a thread does after the
last call counts), and how much of it the caller's own thread spent (time.thread_time_ns: the rest
is the sender thread's and ZeroMQ's I/O thread's); and for the busy and numpy cadences, the step's
own time (the fixed work, timed): what the calls and any thread take from a compute-bound training
thread.

Then, in fresh interpreters: start-up (import telemetry + TelemetryClient(), in-process), and the
wall time of a whole script that only makes a client, with no daemon at the endpoint, against
`python -c pass` (what a script's exit waits for).

    .venv/bin/python -m benchmarks.log_cadence_ab [--base HEAD~1] [--rounds 2] [--scale 1] [--cadences WORDS] [--json OUT]
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

from benchmarks.ab import alternate, base_and_sink

CHILD = r"""
import json, os, sys, time
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # the numpy step: one core, as one rank's own
import msgpack, zmq
from telemetry import TelemetryClient

endpoint, scale, only = sys.argv[1], float(sys.argv[2]), sys.argv[3]
daemon_pid = int(sys.argv[4]) if len(sys.argv) > 4 else 0
pc, tns = time.perf_counter_ns, time.time_ns

def daemon_cpu():
    # The receiving daemon's CPU time, every thread (ns: /proc/<pid>/task/*/schedstat): the
    # other side of each record's cost (its I/O thread and recv, or its polls of a ring).
    total = 0
    for t in os.listdir(f"/proc/{daemon_pid}/task"):
        try:
            with open(f"/proc/{daemon_pid}/task/{t}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass
    return total

cpu = (lambda: time.process_time_ns() + daemon_cpu()) if daemon_pid else time.process_time_ns
tm = TelemetryClient(endpoint, sndhwm=200_000)
ctx = zmq.Context(); sock = ctx.socket(zmq.PUSH); sock.setsockopt(zmq.SNDHWM, 200_000); sock.connect(endpoint)
packer, send, NOBLOCK = msgpack.Packer(use_bin_type=True), sock.send, zmq.NOBLOCK

def raw(step, values):
    try:
        send(packer.pack((2, 1, 12345, 0, step, 0, tns(), step, values)), NOBLOCK)
    except zmq.Again:
        pass

def encode(step, values):
    packer.pack((2, 1, 12345, 0, step, 0, tns(), step, values))

def none(step, values):
    pass

VARIANTS = {"raw": raw, "ours": tm.log, "encode": encode, "none": none}
tcpu = time.thread_time_ns

def spin(n):
    x = 0
    for i in range(n):
        x += i * i
    return x

t0 = pc(); spin(100_000); per_ms = int(100_000 * 1e6 / (pc() - t0))   # iterations in ~1 ms
try:
    import numpy as np
    a = np.random.default_rng(0).random((128, 128)); b = a.T.copy()
    t0 = pc(); [a @ b for _ in range(50)]; mm_per_ms = max(1, int(50 * 1e6 / (pc() - t0)))

    def numpy_step():
        for _ in range(mm_per_ms):
            a @ b                      # BLAS: the GIL released while it runs
except ImportError:
    numpy_step = None
CADENCES = {  # name: (gap, calls per block, rounds)
    "back to back": (None, int(20_000 * scale), 3),
    "busy 1 ms": (lambda: spin(per_ms), int(300 * scale), 3),
    "sleep 1 ms": (lambda: time.sleep(0.001), int(300 * scale), 3),
    **({"numpy 1 ms": (numpy_step, int(300 * scale), 3)} if numpy_step else {}),
    "busy 100 ms": (lambda: spin(100 * per_ms), int(12 * scale), 3),
    "sleep 100 ms": (lambda: time.sleep(0.1), int(12 * scale), 3),
}
CADENCES = {k: v for k, v in CADENCES.items() if not only or any(w in k for w in only.split(","))}
values = [{f"train/m{j}": 1.0 / (i + j + 1) for j in range(10)} for i in range(1000)]
for i in range(2000):                                    # warm-up: imports, first sends
    tm.log(i, values[i % 1000]); raw(i, values[i % 1000])
time.sleep(0.2)
out = {}
for cname, (gap, k, rounds) in CADENCES.items():
    ns = {v: [] for v in VARIANTS}; step_ns = {v: [] for v in VARIANTS}; cpu_ns = {v: 0 for v in VARIANTS}
    own_ns = {v: 0 for v in VARIANTS}
    order = list(VARIANTS)
    for r in range(rounds):
        for v in order[r % len(order):] + order[:r % len(order)]:
            fn, calls, steps = VARIANTS[v], ns[v], step_ns[v]
            c0 = cpu(); o0 = tcpu()
            for i in range(k):
                if gap is not None:
                    g0 = pc(); gap(); steps.append(pc() - g0)
                vals = values[i % 1000]
                t0 = pc(); fn(i, vals); calls.append(pc() - t0)
            time.sleep(0.02)
            cpu_ns[v] += cpu() - c0; own_ns[v] += tcpu() - o0
    res = {}
    for v in VARIANTS:
        s = sorted(ns[v]); n = len(s)
        res[v] = {"median_ns": s[n // 2], "p99_ns": s[min(n - 1, int(n * 0.99))], "calls": n,
                  "cpu_per_call_ns": (cpu_ns[v] - cpu_ns["none"]) / n,
                  "caller_cpu_per_call_ns": (own_ns[v] - own_ns["none"]) / n}
        if steps := sorted(step_ns[v]):
            res[v]["step_median_ns"] = steps[len(steps) // 2]
            res[v]["step_mean_ns"] = sum(steps) / len(steps)
    out[cname] = res
tm.close(timeout_s=5.0)
sock.close(linger=1000); ctx.term()
print(json.dumps({"cadences": out, "loadavg": os.getloadavg()}))
"""

STARTUP = r"""
import json, sys, time
t0 = time.perf_counter()
import telemetry
tm = telemetry.TelemetryClient(sys.argv[1])
print(json.dumps({"startup_ms": (time.perf_counter() - t0) * 1000}))
"""


def _script_wall_ms(tree: Path, code: str, args: list[str]) -> tuple[float, dict]:
    env = {**os.environ, "PYTHONPATH": str(tree), "TELEMETRY_AUTOSTART": "0"}
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-W", "ignore", "-c", code, *args], env=env, cwd=tree,
                       capture_output=True, text=True, timeout=120)
    wall = (time.perf_counter() - t0) * 1000
    if p.returncode != 0:
        raise RuntimeError(p.stderr)
    lines = p.stdout.strip().splitlines()
    return wall, (json.loads(lines[-1]) if lines else {})


def startup_and_exit(trees: dict[str, Path], endpoint: str, repeats: int) -> dict[str, dict]:
    """Per version: start-up in-process with a receiver at `endpoint`, and a whole script's wall
    time with no daemon at all, minus `python -c pass`'s (alternating versions)."""
    nowhere = f"ipc://{tempfile.mkdtemp(prefix='no-daemon-')}/ingest.sock"
    res: dict[str, dict] = {name: {"startup_ms": [], "exit_extra_ms": []} for name in trees}
    for r in range(repeats):
        for name in (list(trees) if r % 2 == 0 else list(reversed(trees))):
            tree = trees[name]
            _, out = _script_wall_ms(tree, STARTUP, [endpoint])
            res[name]["startup_ms"].append(out["startup_ms"])
            bare, _ = _script_wall_ms(tree, "pass", [])
            wall, _ = _script_wall_ms(tree, STARTUP, [nowhere])
            res[name]["exit_extra_ms"].append(wall - bare)
    return {name: {k: statistics.median(v) for k, v in d.items()} for name, d in res.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="HEAD", help="the commit to compare with (default HEAD)")
    ap.add_argument("--rounds", type=int, default=2, help="child processes per version")
    ap.add_argument("--scale", type=float, default=1.0, help="calls per block, times this")
    ap.add_argument("--startup-repeats", type=int, default=7)
    ap.add_argument("--cadences", default="", metavar="WORDS",
                    help="only the cadences whose name has one of these comma-separated words (e.g. '100 ms,sleep 1')")
    ap.add_argument("--daemon", action="store_true",
                    help="send to a real daemon of the working tree (it reads rings, which clients of a version "
                         "with rings then write; TELEMETRY_TRANSPORT=zmq keeps them on the socket), not a bare PULL "
                         "socket; the CPU per call then includes the daemon's (every thread)")
    ap.add_argument("--json", metavar="OUT")
    a = ap.parse_args(argv)
    load_start = os.getloadavg()
    with base_and_sink(a.base, lambda tmp: f"ipc://{tmp}/sink.sock", daemon=a.daemon) as (trees, endpoint, pid):
        out = alternate(trees, a.rounds, CHILD, [endpoint, str(a.scale), a.cadences] + ([str(pid)] if a.daemon else []),
                        lambda res: "load %.1f" % res["loadavg"][0])
        if out is None:
            return 1
        boot = startup_and_exit(trees, endpoint, a.startup_repeats)
    # Per version, cadence and variant: the median over the child processes.
    summary: dict[str, dict] = {}
    for name, runs in out.items():
        summary[name] = {}
        for cad in runs[0]["cadences"]:
            summary[name][cad] = {v: {k: statistics.median(run["cadences"][cad][v][k] for run in runs)
                                      for k in runs[0]["cadences"][cad][v]}
                                  for v in runs[0]["cadences"][cad]}
    print(f"\n{os.cpu_count()} CPUs, load average at start {load_start[0]:.1f}, at end {os.getloadavg()[0]:.1f}; "
          f"medians over {a.rounds} processes per version; sink: {'a daemon' if a.daemon else 'a PULL socket'}"
          f"{' (CPU per call: the process and the daemon)' if a.daemon else ''}")
    print("| version | cadence | raw median µs | raw p99 µs | tm.log median µs | tm.log p99 µs | median ratio | "
          "p99 ratio | CPU/call raw µs | CPU/call tm.log µs | of which its caller's thread µs | "
          "encode alone median µs | step µs none / raw / tm.log |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name, cads in summary.items():
        for cad, r in cads.items():
            raw, ours, none = r["raw"], r["ours"], r["none"]
            step = ""
            if "step_median_ns" in none:
                step = " / ".join(f"{x['step_median_ns'] / 1000:.1f}" for x in (none, raw, ours))
            print(f"| {name} | {cad} | {raw['median_ns'] / 1000:.2f} | {raw['p99_ns'] / 1000:.2f} | "
                  f"{ours['median_ns'] / 1000:.2f} | {ours['p99_ns'] / 1000:.2f} | "
                  f"{ours['median_ns'] / raw['median_ns']:.2f} | {ours['p99_ns'] / raw['p99_ns']:.2f} | "
                  f"{raw['cpu_per_call_ns'] / 1000:.2f} | {ours['cpu_per_call_ns'] / 1000:.2f} | "
                  f"{ours['caller_cpu_per_call_ns'] / 1000:.2f} | {r['encode']['median_ns'] / 1000:.2f} | {step} |")
    print("\n| version | start-up (import + TelemetryClient()) ms | a script's extra wall time, no daemon, ms |")
    print("|---|---:|---:|")
    for name, b in boot.items():
        print(f"| {name} | {b['startup_ms']:.1f} | {b['exit_extra_ms']:.0f} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"runs": out, "summary": summary, "startup": boot,
                                            "loadavg_start": load_start, "loadavg_end": os.getloadavg()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
