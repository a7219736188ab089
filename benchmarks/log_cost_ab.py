"""What `TelemetryClient.log()` costs the caller: a base commit against the working tree, side by
side in one run. Each round runs one short process per version, alternately (the order flips
every round), each timing --calls log() calls of 10 Python floats (after a warm-up) against one
receiving process that drains the socket, as the daemon would. The base is a `git worktree` of
--base in a temporary directory (its C parts built there: benchmarks/ab.py). Reported: per
version, the median over the rounds of each round's median and p99 (ns per call), and the
ratios.

    .venv/bin/python -m benchmarks.log_cost_ab [--base HEAD] [--rounds 7] [--calls 20000]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from benchmarks.ab import alternate, base_and_sink

# Runs in a fresh interpreter with PYTHONPATH at one version's tree.
CHILD = r"""
import json, sys, time
from telemetry import TelemetryClient
endpoint, calls, warmup = sys.argv[1], int(sys.argv[2]), 2000
tm = TelemetryClient(endpoint, sndhwm=1_000_000)
log, now = tm.log, time.perf_counter_ns
values = [{f"train/m{i}": float(s + i) for i in range(10)} for s in range(calls + warmup)]
for s in range(warmup):
    log(s, values[s])
ns = []
for s in range(warmup, warmup + calls):
    t0 = now(); log(s, values[s]); ns.append(now() - t0)
tm.close(timeout_s=5.0)
ns.sort()
print(json.dumps({"median": ns[len(ns) // 2], "p99": ns[int(len(ns) * 0.99)], "sent": tm.stats()["sent"]}))
"""

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="HEAD", help="the commit to compare with (default HEAD)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--json", metavar="OUT")
    a = ap.parse_args(argv)
    with base_and_sink(a.base, lambda tmp: f"ipc://{tmp}/sink.sock") as (trees, endpoint):
        out = alternate(trees, a.rounds, CHILD, [endpoint, str(a.calls)],
                        lambda res: f"median {res['median']:,} ns, p99 {res['p99']:,} ns")
        if out is None:
            return 1
    summary = {}
    for name, rows in out.items():
        summary[name] = {"median_ns": statistics.median(x["median"] for x in rows),
                         "p99_ns": statistics.median(x["p99"] for x in rows)}
        print(f"{name:>16}: median {summary[name]['median_ns']:,.0f} ns, p99 {summary[name]['p99_ns']:,.0f} ns "
              f"(medians over {a.rounds} rounds)")
    b, w = summary[f"base {a.base}"], summary["working tree"]
    print(f"ratio (working tree / base): median {w['median_ns'] / b['median_ns']:.3f}, "
          f"p99 {w['p99_ns'] / b['p99_ns']:.3f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"rounds": out, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
