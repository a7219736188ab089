"""What a node daemon's forward sink and the goodput ledger cost per record: a base commit against
the working tree, side by side in one run. Each round runs one short process per version,
alternately (the order flips every round). In it, a ForwardSink (no CURVE) sends to one receiving
process on loopback TCP that drains the socket, as the head would, and the goodput Ledger is fed
the same records: batches of 256 node-aggregated step records (10 values, perf/step_time among
them) with an event every 64th record. Reported: per version, the median over the rounds of each
round's median ns per record (over its batches), for the sink's consume() and the ledger's
feed(), and the ratios.

    .venv/bin/python -m benchmarks.forward_ledger_ab [--base HEAD] [--rounds 7] [--batches 400]
"""
from __future__ import annotations

import argparse
import socket
import statistics
import sys

from benchmarks.ab import alternate, base_and_sink

# Runs in a fresh interpreter with PYTHONPATH at one version's tree.
CHILD = r"""
import json, sys, time
from telemetry.daemon.sinks.base import Out
from telemetry.daemon.sinks.forward import ForwardConfig, ForwardSink
from telemetry.shared.goodput import Ledger
endpoint, batches = sys.argv[1], int(sys.argv[2])
sink = ForwardSink(ForwardConfig(endpoint=endpoint, max_buffered=10_000_000, num_nodes=2))
sink.start()
led = Ledger()
t0, step, out = 1_800_000_000.0, 0, []
def batch():
    global step
    b = []
    for i in range(256):
        if i % 64 == 63:
            rec = {"kind": "event", "t": t0 + step * 0.1, "rank": 0, "name": "checkpoint_saved",
                   "data": {"step": step, "duration_s": 0.5}}
        else:
            step += 1
            rec = {"kind": "metrics", "t": t0 + step * 0.1, "step": step,
                   "values": {"perf/step_time": 0.1, "perf/data_loading_time": 0.01, "train/loss": 2.0,
                              **{f"train/m{k}": float(k) for k in range(7)}}}
        b.append(Out(rec["kind"], rec, b""))
    return b
hello = {"kind": "hello", "t": t0, "rank": 0, "info": {"rank": 0, "started_at": t0 - 5, "world_size": 2}}
sink.consume([Out("hello", hello, b"")]); led.feed(hello)
for _ in range(20):                     # warm-up
    b = batch(); sink.consume(b); [led.feed(o.record) for o in b]
fwd, feed = [], []
now = time.perf_counter_ns
for _ in range(batches):
    b = batch()
    s = now(); sink.consume(b); fwd.append((now() - s) / len(b))
    feed_one = led.feed
    s = now()
    for o in b:
        feed_one(o.record)
    feed.append((now() - s) / len(b))
sink.close()
fwd.sort(); feed.sort()
print(json.dumps({"forward": fwd[len(fwd) // 2], "ledger": feed[len(feed) // 2], "sent": sink.num_sent}))
"""

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="HEAD", help="the commit to compare with (default HEAD)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--batches", type=int, default=400)
    a = ap.parse_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with base_and_sink(a.base, lambda tmp: f"tcp://127.0.0.1:{port}") as (trees, endpoint):
        out = alternate(trees, a.rounds, CHILD, [endpoint, str(a.batches)],
                        lambda res: f"forward {res['forward']:,.0f} ns/record, ledger {res['ledger']:,.0f} ns/record")
        if out is None:
            return 1
    summary = {name: {k: statistics.median(x[k] for x in rows) for k in ("forward", "ledger")}
               for name, rows in out.items()}
    for name, s in summary.items():
        print(f"{name:>16}: forward {s['forward']:,.0f} ns/record, ledger {s['ledger']:,.0f} ns/record "
              f"(medians over {a.rounds} rounds)")
    b, w = summary[f"base {a.base}"], summary["working tree"]
    print(f"ratio (working tree / base): forward {w['forward'] / b['forward']:.3f}, "
          f"ledger {w['ledger'] / b['ledger']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
