"""What the goodput ledger costs a step with and without per-rank records: the ledger
(telemetry/shared/goodput.py) fed a synthetic run of --steps aggregated steps, each after
--ranks per-rank records, --passes times; the median us per step. Two paths:
  stream  the per-rank records in the record stream (a daemon with --per-rank writes them);
  stage   the goodput stage of a daemon that does not write them: each step's per-rank records
          handed to it as the daemon's Metrics structs (take_rank_records), then the step's
          aggregated record (consume), as the daemon's thread and the stage's do.

    .venv/bin/python -m benchmarks.goodput_ranks_cost [--ranks 0 8] [--steps 20000] [--passes 7] [--path stream stage]
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import NamedTuple

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
    ap.add_argument("--path", nargs="+", choices=("stream", "stage"), default=["stream", "stage"])
    a = ap.parse_args(argv)
    for path in a.path:
        for ranks in a.ranks:
            run = _stream if path == "stream" else _stage
            runs, kept = zip(*(run(stream(ranks, a.steps)) for _ in range(a.passes)))
            print(f"{path}: {ranks} per-rank records a step: {statistics.median(runs) / a.steps * 1e6:.2f} us a step "
                  f"(median of {a.passes}; {kept[-1]} rank ledgers)")
    return 0


def _stream(recs: list[dict]) -> tuple[float, int]:
    led = Ledger()
    feed = led.feed
    t = time.perf_counter()
    for rec in recs:
        feed(rec)
    return time.perf_counter() - t, len(led.result().get("ranks", {}))


def _stage(recs: list[dict]) -> tuple[float, int]:
    """The per-rank records as the daemon hands them (a batch per step), the rest as Outs."""
    from telemetry.daemon.goodput_stage import GoodputStage
    from telemetry.daemon.sinks.base import Out

    stage = GoodputStage(rank_bytes_max=1 << 40)
    work: list[tuple[list, list]] = []
    ranks: list = []
    for rec in recs:
        if rec["kind"] == "metrics" and "rank" in rec:
            ranks.append(Row(rec["rank"], rec["step"], int(rec["t"] * 1e9), rec["values"]))
        else:
            work.append((ranks, [Out(rec["kind"], rec, b"")]))
            ranks = []
    t = time.perf_counter()
    for rank_recs, outs in work:
        if rank_recs:
            stage.take_rank_records(rank_recs, 100 * len(rank_recs))
        stage.consume(outs)
    return time.perf_counter() - t, len(stage.result().get("ranks", {}))


class Row(NamedTuple):      # what the daemon hands over: protocol.Metrics has these fields
    rank: int
    step: int
    t_ns: int
    values: dict


if __name__ == "__main__":
    raise SystemExit(main())
