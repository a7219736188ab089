"""Fault-injection scenarios: what is lost, what is counted, what the trainer feels.

    .venv/bin/python -m benchmarks.reliability [--quick] [--outage-s 60] [--json OUT]

Every scenario runs real daemon processes on this machine (ipc sockets, TCP on loopback) and real
rank processes (`TelemetryClient`), injects one fault, and returns its figures as a dict; this
script runs them with full loads and prints the table for benchmarks/RESULTS.md. The scenarios
the tests also call, and the harness (daemon launch, endpoints, rank processes), live in
testkit/faults.py; the two only this table runs are here.

    kill_restart    SIGKILL the daemon mid-run, append a torn line, restart it
    kill_counted    SIGKILL with records inside it, restart: the successor counts what vanished
    no_world_size   ranks without WORLD_SIZE: the daemon learns the world, no step written twice
    hostile_records malformed and hostile frames between ordinary ones: the daemon stays up
    sigterm_drain   SIGTERM with the daemon's queues full: everything accepted is written
    drain_backlog   ranks closed, a backlog queued, SIGTERM: sent == written + counted lost (also
                    with a 1 s drain deadline, where part of the backlog is counted, not written)
    disk_full       RLIMIT_FSIZE on the daemon: JSONL fails whole batches, PUB carries on
    multinode       node daemons forward to a head over TCP + CURVE; the head goes away for a while
    load            8 ranks x N records paced under the HWM: exactly once
    overload        8 ranks unpaced against a small daemon queue: delivered + counted drops == sent
    hang_up         the same with a queue of 100 a connection: the hang-up tail counted in transit
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from testkit.faults import (Endpoints, disk_full, drain_backlog, kill_counted, kill_restart, launch, load,
                            multinode, sigterm_drain, start_ranks, wait_ranks)


def no_world_size(work: Path, num_ranks: int = 8, n: int = 10_000, rate: float = 5000) -> dict:
    """Ranks whose hellos carry no world size (no WORLD_SIZE in their environment), the daemon
    learning the world from the ranks it sees: no step is aggregated twice; a rank's record for
    a step that went out without it is a late per-rank record; sent == written + counted lost."""
    eps = Endpoints()
    log_dir = work / "telemetry"
    d = launch(log_dir, eps)
    env = {k: v for k, v in os.environ.items() if k != "WORLD_SIZE"}
    env["WORLD_SIZE"] = ""
    procs = start_ranks(eps.ingest, list(range(num_ranks)), n, rate, work / "ranks", env=env)
    ranks = wait_ranks(procs, work / "ranks")
    final = d.drain(timeout_s=120)
    steps = d.read_jsonl("metrics", aggregated=True)
    late = [r for r in d.read_jsonl("metrics", aggregated=False) if r.get("late")]
    sent = sum(r["final"]["sent"] for r in ranks.values())
    out = {"scenario": "no_world_size", "ranks": num_ranks, "records_per_rank": n, "rate_per_rank": rate,
           "sent": sent, "records_in": final["records_in"], "counted_lost": final["records_lost"],
           "steps_written": len(steps), "steps_written_twice": len(steps) - len({r["step"] for r in steps}),
           "steps_incomplete": final["steps_incomplete"], "late_lines": len(late),
           "records_late": final["records_late"], "world_size": final["world_size"]}
    out["unaccounted_intake"] = sent - final["records_in"] - final["records_lost"]
    d.cleanup()
    return out


def hostile_records(work: Path, n: int = 2000) -> dict:
    """Records the decoder used to accept and that then stopped the daemon (invalid UTF-8, ext
    types, odd map keys, None throughput inputs, hostile model configs, world sizes of 10^9,
    seqs of 2^63-1, bogus ranks) between a client's ordinary records: the daemon stays up, and
    every frame is accounted for (records_in + records_malformed == sent)."""
    import msgpack
    import zmq

    from protocol import encode_event, encode_hello, encode_metrics

    u63 = (1 << 63) - 1
    model = {"model_type": "qwen2_moe", "hidden_size": 64, "num_hidden_layers": 10**12, "num_attention_heads": 4,
             "intermediate_size": 128, "vocab_size": 1000, "num_experts": 8, "num_experts_per_tok": 2}
    hostile = [
        encode_metrics(1, 0, 0, 0, 1, 1, {"ab": 1.0}).replace(b"\xa2ab", b"\xa2\xff\xfe"),
        msgpack.packb([1, 1, 2, 0, 0, 0, 1, {"x": msgpack.ExtType(3, b"ab")}]),
        msgpack.packb([3, 1, 3, 0, 0, 0, 1, "odd", {"a": {None: 1, 2: [1], (0, 1): True}}]),
        encode_hello(4, 0, 0, 0, 1, {"model": {"hf_config": model, "seq_len": 16}}),
        encode_hello(5, 0, 0, 0, 1, {"world_size": 10**9}),
        encode_metrics(6, 0, u63, u63, 1, 3, {"perf/step_time": 0.1, "perf/tokens": None}),
        msgpack.packb([2, 1, 8, 0, 1, 0, 1, -5, {"x": 1.0}]),
        encode_metrics(9, 1 << 40, 0, 0, 1, 3, {"x": 1.0}),
    ]
    eps = Endpoints()
    log_dir = work / "telemetry"
    d = launch(log_dir, eps, world_size=1)
    ctx = zmq.Context()
    push = d.push(ctx)          # a raw PUSH: linger 0, sndhwm 100,000
    sent = 0
    for seq in range(n):
        push.send(encode_metrics(7, 0, seq, 0, time.time_ns(), seq, {"perf/step_time": 0.1, "perf/tokens": 100}))
        push.send(hostile[seq % len(hostile)])
        sent += 2
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        s = d.status()
        if s["records_in"] + s["records_malformed"] >= sent:
            break
        time.sleep(0.1)
    alive = d.proc.poll() is None
    final = d.drain()
    steps = {r["step"] for r in d.read_jsonl("metrics", aggregated=True)}
    out = {"scenario": "hostile_records", "sent": sent, "alive": alive, "records_in": final["records_in"],
           "records_malformed": final["records_malformed"], "records_failed": final["records_failed"],
           "records_lost": final["records_lost"], "records_seq_bogus": final["records_seq_bogus"],
           "world_size": final["world_size"], "valid_steps_written": len(steps & set(range(n))),
           "valid_sent": n}
    out["unaccounted"] = sent - final["records_in"] - final["records_malformed"]
    push.close(0)
    ctx.term()
    d.cleanup()
    return out


# -- the table ---------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small loads (about a minute)")
    p.add_argument("--outage-s", type=float, default=60.0)
    p.add_argument("--only", nargs="*", help="scenario names to run")
    p.add_argument("--json", metavar="OUT")
    a = p.parse_args(argv)
    q = a.quick
    runs = {
        "kill_restart": lambda w: kill_restart(w),
        "kill_counted": lambda w: kill_counted(w),
        "no_world_size": lambda w: no_world_size(w, n=5_000 if q else 10_000),
        "hostile_records": lambda w: hostile_records(w),
        "sigterm_drain": lambda w: sigterm_drain(w, n=20_000 if q else 100_000),
        "drain_backlog": lambda w: drain_backlog(w, n=50_000 if q else 150_000),
        "drain_backlog_short": lambda w: drain_backlog(w, n=50_000 if q else 150_000, drain_timeout_s=1.0),
        "disk_full": lambda w: disk_full(w),
        "multinode": lambda w: multinode(w, outage_s=5.0 if q else a.outage_s, rate=20.0, max_buffered=50 if q else 500),
        "load": lambda w: load(w, n=10_000 if q else 125_000),
        "overload": lambda w: load(w, n=20_000 if q else 50_000, rate=0, sndhwm=1000, rcvhwm=5000, name="overload"),
        # A queue of 100 a connection (the least there is), full whenever a rank exits: the tail
        # libzmq discards at hang-up (ipc) is counted in transit; every bye arrives, on its own
        # connection.
        "hang_up": lambda w: load(w, n=20_000, rate=0, sndhwm=1000, rcvhwm=100 * 1024, name="hang_up"),
    }
    results = {}
    for name, fn in runs.items():
        if a.only and name not in a.only:
            continue
        with tempfile.TemporaryDirectory(prefix=f"rel-{name}-") as w:
            t0 = time.monotonic()
            results[name] = fn(Path(w))
            results[name]["wall_s"] = time.monotonic() - t0
        print(json.dumps(results[name], default=str), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
