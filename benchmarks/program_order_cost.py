"""What putting each client's records back in its own order costs the daemon's ingest
(telemetry/daemon/stages/rare.py: in_program_order), per record of a batch that holds other kinds than
metrics (a batch of metrics alone skips it). Batches of 4,096 decoded records from 8 clients,
an event every 64th record: in order (the usual case: one pass, no sort), and with one client's
tensor-valued record read before the event it followed (the pass, then a sort of that client's
records). Median over --rounds of the ns per record.

    .venv/bin/python -m benchmarks.program_order_cost [--rounds 15]
"""
from __future__ import annotations

import argparse
import statistics
import time

from protocol import decode, encode_event, encode_metrics
from telemetry.daemon.stages.rare import in_program_order as _in_program_order

N, CLIENTS = 4096, 8


def batch(disordered: bool) -> list:
    seq = dict.fromkeys(range(CLIENTS), 0)
    frames = []
    for i in range(N):
        c = i % CLIENTS
        if i % 64 == 0:
            frames.append(encode_event(1000 + c, c, seq[c], 0, 1, "wandb/nested", {"paths": {"a/b": ["a", "b"]}}))
        else:
            frames.append(encode_metrics(1000 + c, c, seq[c], 0, 1, i, {f"m{k}": float(k) for k in range(10)}))
        seq[c] += 1
    if disordered:     # client 0's first event and the record after it, read the other way round
        a = 0
        b = next(j for j in range(1, N) if j % CLIENTS == 0)
        frames[a], frames[b] = frames[b], frames[a]
    return [decode(f) for f in frames]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args(argv)
    for name, disordered in (("in order", False), ("one client out of order", True)):
        recs = batch(disordered)
        out = _in_program_order(recs)
        assert (out is recs) != disordered
        per = []
        for _ in range(a.rounds):
            t0 = time.perf_counter_ns()
            for _ in range(20):
                _in_program_order(recs)
            per.append((time.perf_counter_ns() - t0) / (20 * N))
        print(f"{name:26s} {statistics.median(per):6.1f} ns/record (median of {a.rounds}; "
              f"min {min(per):.1f}, max {max(per):.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
