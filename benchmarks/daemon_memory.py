"""The daemon's memory under the loads of issue 26: peak and retained RSS of a real daemon process.

    .venv/bin/python benchmarks/daemon_memory.py [--case flat,wide,hellos,names,world] [--duration 20]
                                                 [--memory-mb N] [--wandb MODE] [--repo DIR] [--json OUT]

Each case starts `telemetry daemon` (W&B disabled unless --wandb says, `memory_mb` from
--memory-mb, else the default; pollers and diagnosis as configured by default) from the checkout `--repo` (default: this one; a `git worktree` of an older commit
gives the "before"), drives it with raw PUSH sockets from sender processes (records encoded by
protocol's own encoders, as a client does), samples the daemon's VmRSS from /proc every 50 ms,
and reports the peak while loaded and the RSS once the load has stopped and the daemon's queues
are empty again ("after"; the daemon is not restarted in between):

    flat    8 ranks, 10 values a record, flat out (NOBLOCK sends, client-sized send queues)
    wide    1 rank, 4,096 values a record, flat out
    hellos  300 ranks, each hello carrying a 0.86 MB config; then a few steps each
    names   1M distinct metric names (1,000 records of 1,000 new names), then `status` timed
    world   --world-size 1000000000: the exit code and the RSS it reached (killed at 2 GB / 20 s)
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testkit.daemon_proc import DaemonProc, daemon_command  # noqa: E402

SAMPLE_S = 0.05
# A daemon past this RSS (or this long) in the world case is stopped: the old code grows until
# the OOM killer fires, which is what the case shows, not something to let happen to the box.
WORLD_KILL_RSS_MB = 2048
WORLD_KILL_S = 20.0
FLAT_VALUES = ("train/loss", "train/lr", "train/grad_norm", "perf/step_time", "perf/tokens", "perf/samples",
               "memory/allocated_gb", "perf/forward_time", "perf/backward_time", "perf/optimizer_time")


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class Sampler:
    """The daemon's RSS every SAMPLE_S on a thread: .peak_mb, .last_mb."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak_mb, self.last_mb = pid, 0.0, 0.0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.last_mb = rss_mb(self.pid)
            self.peak_mb = max(self.peak_mb, self.last_mb)

    def stop(self) -> None:
        self._stop.set()
        self._t.join()


# -- senders (spawned processes) ------------------------------------------------------------------
def _flat_sender(endpoint: str, rank: int, width: int, duration_s: float, go, out) -> None:
    import zmq

    from protocol import encode_hello, encode_metrics

    names = FLAT_VALUES if width <= len(FLAT_VALUES) else tuple(f"layer/{i:04d}/grad_norm" for i in range(width))
    values = {n: 1.0 + i for i, n in enumerate(names)}
    src = (os.getpid() << 8) | rank
    ctx = zmq.Context(1)
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.SNDHWM, 10_000)          # the client's own queue
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    go.wait()
    s.send(encode_hello(src, rank, 0, 0, time.time_ns(), {"world_size": 1 if width > 100 else 8, "rank": rank}))
    seq, sent, dropped, step = 1, 0, 0, 0
    end = time.monotonic() + duration_s
    while time.monotonic() < end:
        for _ in range(100):
            step += 1
            try:
                s.send(encode_metrics(src, rank, seq, dropped, time.time_ns(), step, values), zmq.NOBLOCK)
                sent += 1
            except zmq.Again:
                dropped += 1
            seq += 1
    s.close()
    ctx.term()
    out.put((sent, dropped))


def _drive_flat(endpoint: str, num_ranks: int, width: int, duration_s: float) -> dict:
    mpctx = mp.get_context("spawn")
    go, out = mpctx.Event(), mpctx.Queue()
    procs = [mpctx.Process(target=_flat_sender, args=(endpoint, r, width, duration_s, go, out)) for r in range(num_ranks)]
    for p in procs:
        p.start()
    time.sleep(1.0)   # spawned interpreters up before the clock starts
    go.set()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return {"sent": sum(r[0] for r in results), "dropped_by_senders": sum(r[1] for r in results)}


def _big_config(num_bytes: int) -> dict:
    """A Hugging Face style config of about `num_bytes` encoded: the model's scalars plus a big
    id2label table (what makes real ones large)."""
    cfg = {"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 22, "num_attention_heads": 32,
           "num_key_value_heads": 4, "intermediate_size": 5632, "vocab_size": 32000}
    n = num_bytes // 28
    cfg["id2label"] = {str(i): f"LABEL_{i:010d}" for i in range(n)}
    return cfg


def _drive_hellos(endpoint: str, num_ranks: int, config_bytes: int) -> dict:
    import zmq

    from protocol import encode_hello, encode_metrics

    cfg = _big_config(config_bytes)
    ctx = zmq.Context(1)
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.SNDHWM, 0)
    s.setsockopt(zmq.LINGER, -1)
    s.connect(endpoint)
    sizes = []
    for rank in range(num_ranks):
        f = encode_hello(1000 + rank, rank, 0, 0, time.time_ns(), {"world_size": num_ranks, "rank": rank, "config": cfg})
        sizes.append(len(f))
        s.send(f)
    for step in range(1, 4):
        for rank in range(num_ranks):
            s.send(encode_metrics(1000 + rank, rank, step, 0, time.time_ns(), step, {"train/loss": 1.0}))
    s.close()
    ctx.term()
    return {"hello_bytes": max(sizes)}


