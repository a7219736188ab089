"""The ingest queue as one budget (issue 18) against a queue per connection, side by side.

8 rank processes (testkit/faults.py `rank`, the real TelemetryClient) send unpaced into
one daemon, alternating round by round between:

    shared budget     the default: rcvhwm 10,485,760 shared by max_connections 1,024 (10,240
                      records a connection)
    per connection    what the daemon did before: 1,000,000 records a connection (rcvhwm
                      1,024 x 1,000,000 shared by the same 1,024 connections)

Reported per variant (medians over the rounds): the records the daemon took in per second while
the ranks sent, the share the clients dropped (counted) under the overload, the daemon's peak RSS,
and whether every record was received or counted lost.

    .venv/bin/python -m benchmarks.queue_budget [--rounds 3] [--n 40000] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

from testkit import faults

VARIANTS = {"shared budget": {"rcvhwm": 10 * 1024 * 1024, "max_connections": 1024},
            "per connection": {"rcvhwm": 1_000_000 * 1024, "max_connections": 1024}}


def one(variant: str, n: int) -> dict:
    peak = [0.0]
    stop = threading.Event()
    launched = faults.launch

    def watch(d) -> None:      # the daemon's RSS, sampled every 50 ms while the round runs
        while not stop.is_set():
            try:
                with open(f"/proc/{d.proc.pid}/status") as f:
                    for line in f:
                        if line.startswith("VmRSS:"):
                            peak[0] = max(peak[0], int(line.split()[1]) / 1024)
            except OSError:
                return
            time.sleep(0.05)

    def launch_and_watch(*a, **k):
        d = launched(*a, **k)
        threading.Thread(target=watch, args=(d,), daemon=True).start()
        return d

    faults.launch = launch_and_watch
    try:
        cfg = VARIANTS[variant]
        r = faults.load(Path(tempfile.mkdtemp(prefix="budget-")), num_ranks=8, n=n, rate=0, sndhwm=10_000,
                        rcvhwm=cfg["rcvhwm"], max_connections=cfg["max_connections"], name=variant)
    finally:
        faults.launch = launched
        stop.set()
    per = r["per_rank"].values()
    tried = sum(f["tried"] for f in per)
    received = sum(f["received"] for f in per)
    return {"received_per_s": received / r["send_s"], "client_dropped_share": sum(f["dropped"] for f in per) / tried,
            "peak_rss_mb": peak[0], "all_counted": all(f["lost"] == f["tried"] - f["received"] for f in per)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--n", type=int, default=40_000, help="records per rank")
    p.add_argument("--json", metavar="OUT")
    a = p.parse_args(argv)
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for i in range(a.rounds):
        order = list(VARIANTS) if i % 2 == 0 else list(reversed(VARIANTS))
        for v in order:
            runs[v].append(one(v, a.n))
            print(f"round {i + 1}/{a.rounds} {v}: {runs[v][-1]}", flush=True)
    out = {v: {k: (statistics.median(x[k] for x in rs) if k != "all_counted" else all(x[k] for x in rs))
               for k in rs[0]} for v, rs in runs.items()}
    print(f"\n{'variant':<16} {'taken in rec/s':>15} {'client drops':>13} {'peak RSS MB':>12} {'all counted':>12}")
    for v, r in out.items():
        print(f"{v:<16} {r['received_per_s']:>15,.0f} {r['client_dropped_share']:>12.1%} {r['peak_rss_mb']:>12.0f} "
              f"{str(r['all_counted']):>12}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
