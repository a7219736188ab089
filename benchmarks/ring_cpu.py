"""The whole CPU a `tm.log()` costs at a slow cadence, the record ring against the socket: the
caller's process (every thread) and the daemon's (every thread), per call, less each one's CPU
over the same time with no call at all.

At 100 ms between calls, log_cadence_ab.py's blocks hold a few dozen calls, and the daemon's own
timers (its pollers, its status record) cost more than a record: the per-call figure drowns. Here
one daemon (of the working tree) serves one client process per mode in turn, `--calls` calls at
`--gap-ms` apart (time.sleep between them), and an idle block of the same length measures what
the daemon and the process cost with nothing logged; the modes alternate, `--rounds` times.

    .venv/bin/python -m benchmarks.ring_cpu [--calls 300] [--gap-ms 100] [--rounds 2]
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

CHILD = r"""
import json, os, sys, time
endpoint, calls, gap, daemon_pid, idle = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"

def daemon_cpu():
    total = 0
    for t in os.listdir(f"/proc/{daemon_pid}/task"):
        try:
            with open(f"/proc/{daemon_pid}/task/{t}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass
    return total

from telemetry import TelemetryClient
tm = TelemetryClient(endpoint, rank=0)
values = {f"train/m{j}": 1.0 / (j + 1) for j in range(10)}
for i in range(20):
    tm.log(i, values)
time.sleep(0.5)
p0, d0, t0 = time.process_time_ns(), daemon_cpu(), time.perf_counter_ns()
for i in range(calls):
    time.sleep(gap)
    if not idle:
        tm.log(100 + i, values)
time.sleep(0.2)
p1, d1, t1 = time.process_time_ns(), daemon_cpu(), time.perf_counter_ns()
print(json.dumps({"ring": tm._ring is not None, "process_ns": p1 - p0, "daemon_ns": d1 - d0, "wall_ns": t1 - t0}))
tm.close()
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--gap-ms", type=float, default=100.0)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="ring-cpu-"))
    cmd = [sys.executable, "-m", "telemetry", "daemon", "--log-dir", str(tmp / "log"), "--wandb", "disabled",
           "--ingest", f"ipc://{tmp}/i.sock", "--pub", f"ipc://{tmp}/p.sock", "--control", f"ipc://{tmp}/c.sock"]
    with open(tmp / "daemon.out", "w") as out:
        daemon = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while "telemetry daemon ready" not in (tmp / "daemon.out").read_text():
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((tmp / "daemon.out").read_text()[-2000:])
            time.sleep(0.05)
        res: dict[str, list] = {"ring": [], "zmq": [], "idle": []}
        load = [os.getloadavg()[0]]
        for r in range(a.rounds):
            for mode in (("ring", "zmq", "idle") if r % 2 == 0 else ("idle", "zmq", "ring")):
                env = {**os.environ, "PYTHONPATH": str(ROOT), "TELEMETRY_TRANSPORT": "zmq" if mode == "zmq" else "ring"}
                p = subprocess.run([sys.executable, "-c", CHILD, f"ipc://{tmp}/i.sock", str(a.calls),
                                    str(a.gap_ms / 1000), str(daemon.pid), "1" if mode == "idle" else "0"],
                                   env=env, capture_output=True, text=True, timeout=3600, cwd=ROOT)
                if p.returncode != 0:
                    print(p.stderr, file=sys.stderr)
                    return 1
                out = json.loads(p.stdout.strip().splitlines()[-1])
                res[mode].append(out)
                print(f"round {r} {mode}: {json.dumps(out)}", flush=True)
                load.append(os.getloadavg()[0])
        idle_p = statistics.median(x["process_ns"] for x in res["idle"])
        idle_d = statistics.median(x["daemon_ns"] for x in res["idle"])
        print(f"\n{a.calls} calls {a.gap_ms:g} ms apart a block, {a.rounds} rounds; 1-min load {min(load):.1f}-"
              f"{max(load):.1f}; CPU per call less the idle block's (median of rounds), µs:")
        print("| transport | process | daemon | total |")
        print("|---|---:|---:|---:|")
        for mode in ("ring", "zmq"):
            proc = statistics.median(x["process_ns"] for x in res[mode]) - idle_p
            dae = statistics.median(x["daemon_ns"] for x in res[mode]) - idle_d
            print(f"| {mode} | {proc / a.calls / 1000:.1f} | {dae / a.calls / 1000:.1f} | "
                  f"{(proc + dae) / a.calls / 1000:.1f} |")
        print(f"| (idle block: process {idle_p / 1e6:.1f} ms, daemon {idle_d / 1e6:.1f} ms in all) | | | |")
    finally:
        daemon.terminate()
        daemon.wait(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
