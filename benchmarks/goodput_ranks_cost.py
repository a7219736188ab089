"""What the goodput ledger costs a step with and without the daemon's per-rank records: the
ledger (telemetry/shared/goodput.py) fed a synthetic run of --steps aggregated steps, each after
--ranks per-rank records (0: none, the default daemon), --passes times; the median us per step.

    .venv/bin/python -m benchmarks.goodput_ranks_cost [--ranks 0 8] [--steps 20000] [--passes 7]
"""
from __future__ import annotations

import argparse
import statistics
import time

from telemetry.shared.goodput import Ledger

T0 = 1.8e9


def stream(ranks: int, steps: int) -> list[dict]:
    recs = [{"kind": "hello", "t": T0, "rank": r, "info": {"rank": r, "started_at": T0 - 5}} for r in range(max(ranks, 1))]
    for s in range(1, steps + 1):
        t = T0 + s * 0.1
        for r in range(ranks):
            recs.append({"kind": "metrics", "t": t, "step": s, "rank": r,
                         "values": {"perf/step_time": 0.1, "perf/data_loading_time": 0.01, "perf/forward_time": 0.03,
                                    "train/loss": 2.0}})
        recs.append({"kind": "metrics", "t": t, "step": s,
                     "values": {"perf/step_time": 0.1, "perf/data_loading_time": 0.01, "perf/straggler_rank": 1.0,
                                "perf/straggler_excess_s": 0.01, "perf/straggler_phase_index": 1.0,
                                "perf/straggler_median_s": 0.03, "train/loss": 2.0}})
    return recs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[0, 8])
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--passes", type=int, default=7)
    a = ap.parse_args(argv)
    for ranks in a.ranks:
        recs = stream(ranks, a.steps)
        runs = []
        for _ in range(a.passes):
            led = Ledger()
            feed = led.feed
            t = time.perf_counter()
            for rec in recs:
                feed(rec)
            runs.append((time.perf_counter() - t) / a.steps * 1e6)
        kept = len(led.result().get("ranks", {}))
        print(f"{ranks} per-rank records a step: {statistics.median(runs):.2f} us a step "
              f"(median of {a.passes}; {kept} rank ledgers)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