def _drive_names(endpoint: str, num_records: int, names_per_record: int) -> dict:
    import zmq

    from protocol import encode_hello, encode_metrics

    ctx = zmq.Context(1)
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.SNDHWM, 0)
    s.setsockopt(zmq.LINGER, -1)
    s.connect(endpoint)
    s.send(encode_hello(77, 0, 0, 0, time.time_ns(), {"world_size": 1, "rank": 0}))
    for i in range(num_records):
        values = {f"user/m{i * names_per_record + j:07d}": float(j) for j in range(names_per_record)}
        s.send(encode_metrics(77, 0, i + 1, 0, time.time_ns(), i + 1, values))
    s.close()
    ctx.term()
    return {"distinct_names": num_records * names_per_record}


# -- one case ------------------------------------------------------------------------------------
class Refused(Exception):
    """The daemon exited at start (a budget it cannot keep): its exit code and output."""


def _start(repo: Path, tmp: Path, memory_mb: float | None, wandb: str) -> DaemonProc:
    log_dir = tmp / "telemetry"
    config = None
    if memory_mb is not None:
        config = tmp / "daemon.yaml"
        config.write_text(f"memory_mb: {memory_mb}\n")
    cmd = daemon_command(log_dir, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", wandb=wandb,
                         config=config)
    env = {**os.environ, "PYTHONPATH": str(repo)}
    proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    d = DaemonProc(proc, log_dir, None)
    try:
        d.wait_ready(120)
    except RuntimeError:
        if proc.returncode is None:
            raise
        raise Refused(f"exit {proc.returncode}: {d.output().strip()}") from None
    return d


def _settle(d: DaemonProc, timeout_s: float = 120.0) -> float:
    """Wait until every record is in and every queue is empty; return the seconds it took."""
    t0 = time.monotonic()
    last_in = -1
    while time.monotonic() - t0 < timeout_s:
        try:
            st = d.status(timeout_s=60)
        except Exception:
            time.sleep(0.5)
            continue
        if st["records_in"] == last_in and not any(st["queued"].values()):
            break
        last_in = st["records_in"]
        time.sleep(1.0)
    return time.monotonic() - t0


def run_case(case: str, repo: Path, duration_s: float, memory_mb: float | None = None,
             wandb: str = "disabled") -> dict:
    with tempfile.TemporaryDirectory(prefix=f"mem-{case}-") as tmp:
        tmp = Path(tmp)
        if case == "world":
            return _world(repo, tmp)
        try:
            d = _start(repo, tmp, memory_mb, wandb)
        except Refused as exc:
            return {"case": case, "memory_mb": memory_mb, "refused": str(exc)}
        try:
            idle = rss_mb(d.proc.pid)
            sampler = Sampler(d.proc.pid)
            t0 = time.monotonic()
            if case == "flat":
                drive = _drive_flat(d.ingest, 8, len(FLAT_VALUES), duration_s)
            elif case == "wide":
                drive = _drive_flat(d.ingest, 1, 4096, duration_s)
            elif case == "hellos":
                drive = _drive_hellos(d.ingest, 300, 860_000)
            elif case == "names":
                drive = _drive_names(d.ingest, 1000, 1000)
            else:
                raise SystemExit(f"unknown case {case!r}")
            load_s = time.monotonic() - t0
            settle_s = _settle(d)
            time.sleep(3.0)        # a quiet moment: the daemon's own after-burst housekeeping
            t1 = time.perf_counter()
            st = d.status(timeout_s=120)
            status_s = time.perf_counter() - t1
            status_bytes = len(json.dumps(st))
            sampler.stop()
            after = rss_mb(d.proc.pid)
            mem = st.get("memory", {})
            return {"case": case, "memory_mb": memory_mb, "idle_mb": round(idle, 1), "peak_mb": round(sampler.peak_mb, 1),
                    "after_mb": round(after, 1), "load_s": round(load_s, 1), "settle_s": round(settle_s, 1),
                    "status_s": round(status_s, 3), "status_bytes": status_bytes, "records_in": st["records_in"],
                    "records_lost": st["records_lost"], "memory": mem, **drive}
        finally:
            d.stop(timeout_s=120)
            d.cleanup()


def _world(repo: Path, tmp: Path) -> dict:
    log_dir = tmp / "telemetry"
    cmd = daemon_command(log_dir, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", world_size=10**9)
    env = {**os.environ, "PYTHONPATH": str(repo)}
    proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak, t0, killed = 0.0, time.monotonic(), False
    while proc.poll() is None:
        peak = max(peak, rss_mb(proc.pid))
        if peak > WORLD_KILL_RSS_MB or time.monotonic() - t0 > WORLD_KILL_S:
            proc.kill()
            killed = True
            break
        time.sleep(SAMPLE_S)
    out = proc.communicate()[0]
    lines = [ln for ln in out.splitlines() if ln.strip()]
    return {"case": "world", "rc": proc.returncode, "peak_mb": round(peak, 1), "killed_by_benchmark": killed,
            "seconds": round(time.monotonic() - t0, 1), "output_lines": len(lines), "first_line": lines[0] if lines else ""}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="flat,wide,hellos,names,world", help="comma-separated cases")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of load in the flat and wide cases")
    ap.add_argument("--memory-mb", type=float, help="the daemon's memory_mb (default: its own default)")
    ap.add_argument("--wandb", default="disabled", choices=("disabled", "offline"), help="the daemon's W&B mode")
    ap.add_argument("--repo", type=Path, default=ROOT, help="the checkout whose daemon is run (default: this one)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args()
    results = []
    for case in args.case.split(","):
        r = run_case(case.strip(), args.repo.resolve(), args.duration, args.memory_mb, args.wandb)
        print(json.dumps(r), flush=True)
        results.append(r)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
