"""Daemon ingest benchmark: drain rate, emit-to-subscriber latency, RSS.

    .venv/bin/python benchmarks/ingest.py [--records-per-rank 25000] [--rounds 5] [--json OUT]

1. Drain rate. 8 sender processes (one per rank) fill the ingest socket with a hello (carrying
   the model, as the trainer's does, so the pipeline computes MFU) and 10-value metrics records
   (encoded by protocol.encode_metrics, the client's own encoder) while the consumer is not
   reading; then the consumer drains them and the time is taken. Consumers, measured in
   the same run, alternately, on the same pre-filled input so their ratio means something on a
   shared, noisy box:
     bare      recv + protocol.decode, nothing else (the floor any Python daemon pays)
     pipeline  the real Daemon (in this process): receiver accounting, aggregator across 8 ranks,
               derived metrics (throughput, MFU), JSON encoding, hand-out to the JSONL sink
               thread and the inline PUB sink (pollers off; the diagnosis stage off unless
               BENCH_DIAGNOSIS=1, W&B off unless BENCH_WANDB=offline); "ingest" stops when
               every record has passed the receiver, "in the JSONL file" when the JSONL sink's
               thread has also written every step (the drain rate through the whole pipeline),
               "written and closed" when the daemon's shutdown is done as well (it waits for the
               socket to be quiet for 50 ms, flushes, fsyncs and closes every sink).
     pipeline_no_mfu  the same, the hellos without the model (what the issue's budget names:
               aggregator, JSONL, PUB; derived metrics are throughput only).
     pipeline_no_mfu_pure_python  the same with the daemon's C inner loops off
               (telemetry/daemon/hotpath.py): what an install without a C compiler runs.
   Figures per round and their medians over the rounds.
2. Latency. A daemon subprocess; 8 ranks (TelemetryClient, one process) log at 10k records/s in
   total; a SUB socket receives the aggregated steps; latency = arrival time - the step's "t"
   (the wall time of its last rank's tm.log call). Same host, same clock.
3. RSS of the daemon subprocess after the latency run.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from telemetry.daemon import hotpath  # noqa: E402  (after the constants above)

NUM_RANKS = 8
DIAGNOSIS = bool(int(os.environ.get("BENCH_DIAGNOSIS", "0")))
WANDB = os.environ.get("BENCH_WANDB", "disabled")      # offline: the default config's W&B sink too
# The pipeline's variants, each run every round: (name, hellos carry the model, C inner loops).
VARIANTS = (("pipeline", True, True), ("pipeline_no_mfu", False, True), ("pipeline_no_mfu_pure_python", False, False))


def _values(step: int, rank: int) -> dict:
    return {"train/loss": 2.0 + 1.0 / (step + 1), "train/lr": 3e-4, "train/grad_norm": 1.1 + rank * 0.01,
            "perf/step_time": 0.5 + rank * 0.001, "perf/tokens": 4096, "perf/samples": 8,
            "memory/allocated_gb": 12.5, "perf/forward_time": 0.15, "perf/backward_time": 0.3,
            "perf/optimizer_time": 0.05}


# What a trainer's hello says of its model (a 1.1B Llama), so the pipeline computes MFU per step.
HELLO_MODEL = {"hf_config": {"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 22,
                             "num_attention_heads": 32, "num_key_value_heads": 4, "intermediate_size": 5632,
                             "vocab_size": 32000, "tie_word_embeddings": False},
               "seq_len": 2048, "dtype": "bf16", "causal": True, "gradient_checkpointing": False}


def _hello(rank: int, model: bool = True) -> dict:
    info = {"world_size": NUM_RANKS, "rank": rank, "device_name": "NVIDIA H100 80GB HBM3"}
    return {**info, "model": HELLO_MODEL} if model else info


def _frames(src: int, rank: int, num_records: int, model: bool = True) -> list[bytes]:
    """One rank's records as its client sends them: a hello (with the model: MFU), then one
    metrics record per step."""
    from protocol import encode_hello, encode_metrics

    t = time.time_ns()
    return [encode_hello(src, rank, 0, 0, t, _hello(rank, model))] + \
        [encode_metrics(src, rank, i + 1, 0, t + i, i, _values(i, rank)) for i in range(num_records)]


def _sender(endpoint: str, rank: int, num_records: int, model: bool, ready) -> None:
    """One rank: send a hello and `num_records` metrics records, blocking (nothing dropped)."""
    import zmq

    frames = _frames((os.getpid() << 8) | rank, rank, num_records, model)
    ctx = zmq.Context(1)
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.SNDHWM, 0)        # unbounded: this fills the daemon, it is not the client under test
    s.setsockopt(zmq.LINGER, -1)
    s.connect(endpoint)
    ready.wait()
    for f in frames:
        s.send(f, copy=False)
    s.close()
    ctx.term()                          # returns once every frame has left this process


def prefill(endpoint: str, records_per_rank: int, model: bool = True) -> float:
    """Fill `endpoint` from NUM_RANKS processes; return the seconds it took."""
    mpctx = mp.get_context("spawn")
    ready = mpctx.Event()
    procs = [mpctx.Process(target=_sender, args=(endpoint, r, records_per_rank, model, ready)) for r in range(NUM_RANKS)]
    for p in procs:
        p.start()
    t0 = time.perf_counter()
    ready.set()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"sender exited with {p.exitcode}")
    dt = time.perf_counter() - t0
    time.sleep(0.3)   # let the receiving I/O thread move the last bytes from the kernel into its queue
    return dt


def bench_bare(endpoint: str, records_per_rank: int) -> dict:
    import zmq

    from protocol import MAX_FRAME_BYTES, decode

    ctx = zmq.Context(1)
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.RCVHWM, 0)
    pull.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
    pull.bind(endpoint)
    total = NUM_RANKS * (records_per_rank + 1)
    prefill(endpoint, records_per_rank)
    recv = pull.recv
    n = 0
    c0 = time.process_time()
    t0 = time.perf_counter()
    while n < total:
        decode(recv())
        n += 1
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    pull.close(linger=0)
    ctx.term()
    return {"records": total, "seconds": dt, "records_per_s": total / dt, "cpu_s": cpu,
            "cpu_us_per_record": cpu / total * 1e6}


def bench_pipeline(endpoint: str, pub_ep: str, control_ep: str, log_dir: Path, records_per_rank: int,
                   profile: str = "", model: bool = True, native: bool = True, python_twins: tuple = ()) -> dict:
    """python_twins: with native, these of hotpath.TWINS run their Python twin (benchmarks/c_loops_worth.py)."""
    from telemetry.daemon.config import load
    from telemetry.daemon.core import Daemon

    cfg = load(None, {"ingest": endpoint, "pub": pub_ep, "control": control_ep, "log_dir": str(log_dir),
                      "wandb.mode": WANDB, "aggregator.world_size": NUM_RANKS,
                      "pollers": {"nvml_enabled": False, "host_enabled": False},
                      "jsonl.fsync_interval_s": 5.0, "diagnosis": {"enabled": DIAGNOSIS},
                      # The senders fill the daemon's queue before it reads: a budget that holds it all,
                      # in libzmq's queues (rcvhwm) and in the daemon's read-ahead (the ingest share
                      # of memory_mb: 15 %, ~300 B a frame held).
                      "max_connections": NUM_RANKS, "rcvhwm": NUM_RANKS * (records_per_rank + 10),
                      "memory_mb": max(256, NUM_RANKS * records_per_rank * 300 // (2**20 * 15 // 100) + 64)})
    d = Daemon(cfg)
    if not native:                # the pure-Python loops, as without a C compiler at install time
        from telemetry.daemon import loops

        d.receiver.loops = d.aggregator.loops = d.derived.loops = loops
    elif python_twins:            # the C loops but these, each its Python twin
        import types

        from telemetry.daemon import loops

        mixed = types.SimpleNamespace(**{t: getattr(loops if t in python_twins else hotpath.native, t)
                                         for t in hotpath.TWINS})
        d.receiver.loops = d.aggregator.loops = d.derived.loops = mixed
    d.start()
    for r in d.runners:
        r.wait_started(10)
    total = NUM_RANKS * (records_per_rank + 1)
    prefill(endpoint, records_per_rank, model)
    rx = d.receiver
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    c0 = time.process_time()
    m0 = time.thread_time()
    t0 = time.perf_counter()
    intake = getattr(d, "intake", None)     # the daemon's read-ahead queue (older trees: none)
    while rx.num_in + rx.num_malformed + (intake.num_shed if intake else 0) < total:
        d.turn(max_wait_s=0.5)
    t_ingest = time.perf_counter() - t0
    cpu_ingest = time.process_time() - c0
    cpu_main = time.thread_time() - m0
    jsonl = d.jsonl_runner
    while jsonl.num_written + jsonl.num_dropped < jsonl.num_in:     # the sink thread's backlog
        time.sleep(0.0002)
    t_jsonl = time.perf_counter() - t0
    from telemetry.daemon import shutdown

    d.stop_reason = "benchmark"
    rc = shutdown.run(d)     # drains queues, flushes, fsyncs, closes
    t_written = time.perf_counter() - t0
    cpu_written = time.process_time() - c0
    if prof is not None:
        prof.disable()
        prof.dump_stats(profile)
    return {"records": total, "ingest_seconds": t_ingest, "ingest_records_per_s": total / t_ingest,
            "jsonl_seconds": t_jsonl, "jsonl_records_per_s": total / t_jsonl,
            "written_seconds": t_written, "written_records_per_s": total / t_written,
            "cpu_us_per_record_ingest": cpu_ingest / total * 1e6,
            "main_thread_cpu_us_per_record_ingest": cpu_main / total * 1e6,
            "cpu_us_per_record_written": cpu_written / total * 1e6,
            "steps_written": d.aggregator.num_steps_out, "jsonl_lines": jsonl.sink.num_lines,
            "mfu_computed": "perf/mfu" in ((d.steps.latest or {}).get("values") or {}),
            "malformed": rx.num_malformed, "lost": rx.totals()["records_lost"] + (intake.num_shed if intake else 0),
            "sink_dropped": sum(r.num_dropped for r in d.runners), "rc": rc}


def breakdown(records_per_rank: int = 10_000) -> dict:
    """CPU microseconds per record of each stage of the daemon's hot path, in memory (no sockets,
    no sinks), batch by batch as the daemon runs them (INGEST_BATCH frames at a time)."""
    import msgspec

    from protocol import Metrics
    from telemetry.daemon.aggregator import Aggregator
    from telemetry.daemon.config import AggregatorConfig, MfuConfig
    from telemetry.daemon.stages.receive import INGEST_BATCH
    from telemetry.daemon.derived import Derived
    from telemetry.daemon.receiver import Receiver

    per_rank = [_frames(1000 + r, r, records_per_rank) for r in range(NUM_RANKS)]
    frames = [f for step in zip(*per_rank) for f in step]        # the ranks interleaved, as on the socket
    batches = [frames[i:i + INGEST_BATCH] for i in range(0, len(frames), INGEST_BATCH)]
    rx = Receiver()
    agg = Aggregator(AggregatorConfig(world_size=NUM_RANKS))
    der = Derived(MfuConfig())
    der.on_hello(_hello(0))
    enc = msgspec.json.Encoder()
    cpu = dict.fromkeys(("receiver (decode, validate, account)", "aggregator (add)", "aggregator (columns, reduce)",
                         "derived (throughput, MFU)", "JSON encode"), 0.0)
    names = list(cpu)
    clock = time.thread_time
    for batch in batches:
        t0 = clock()
        recs = rx.take(iter(batch).__next__, StopIteration, len(batch))[0]
        metrics = [r for r in recs if type(r) is Metrics]
        t1 = clock()
        done, _late = agg.add_many(metrics)
        t2 = clock()
        steps, out = agg.finish_batch(done)
        t3 = clock()
        der.apply(steps, [rec["values"] for rec in out], NUM_RANKS)
        t4 = clock()
        for rec in out:
            enc.encode(rec)
        t5 = clock()
        for name, dt in zip(names, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
            cpu[name] += dt
    return {name: v / len(frames) * 1e6 for name, v in cpu.items()}


def bench_latency(tmp: Path, rate_per_s: float = 10_000, duration_s: float = 5.0) -> dict:
    import psutil
    import zmq

    from telemetry.client import TelemetryClient

    eps = {k: f"ipc://{tmp}/lat-{k}.sock" for k in ("ingest", "pub", "control")}
    cmd = [sys.executable, "-m", "telemetry", "daemon", "--log-dir", str(tmp / "lat"), "--wandb", "disabled",
           "--world-size", str(NUM_RANKS), "--quiet", *[a for k, v in eps.items() for a in (f"--{k}", v)]]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if "telemetry daemon ready" in line:
            break
    ctx = zmq.Context(1)
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RCVTIMEO, 2000)
    sub.setsockopt(zmq.SUBSCRIBE, b"metrics")
    sub.connect(eps["pub"])
    time.sleep(0.5)
    latencies_ms: list[float] = []

    def receive() -> None:
        while True:
            try:
                _topic, body = sub.recv_multipart()
            except zmq.Again:
                return
            arrived = time.time()
            rec = json.loads(body)
            if "rank" not in rec and rec.get("step", -1) >= 0:
                latencies_ms.append((arrived - rec["t"]) * 1e3)

    rx = threading.Thread(target=receive, daemon=True)
    rx.start()
    clients = [TelemetryClient(eps["ingest"], rank=r, send_hello=False) for r in range(NUM_RANKS)]
    steps = int(rate_per_s * duration_s / NUM_RANKS)
    period_s = NUM_RANKS / rate_per_s
    t_next = time.perf_counter()
    for step in range(steps):
        for r, c in enumerate(clients):
            c.log(step, _values(step, r))
        t_next += period_s
        delay = t_next - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    achieved = steps * NUM_RANKS / (time.perf_counter() - (t_next - steps * period_s))
    for c in clients:
        c.close()
    rx.join(10)
    rss_mb = psutil.Process(proc.pid).memory_info().rss / 2**20
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    sub.close()
    ctx.term()
    lat = sorted(latencies_ms)
    q = statistics.quantiles(lat, n=100) if len(lat) > 100 else [float("nan")] * 99
    return {"rate_per_s_target": rate_per_s, "rate_per_s_achieved": achieved, "steps_sent": steps,
            "steps_received": len(lat), "p50_ms": q[49], "p99_ms": q[98], "max_ms": lat[-1] if lat else None,
            "daemon_rss_mb": rss_mb}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records-per-rank", type=int, default=25_000,
                    help="metrics records each of the 8 sender ranks pre-fills (default 25,000)")
    ap.add_argument("--rounds", type=int, default=5,
                    help="rounds of bare and the pipeline's variants (default 5; medians reported)")
    ap.add_argument("--no-latency", action="store_true", help="skip the PUB latency and RSS part")
    ap.add_argument("--latency-only", action="store_true", help="only the PUB latency and RSS part")
    ap.add_argument("--profile", metavar="FILE", help="cProfile the last pipeline round into FILE")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tmbench-", dir="/tmp"))
    out: dict = {"machine": f"{os.cpu_count()}-core CPU dev box", "records_per_rank": args.records_per_rank,
                 "inner_loops": hotpath.name(), "bare": [], "pipeline": [], "pipeline_no_mfu": [],
                 "pipeline_no_mfu_pure_python": []}
    for i in range(0 if args.latency_only else args.rounds):
        bare = bench_bare(f"ipc://{tmp}/bare{i}.sock", args.records_per_rank)
        out["bare"].append(bare)
        print(f"round {i}: bare {bare['records_per_s']:,.0f} rec/s ({bare['cpu_us_per_record']:.2f} CPU-us/rec)",
              flush=True)
        for key, model, native in VARIANTS:
            if not native and hotpath.native is None:
                continue              # pure Python is what the other variants run already
            prof = args.profile if (args.profile and i == args.rounds - 1 and model) else ""
            pipe = bench_pipeline(f"ipc://{tmp}/in{key}{i}.sock", f"ipc://{tmp}/pub{key}{i}.sock",
                                  f"ipc://{tmp}/ctl{key}{i}.sock", tmp / f"log{key}{i}", args.records_per_rank,
                                  profile=prof, model=model, native=native)
            out[key].append(pipe)
            print(f"  {key}: ingest {pipe['ingest_records_per_s']:,.0f} rec/s "
                  f"({pipe['cpu_us_per_record_ingest']:.2f} CPU-us/rec, "
                  f"{pipe['main_thread_cpu_us_per_record_ingest']:.2f} on the daemon's thread), in the JSONL file "
                  f"{pipe['jsonl_records_per_s']:,.0f} rec/s, all written and closed "
                  f"{pipe['written_records_per_s']:,.0f} rec/s ({pipe['ingest_records_per_s'] / bare['records_per_s']:.0%}"
                  f" of bare; steps {pipe['steps_written']}, lost {pipe['lost']}, sink drops {pipe['sink_dropped']}, "
                  f"MFU {pipe['mfu_computed']})", flush=True)
    if args.latency_only:
        lat = out["latency"] = bench_latency(tmp)
        print(json.dumps(lat))
        return 0
    summary = out["summary"] = {"bare_median_per_s": statistics.median(b["records_per_s"] for b in out["bare"])}
    for key, _, _ in VARIANTS:
        if not out[key]:
            continue
        rates = [p["ingest_records_per_s"] for p in out[key]]
        ratios = [p["ingest_records_per_s"] / b["records_per_s"] for b, p in zip(out["bare"], out[key])]
        jsonl_rates = [p["jsonl_records_per_s"] for p in out[key]]
        summary[key] = {"ingest_median_per_s": statistics.median(rates), "ingest_best_per_s": max(rates),
                        "jsonl_median_per_s": statistics.median(jsonl_rates),
                        "written_median_per_s": statistics.median(p["written_records_per_s"] for p in out[key]),
                        "over_bare_median": statistics.median(ratios)}
        print(f"{key}: ingest median {statistics.median(rates):,.0f} rec/s, best {max(rates):,.0f}; in the JSONL "
              f"file: median {statistics.median(jsonl_rates):,.0f}; "
              f"median ratio to bare {statistics.median(ratios):.0%} (bare median "
              f"{summary['bare_median_per_s']:,.0f})")
    out["breakdown_cpu_us_per_record"] = bd = breakdown()
    print(f"in-memory CPU-us per record ({hotpath.name()} inner loops), by stage: " + ", ".join(f"{k} {v:.2f}" for k, v in bd.items())
          + f"; total {sum(bd.values()):.2f}")
    if not args.no_latency:
        lat = bench_latency(tmp)
        out["latency"] = lat
        print(f"latency at {lat['rate_per_s_achieved']:,.0f} rec/s: p50 {lat['p50_ms']:.2f} ms, "
              f"p99 {lat['p99_ms']:.2f} ms, max {lat['max_ms']:.2f} ms ({lat['steps_received']}/{lat['steps_sent']} "
              f"steps); daemon RSS {lat['daemon_rss_mb']:.0f} MiB")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
