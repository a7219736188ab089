"""What each C inner loop buys (issue 28 item 6): the daemon's ingest rate with every C loop,
with each one in turn replaced by its Python twin, and with none; alternating, in one run.

    .venv/bin/python -m benchmarks.c_loops_worth [--rounds 3] [--records-per-rank 25000] [--only tally,read_frames]

Each configuration is benchmarks/ingest.py's pipeline (8 ranks, MFU on, the real Daemon in this
process) on the same pre-filled input; the order of the configurations turns every round. Per
configuration: the median ingest rate and CPU-us per record on the daemon's thread, and what the
C twin of that one function buys: rate(all C) / rate(that one in Python) - 1.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from benchmarks.ingest import bench_pipeline
    from telemetry.daemon import hotpath

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--records-per-rank", type=int, default=25_000)
    ap.add_argument("--only", default="", help="comma-separated C loops to measure (default: every one, and all Python)")
    a = ap.parse_args(argv)
    if hotpath.native is None:
        print("c_loops_worth: the C loops are not built here (python setup.py build_ext --inplace)")
        return 2
    only = [t.strip() for t in a.only.split(",") if t.strip()]
    unknown = [t for t in only if t not in hotpath.TWINS]
    if unknown:
        ap.error(f"--only: not a C loop: {', '.join(unknown)} (they are: {', '.join(hotpath.TWINS)})")
    configs = [("all C", True, ())] + [(f"{t} in Python", True, (t,)) for t in (only or hotpath.TWINS)] + \
        ([] if only else [("all Python", False, ())])
    rates: dict[str, list[float]] = {c[0]: [] for c in configs}
    cpu: dict[str, list[float]] = {c[0]: [] for c in configs}
    tmp = Path(tempfile.mkdtemp(prefix="tmcloops-", dir="/tmp"))
    for r in range(a.rounds):
        order = configs[r % len(configs):] + configs[:r % len(configs)]
        for i, (name, native, twins) in enumerate(order):
            tag = f"{r}_{i}"
            res = bench_pipeline(f"ipc://{tmp}/in{tag}.sock", f"ipc://{tmp}/pub{tag}.sock", f"ipc://{tmp}/ctl{tag}.sock",
                                 tmp / f"log{tag}", a.records_per_rank, native=native, python_twins=twins)
            rates[name].append(res["ingest_records_per_s"])
            cpu[name].append(res["main_thread_cpu_us_per_record_ingest"])
            print(f"round {r}: {name}: {res['ingest_records_per_s']:,.0f} rec/s, "
                  f"{res['main_thread_cpu_us_per_record_ingest']:.2f} CPU-us/rec on the daemon's thread", flush=True)
    base = statistics.median(rates["all C"])
    base_cpu = statistics.median(cpu["all C"])
    print(f"\n{'configuration':<32} {'rec/s (median)':>15} {'CPU-us/rec':>11} {'the C twin buys':>16}")
    for name, _, _ in configs:
        rate, c = statistics.median(rates[name]), statistics.median(cpu[name])
        buys = "" if name == "all C" else f"{base / rate - 1:+.1%} rate, {c - base_cpu:+.2f} us"
        print(f"{name:<32} {rate:>15,.0f} {c:>11.2f} {buys:>16}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
