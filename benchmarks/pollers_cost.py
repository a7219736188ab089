"""CPU cost of the daemon's pollers at 1 Hz: 8 GPUs' worth of NVML fields plus the host poller
watching 8 rank processes. Budget: under 1 % of one core.

Two measurements:
  per-poll   N poll_once() calls of each poller, CPU time (time.thread_time) per call; at 1 Hz the
             share of one core is that time x 1 Hz.
  threaded   both pollers on their own threads at 1 Hz for --duration seconds, as in the daemon;
             the process's CPU time (getrusage, the main thread only sleeps) over wall time.

NVML: by default a fake pynvml (testkit/fake_nvml.py) with 8 GPUs, each running one of
the 8 rank pids, so every field and the per-process match are exercised. The fake's calls are
Python functions, so this measures the poller's own overhead, not the driver's ioctl time;
--real-nvml uses the machine's NVML instead (needs a GPU). The host poller is always real psutil,
with 8 real (sleeping) child processes as the ranks.

    .venv/bin/python benchmarks/pollers_cost.py [--duration 30] [--polls 300] [--real-nvml]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

from telemetry.daemon.pollers.config import PollersConfig
from telemetry.daemon.pollers.host import HostPoller
from telemetry.daemon.pollers.nvml import NvmlPoller

NUM_RANKS = 8
NUM_GPUS = 8


def cpu_per_poll_s(poller, n: int) -> float:
    poller.poll_once()  # first poll primes per-process cpu_percent
    t0 = time.thread_time()
    for _ in range(n):
        poller.poll_once()
    return (time.thread_time() - t0) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of threaded polling at 1 Hz")
    ap.add_argument("--polls", type=int, default=300, help="poll_once() calls per poller for the per-poll figure")
    ap.add_argument("--real-nvml", action="store_true", help="use the real NVML instead of the fake")
    ap.add_argument("--out", default="benchmarks/out/pollers_cost.json")
    args = ap.parse_args()

    children = [subprocess.Popen(["sleep", "3600"]) for _ in range(NUM_RANKS)]
    try:
        rank_pids = {r: c.pid for r, c in enumerate(children)}
        if not args.real_nvml:
            sys.path.insert(0, str(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))   # testkit/
            from testkit.fake_nvml import make_fake_pynvml

            fake = make_fake_pynvml(NUM_GPUS)
            for g, pid in zip(fake.gpus, rank_pids.values()):
                g.processes = [(pid, 30 * 10**9), (99_999_999, 10**9)]  # the rank plus a stranger
            sys.modules["pynvml"] = fake
        cfg = PollersConfig(nvml_interval_s=1.0, host_interval_s=1.0)
        nvml, host = NvmlPoller(cfg), HostPoller(cfg)
        for p in (nvml, host):
            p.set_rank_pids(rank_pids)
        if not nvml.poll_once() and nvml.available is False:
            print(f"NVML unavailable: {nvml.unavailable_reason}", file=sys.stderr)
            return 1
        nvml_fields = sum(len(r["values"]) for r in nvml.poll_once())
        host_fields = len(host.poll_once()[0]["values"])

        nvml_s = cpu_per_poll_s(nvml, args.polls)
        host_s = cpu_per_poll_s(host, args.polls)

        emitted = []
        ru0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        for p in (nvml, host):
            p.start(emitted.append)
        time.sleep(args.duration)
        for p in (nvml, host):
            p.close()
        ru1, wall_s = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - w0
        proc_cpu_s = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        result = {
            "machine": f"{platform.node()} {os.cpu_count()}-core {platform.machine()}, Python {platform.python_version()}",
            "nvml": "real" if args.real_nvml else f"fake pynvml, {NUM_GPUS} GPUs",
            "num_ranks": NUM_RANKS, "cpu_count": os.cpu_count(),
            "nvml_fields_per_poll": nvml_fields, "host_fields_per_poll": host_fields,
            "nvml_cpu_ms_per_poll": nvml_s * 1e3, "host_cpu_ms_per_poll": host_s * 1e3,
            "per_poll_percent_of_core_at_1hz": (nvml_s + host_s) * 100.0,
            "threaded_duration_s": wall_s, "threaded_num_records": len(emitted),
            "threaded_process_cpu_s": proc_cpu_s,
            "threaded_percent_of_core": proc_cpu_s / wall_s * 100.0,
            "threaded_poll_thread_cpu_s": nvml.poll_cpu_s + host.poll_cpu_s,
        }
    finally:
        for c in children:
            c.kill()
            c.wait()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    ok = max(result["per_poll_percent_of_core_at_1hz"], result["threaded_percent_of_core"]) < 1.0
    print(f"budget (< 1 % of one core): {'met' if ok else 'MISSED'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
