"""What TelemetryClient.close() costs a rank at exit, and whether its final account arrives.

Two ways to send the bye (the client's final seq and drop count), side by side in one run,
alternating round by round against one real daemon (ipc):

    own connection     what the client does: flush the records connection (its linger), then
                       the bye on a fresh connection of its own (a second zmq.Context)
    same connection    the bye queued behind the records on the records connection (the code
                       before): one connection, but over ipc libzmq discards that connection's
                       kernel-held tail, bye included, when the daemon's queue for it is full

Each round: a fresh client logs `--records` records back to back, then close() is timed.
Reported: close() median and p99 (ms), and byes that reached the daemon.

    .venv/bin/python -m benchmarks.close_cost [--rounds 40] [--records 2000] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import zmq

from testkit.faults import Endpoints, launch
from protocol import codec
from telemetry.client import TelemetryClient


def close_same_connection(tm: TelemetryClient, timeout_s: float) -> None:
    """The alternative: the bye on the records connection, then close and term."""
    deadline = time.monotonic() + timeout_s
    remaining_ms = lambda: int(max(0.0, deadline - time.monotonic()) * 1000)  # noqa: E731
    tm._deferred.close(timeout_s=remaining_ms() / 2000)
    tm._send_other("bye", lambda seq, dropped: codec.encode_bye(
        tm._src, tm.rank, seq, dropped, time.time_ns(), tm.stats()))
    tm._closed = True
    tm._sock.close(linger=remaining_ms())
    tm._ctx.term()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--records", type=int, default=2000)
    p.add_argument("--json", metavar="OUT")
    a = p.parse_args(argv)
    eps = Endpoints()
    d = launch(Path(tempfile.mkdtemp(prefix="close-")) / "telemetry", eps, world_size=1)
    times: dict[str, list[float]] = {"own connection": [], "same connection": []}
    byes = dict.fromkeys(times, 0)
    try:
        for i in range(a.rounds):
            for variant in (times if i % 2 == 0 else reversed(list(times))):
                before = d.status()["records_in_by_kind"]["bye"]
                tm = TelemetryClient(eps.ingest, rank=0, sndhwm=a.records + 10)
                for step in range(a.records):
                    tm.log(step, {"train/loss": 1.0, "perf/tokens": 4096})
                t0 = time.perf_counter()
                if variant == "own connection":
                    tm.close(timeout_s=5.0)
                else:
                    close_same_connection(tm, 5.0)
                times[variant].append((time.perf_counter() - t0) * 1000)
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline and d.status()["records_in_by_kind"]["bye"] == before:
                    time.sleep(0.01)
                byes[variant] += d.status()["records_in_by_kind"]["bye"] - before
            print(f"round {i + 1}/{a.rounds}", end="\r", flush=True)
    finally:
        d.drain()
        d.cleanup()
    out = {}
    for variant, ts in times.items():
        ts.sort()
        out[variant] = {"median_ms": statistics.median(ts), "p99_ms": ts[min(len(ts) - 1, int(len(ts) * 0.99))],
                        "byes": f"{byes[variant]}/{len(ts)}"}
    print()
    print(f"{'variant':<18} {'close median ms':>16} {'p99 ms':>8} {'byes in':>8}")
    for variant, r in out.items():
        print(f"{variant:<18} {r['median_ms']:>16.2f} {r['p99_ms']:>8.2f} {r['byes']:>8}")
    own, same = out["own connection"]["median_ms"], out["same connection"]["median_ms"]
    print(f"ratio own/same (median): {own / same:.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
