"""What the declared output records (protocol/output.py, issue 28 item 4) cost against the dicts
they replaced, on both sides, alternating in one run:

    .venv/bin/python -m benchmarks.output_records [--rounds 5] [--steps 20000] [--values 30]

- producer: building one aggregated step's record and encoding its line (what the daemon does per
  step): a dict literal + msgspec.json.Encoder against MetricsRecord + protocol.output.encode;
- reader: a file's lines to records (json.loads, what readjsonl did, against output.decode);
- consumer: `telemetry report`'s collect() over those records (dict reads against the records'
  mapping reads), and the two together: what `telemetry report` spends before drawing.

The file: --steps aggregated steps of --values metrics each, plus a system record every 10 steps
and an event every 100, as a run's metrics.jsonl holds them. Medians over the rounds, per record.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import msgspec


def _lines(steps: int, num_values: int) -> list[bytes]:
    enc = msgspec.json.Encoder()
    names = ["train/loss", "train/lr", "train/grad_norm", "perf/step_time", "perf/tokens"] + \
        [f"perf/m{i}" for i in range(max(0, num_values - 5))]
    out = []
    for s in range(1, steps + 1):
        out.append(enc.encode({"kind": "metrics", "t": 1.7e9 + s, "step": s,
                               "values": {n: 1.0 / (s + i) for i, n in enumerate(names[:num_values])}}))
        if s % 10 == 0:
            out.append(enc.encode({"kind": "system", "t": 1.7e9 + s, "host": "h0",
                                   "values": {"system/cpu_percent": 50.0, "system/memory_percent": 30.0}}))
        if s % 100 == 0:
            out.append(enc.encode({"kind": "event", "t": 1.7e9 + s, "rank": 0, "name": "checkpoint_saved",
                                   "data": {"step": s, "duration_s": 0.5}}))
    return out


def main(argv: list[str] | None = None) -> int:
    from protocol import output
    from protocol.output import MetricsRecord
    from telemetry.consumers.report import collect

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--values", type=int, default=30)
    a = ap.parse_args(argv)
    lines = _lines(a.steps, a.values)
    n = len(lines)
    values = json.loads(lines[0])["values"]
    enc = msgspec.json.Encoder()
    res: dict[str, list[float]] = {k: [] for k in ("produce dict", "produce record", "read json.loads",
                                                   "read output.decode", "collect dicts", "collect records")}

    def produce_dict():
        for s in range(a.steps):
            enc.encode({"kind": "metrics", "t": 1.7e9 + s, "step": s, "values": values})

    def produce_record():
        for s in range(a.steps):
            output.encode(MetricsRecord(1.7e9 + s, s, values))

    for r in range(a.rounds):
        pairs = [("produce dict", produce_dict, a.steps), ("produce record", produce_record, a.steps)]
        for name, fn, count in (pairs if r % 2 == 0 else pairs[::-1]):
            t = time.perf_counter()
            fn()
            res[name].append((time.perf_counter() - t) / count * 1e6)
        for name, decode in ((("read json.loads", json.loads), ("read output.decode", output.decode))
                             if r % 2 == 0 else (("read output.decode", output.decode), ("read json.loads", json.loads))):
            t = time.perf_counter()
            recs = [decode(line) for line in lines]
            res[name].append((time.perf_counter() - t) / n * 1e6)
            t = time.perf_counter()
            d = collect(recs)
            res["collect dicts" if decode is json.loads else "collect records"].append((time.perf_counter() - t) / n * 1e6)
            assert len(d.steps["train/loss"][0]) == a.steps
    print(f"{n:,} records ({a.steps:,} steps of {a.values} values), {a.rounds} rounds; us per record, median (min-max)")
    for name, xs in res.items():
        print(f"  {name:<20} {statistics.median(xs):7.2f}  ({min(xs):.2f}-{max(xs):.2f})")
    old = statistics.median(res["read json.loads"]) + statistics.median(res["collect dicts"])
    new = statistics.median(res["read output.decode"]) + statistics.median(res["collect records"])
    print(f"  read + collect: dicts {old:.2f}, records {new:.2f} us per record (records / dicts {new / old:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
