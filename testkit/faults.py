"""Fault-injection scenarios and the harness they run on: real daemons, real rank processes.

Every scenario runs real daemon processes on this machine (ipc sockets, TCP on loopback) and real
rank processes (`TelemetryClient`), injects one fault, and returns its figures as a dict; the
tests (tests/test_fault_*.py, tests/test_multinode_*.py, tests/test_forensics_*.py) call them
with small loads and assert on the figures, and `python -m benchmarks.reliability` runs them
with full loads and prints the table for benchmarks/RESULTS.md.

    kill_restart    SIGKILL the daemon mid-run, append a torn line, restart it
    kill_counted    SIGKILL with records inside it, restart: the successor counts what vanished
    sigterm_drain   SIGTERM with the daemon's queues full: everything accepted is written
    drain_backlog   ranks closed, a backlog queued, SIGTERM: sent == written + counted lost (also
                    with a 1 s drain deadline, where part of the backlog is counted, not written)
    disk_full       RLIMIT_FSIZE on the daemon: JSONL fails whole batches, PUB carries on
    multinode       node daemons forward to a head over TCP + CURVE; the head goes away for a while
    load            N ranks x n records, paced under the HWM (exactly once) or unpaced against a
                    small daemon queue (delivered + counted drops == sent)

The harness: `Endpoints` (fixed ipc endpoints a restarted daemon binds again), `launch` (a daemon
on them, a testkit.daemon_proc.DaemonProc once ready), `start_ranks`/`wait_ranks` (rank
processes), `free_port`. `python -m testkit.faults rank ...` is the rank worker they start.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from protocol import output

ROOT = Path(__file__).resolve().parent.parent

VALUES = {"train/loss": 2.5, "train/lr": 3e-4, "train/grad_norm": 1.1, "perf/step_time": 0.05,
          "perf/tokens": 4096, "perf/samples": 8, "memory/allocated_gb": 12.5, "perf/forward_time": 0.015,
          "perf/backward_time": 0.03, "perf/optimizer_time": 0.005}


# -- the rank worker ---------------------------------------------------------------------------
def rank_main(a: argparse.Namespace) -> int:
    """One rank: log `n` records at `rate` per second (0: as fast as it can); write its figures."""
    from telemetry.client import TelemetryClient

    # linger = the close budget: the queue a rank holds at exit reaches a busy daemon (the client's
    # default, 1 s, bounds a trainer's exit instead, and loses what is still queued after it).
    tm = TelemetryClient(a.endpoint, rank=a.rank, sndhwm=a.sndhwm, send_hello=not a.no_hello,
                         linger_ms=int(a.close_s * 1000))
    interval = 1.0 / a.rate if a.rate > 0 else 0.0
    # --slow-from: a straggler, its phase timing (what it reports) that much longer from that step.
    phase = f"perf/{a.slow_phase}_time"
    slow_values = {**VALUES, phase: VALUES.get(phase, 0.0) + a.slow_by}
    worst_s = 0.0
    slow = 0          # calls over 1 ms
    perf = time.perf_counter
    # --progress: the number of log calls completed, rewritten every 100 calls (a harness waits
    # on it); --until: log until that file exists, then --after more calls (at most --n in all).
    progress = os.open(a.progress, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600) if a.progress else -1
    end = a.n
    after_from = None   # the first step logged after --until appeared
    slice_n = -(-a.n // a.slices) if a.slices > 1 else 0
    t0 = perf()
    i = 0
    while i < end:
        if slice_n and i and i % slice_n == 0:
            # The next slice only once the harness says the daemon has taken the last one
            # (load(slices=...)): what a rank offers is paced under what the daemon digests.
            go = os.path.join(a.slice_dir, f"go-{i // slice_n}")
            deadline = time.monotonic() + 600        # a hang detector: the harness never said so
            while not os.path.exists(go) and time.monotonic() < deadline:
                time.sleep(0.01)
            t0 = perf() - i * interval                # the pace resumes from here, not catching up
        if i % 100 == 0:
            if progress >= 0:
                os.pwrite(progress, b"%-12d\n" % i, 0)
            if a.until and after_from is None and os.path.exists(a.until):
                after_from = i
                end = min(a.n, i + a.after)
                if i >= end:
                    break
        if interval and i % 10 == 0:
            delay = t0 + i * interval - perf()
            if delay > 0:
                time.sleep(delay)
        s = perf()
        step = a.first_step + i
        tm.log(step, {**(slow_values if 0 <= a.slow_from <= step else VALUES), "train/loss": 1.0 + (i % 97) / 97 + a.rank})
        d = perf() - s
        if d > worst_s:
            worst_s = d
        if d > 1e-3:
            slow += 1
        i += 1
    elapsed_s = perf() - t0
    if progress >= 0:
        os.pwrite(progress, b"%-12d\n" % i, 0)
        os.close(progress)
    before_close = tm.stats()
    out = {"rank": a.rank, "n": i, "after_from": after_from, "elapsed_s": elapsed_s, "worst_log_s": worst_s,
           "num_log_over_1ms": slow, "before_close": before_close}
    if a.no_close:
        out["final"] = before_close
        Path(a.out).write_text(json.dumps(out))
        os._exit(0)   # no bye, no linger: what was still queued in this process is never accepted
    _t = time.monotonic()
    tm.close(timeout_s=a.close_s)
    out["close_s"] = time.monotonic() - _t
    out["final"] = tm.stats()
    Path(a.out).write_text(json.dumps(out))
    return 0


def start_ranks(endpoint: str, ranks: list[int], n: int, rate: float, out_dir: Path, sndhwm: int = 10_000,
                env: dict | None = None, extra: tuple[str, ...] = ()) -> list[subprocess.Popen]:
    out_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for r in ranks:
        cmd = [sys.executable, "-m", "testkit.faults", "rank", "--endpoint", endpoint, "--rank", str(r),
               "--n", str(n), "--rate", str(rate), "--sndhwm", str(sndhwm), "--out", str(out_dir / f"rank{r}.json"),
               *extra]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **(env or {})}))
    return procs


def burst_sndhwm(n: int) -> int:
    """The sndhwm that lets a rank worker's queue hold a burst of `n` records on either transport:
    the socket's counts records, a ring's bytes (ring.BYTES_PER_RECORD a record), and a worker's
    record (ten values, a large step, seq and time) takes more than that in a ring."""
    return 2 * n + 10


def wait_ranks(procs: list[subprocess.Popen], out_dir: Path, timeout_s: float = 600) -> dict[int, dict]:
    for p in procs:
        p.wait(timeout_s)
    out = {}
    for f in out_dir.glob("rank*.json"):
        d = json.loads(f.read_text())
        out[d["rank"]] = d
    return out


# -- daemons -----------------------------------------------------------------------------------
class Endpoints:
    """Fixed ipc endpoints in a short private directory, so a restarted daemon gets the same ones."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="tmr-", dir="/tmp"))
        os.chmod(self.dir, 0o700)
        self.ingest, self.pub, self.control = (f"ipc://{self.dir}/{n}" for n in ("i", "p", "c"))


def launch(log_dir: Path, eps: Endpoints, *, config: dict | None = None, extra: tuple[str, ...] = (),
           env: dict | None = None, fsize_limit: int = 0, world_size: int | None = None,
           per_rank: bool = False, nofile_soft: int = 0, ready_timeout_s: float | None = 180):
    """Start a daemon on `eps`; return a DaemonProc (testkit/daemon_proc.py) once it is ready
    (ready_timeout_s=None: at once, the caller waits with wait_ready, e.g. for many started together)."""
    import yaml

    from testkit.daemon_proc import DaemonProc, daemon_command

    log_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = None
    if config:
        cfg_path = log_dir.parent / f"{log_dir.name}.yaml"
        cfg_path.write_text(yaml.safe_dump(config))
    cmd = daemon_command(log_dir, eps.ingest, eps.pub, eps.control, world_size=world_size, per_rank=per_rank,
                         config=cfg_path, extra_args=extra)

    def limits() -> None:   # runs in the child before exec
        if fsize_limit:     # a disk that fills up
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # EFBIG from write(), not death
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize_limit, fsize_limit))
        if nofile_soft:     # a login's default soft descriptor limit, below the hard one
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile_soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    full_env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1",
                **(env or {})}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, preexec_fn=limits if fsize_limit or nofile_soft else None)
    d = DaemonProc(proc, log_dir, None)
    if ready_timeout_s is not None:
        d.wait_ready(ready_timeout_s)   # a hang detector: a daemon's start-up (imports) on a loaded machine
    return d


def jsonl_integrity(log_dir: Path) -> dict:
    """Every line of metrics.jsonl parses and the file ends with a newline."""
    data = (log_dir / "metrics.jsonl").read_bytes()
    lines = data.split(b"\n")
    bad = 0
    for ln in lines[:-1]:
        try:
            output.check(ln)     # JSON, and one of the records protocol/output.py declares
        except ValueError:
            bad += 1
    return {"bytes": len(data), "lines": len(lines) - 1, "bad_lines": bad, "ends_with_newline": data.endswith(b"\n")
            or not data}


def per_rank_steps(d) -> dict[int, int]:
    """Per-rank metrics records written, by rank (distinct steps)."""
    steps: dict[int, set] = {}
    for r in d.read_jsonl("metrics", aggregated=False):
        steps.setdefault(r["rank"], set()).add(r["step"])
    return {r: len(s) for r, s in steps.items()}


# -- scenarios ---------------------------------------------------------------------------------
def _progress(path: Path) -> int:
    """Log calls a rank has completed (its --progress file; 0 before it wrote one)."""
    try:
        return int(path.read_bytes() or b"0")
    except (FileNotFoundError, ValueError):
        return 0


def wait_until(what: str, cond, seen, timeout_s: float = 120.0, period_s: float = 0.05) -> float:
    """Poll `cond()` until true; a hang detector (generous for a loaded machine) that reports
    `seen()` when it fires. Returns the seconds waited."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s; seen: {seen()}")
        time.sleep(period_s)
    return time.monotonic() - t0


def kill_restart(work: Path, num_ranks: int = 2, rate: float = 2000, before: int = 2000, during: int | None = None,
                 after: int = 2000, sndhwm: int = 1000, max_n: int = 10_000_000) -> dict:
    """SIGKILL the daemon once it has taken `before` records of each rank; leave it down until each
    rank has made `during` more log calls (default 2 x sndhwm: more than its queue holds, so a
    client that blocked on a dead daemon never gets there, and the harness's hang detector
    says so); append a torn line; restart; once the new daemon has records of every rank again,
    each rank logs `after` more records and closes. Waits on counts, never on the clock."""
    during = 2 * sndhwm if during is None else during
    eps = Endpoints()
    log_dir = work / "telemetry"
    rank_dir = work / "ranks"
    rank_dir.mkdir(parents=True, exist_ok=True)
    ranks_ = list(range(num_ranks))
    progress = {r: rank_dir / f"progress{r}" for r in ranks_}
    go = rank_dir / "go"
    d = launch(log_dir, eps, per_rank=True, world_size=num_ranks)
    procs = []
    try:
        for r in ranks_:
            procs += start_ranks(eps.ingest, [r], max_n, rate, rank_dir, sndhwm=sndhwm,
                                 extra=("--progress", str(progress[r]), "--until", str(go), "--after", str(after)))

        def received() -> dict:
            per = d.status(timeout_s=30)["per_rank"]
            return {r: per.get(str(r), {}).get("received", 0) for r in ranks_}

        wait_until(f"the daemon receiving {before} records of each rank", lambda: all(
            v >= before for v in received().values()), lambda: {"received": received(), "exited": [
                p.poll() for p in procs]}, period_s=0.2)
        d.proc.kill()
        d.proc.wait(60)
        at_kill = {r: _progress(progress[r]) for r in ranks_}
        t_kill = time.monotonic()
        with open(log_dir / "metrics.jsonl", "ab") as f:   # what a crash in the middle of write() leaves
            f.write(b'{"kind": "metrics", "t": 1.0, "step": 12')
        # The trainer does not wait for the daemon: with no daemon at all, each rank goes on logging.
        wait_until(f"{during} log calls of each rank with the daemon down (does a client block on a dead "
                    f"daemon?)", lambda: all(_progress(progress[r]) - at_kill[r] >= during for r in ranks_),
                    lambda: {"log_calls_since_kill": {r: _progress(progress[r]) - at_kill[r] for r in ranks_},
                             "exited": [p.poll() for p in procs]})
        at_restart = {r: _progress(progress[r]) for r in ranks_}
        down_s = time.monotonic() - t_kill
        d2 = launch(log_dir, eps, per_rank=True, world_size=num_ranks)
        d = d2
        # Each client reconnected by itself: the new daemon has records of every rank.
        wait_until("the restarted daemon receiving records of each rank", lambda: all(
            v > 0 for v in received().values()), lambda: {"received": received(), "exited": [
                p.poll() for p in procs]}, period_s=0.2)
        go.touch()
        ranks = wait_ranks(procs, rank_dir, timeout_s=300)
    except BaseException:
        for p in procs:
            p.kill()
        d.proc.kill()
        d.cleanup()
        raise
    status = d2.status(timeout_s=30)
    final = d2.drain(timeout_s=120)
    steps: dict[int, set] = {}
    for rec in d2.read_jsonl("metrics", aggregated=False):
        steps.setdefault(rec["rank"], set()).add(rec["step"])
    out = {"scenario": "kill_restart", "ranks": num_ranks, "rate_per_rank": rate, "down_s": down_s,
           "repaired_bytes": status["sinks"]["jsonl"].get("repaired_bytes", 0),
           "integrity": jsonl_integrity(log_dir), "exit_code": d2.proc.returncode, "per_rank": {}}
    for r, fig in ranks.items():
        dropped = fig["final"]["dropped"]
        written = steps.get(r, set())
        n = fig["n"]
        # Logged once the restarted daemon had this rank's records again: all of them fit the
        # client's queue, so each is written (a client that stayed disconnected would drop them).
        after_steps = range(fig["after_from"], n) if fig["after_from"] is not None else range(0)
        out["per_rank"][r] = {"n": n, "sent": fig["final"]["sent"], "dropped": dropped,
                              "delivered_metrics": len(written), "silent_loss": n - len(written) - dropped,
                              "log_calls_before_kill": at_kill[r], "log_calls_while_down": at_restart[r] - at_kill[r],
                              "logged_after_restart": len(after_steps),
                              "written_after_restart": sum(1 for s in after_steps if s in written),
                              "worst_log_s": fig["worst_log_s"], "num_log_over_1ms": fig["num_log_over_1ms"]}
    out["final_status"] = {k: final[k] for k in ("records_in", "records_lost", "records_dropped_by_clients")}
    d2.cleanup()
    return out


def sigterm_drain(work: Path, num_ranks: int = 2, n: int = 100_000, drain_timeout_s: float | None = None) -> dict:
    """Fill the daemon's queues with an unpaced burst, then SIGTERM it: what it accepted is written."""
    eps = Endpoints()
    log_dir = work / "telemetry"
    d = launch(log_dir, eps, per_rank=True, world_size=num_ranks,
               config={"drain_timeout_s": drain_timeout_s} if drain_timeout_s else None)
    procs = start_ranks(eps.ingest, list(range(num_ranks)), n, 0, work / "ranks", sndhwm=burst_sndhwm(n),
                        extra=("--no-hello", "--no-close"))
    ranks = wait_ranks(procs, work / "ranks")       # every record is now queued somewhere
    queued = d.status()["queued"] if "queued" in d.status() else {}
    t0 = time.monotonic()
    d.proc.send_signal(signal.SIGTERM)
    try:
        d.proc.wait(max(120.0, 2 * (drain_timeout_s or 0)))   # a hang detector
    except subprocess.TimeoutExpired:
        d.proc.kill()
        d.proc.wait(10)
        raise AssertionError(f"the daemon did not exit after SIGTERM; its output: {d.output()[-3000:]}") from None
    exit_s = time.monotonic() - t0
    d._pump.join(2)
    # The daemon's last daemon record carries its final counters; drain.json, how the drain ended.
    drain = json.loads((log_dir / "drain.json").read_text())
    daemon_recs = d.read_jsonl("daemon")    # none when the drain ran out of time before writing it
    last = daemon_recs[-1]["values"] if daemon_recs else {"telemetry/records_in": drain["records_in"]}
    written = per_rank_steps(d)
    accepted = last["telemetry/records_in"]
    out = {"scenario": "sigterm_drain", "ranks": num_ranks, "records_per_rank": n, "queued_at_signal": queued,
           "exit_code": d.proc.returncode, "exit_s": exit_s, "accepted": accepted,
           "written": sum(written.values()), "sent": sum(r["final"]["sent"] for r in ranks.values()),
           "integrity": jsonl_integrity(log_dir), "drained": drain["drained"],
           "unfinished_sinks": drain["unfinished_sinks"], "stop_reason": drain["stop_reason"]}
    out["lost_after_accept"] = accepted - out["written"]
    d.cleanup()
    return out


def drain_backlog(work: Path, num_ranks: int = 2, n: int = 150_000, drain_timeout_s: float = 12.0) -> dict:
    """Ranks send an unpaced burst and close (everything they sent is in the daemon's queue), then
    SIGTERM: what the drain could not process in time is counted as lost, so that
    sent == written + counted lost, exactly (a rank's own counted drops aside: none while its
    queue holds the burst, burst_sndhwm)."""
    eps = Endpoints()
    log_dir = work / "telemetry"
    # The whole burst fits the daemon's queue (the default budget would hold the ranks at close)
    # and its read-ahead (the ingest share of a 512 MB budget: ~80 MB; of the default, ~32 MB).
    d = launch(log_dir, eps, per_rank=True, world_size=num_ranks,
               config={"drain_timeout_s": drain_timeout_s, "max_connections": 2 * num_ranks + 2,
                       "rcvhwm": (2 * num_ranks + 2) * (n + 10), "memory_mb": 512})
    procs = start_ranks(eps.ingest, list(range(num_ranks)), n, 0, work / "ranks", sndhwm=burst_sndhwm(n),
                        extra=("--no-hello", "--close-s", "60"))
    ranks = wait_ranks(procs, work / "ranks")       # closed: every record sent is in the daemon's queue
    t0 = time.monotonic()
    d.proc.send_signal(signal.SIGTERM)
    d.proc.wait(drain_timeout_s + 30)
    exit_s = time.monotonic() - t0
    d._pump.join(2)
    final = json.loads((log_dir / "drain.json").read_text())          # the daemon's final counters
    sent = sum(r["final"]["sent"] for r in ranks.values())          # metrics and the ranks' byes
    # What a rank dropped (its queue full) it counts, and the daemon counts lost by its seqs.
    dropped = sum(r["final"]["dropped"] for r in ranks.values())
    written = sum(per_rank_steps(d).values()) + len(d.read_jsonl("bye"))
    jsonl = final["sinks"]["jsonl"]
    integrity = jsonl_integrity(log_dir)
    out = {"scenario": "drain_backlog", "ranks": num_ranks, "records_per_rank": n,
           "drain_timeout_s": drain_timeout_s, "exit_code": d.proc.returncode, "exit_s": exit_s, "sent": sent,
           "dropped_by_ranks": dropped, "accepted": final["records_in"], "counted_lost": final["records_lost"],
           "unread_at_drain": final["records_unread_at_drain"], "written": written,
           "jsonl": {k: jsonl.get(k, 0) for k in ("in", "written", "dropped", "dropped_in_hand")}, "integrity": integrity}
    # Each stage adds up: the intake (sent + dropped by the ranks = accepted + counted lost) and the JSONL (what it was
    # handed = lines written + lines counted as dropped; the file holds exactly the lines written,
    # but for a batch the sink still had in hand when it was abandoned at the deadline and the
    # counters were read: counted dropped, it may yet reach the file, which the sink says).
    out["unaccounted_intake"] = sent + dropped - final["records_in"] - final["records_lost"]
    out["unaccounted_jsonl"] = jsonl["in"] - jsonl["written"] - jsonl["dropped"]
    out["file_vs_written"] = integrity["lines"] - jsonl["written"]
    out["file_past_count"] = max(0, out["file_vs_written"] - jsonl.get("dropped_in_hand", 0))
    # A rank whose bye the drain could not reach by its deadline is open (per_rank): what it sent
    # after its last record read is known to no one, which the daemon says (per_rank's open, and
    # the log names it with that seq). Such a tail is said, not hidden; anything else
    # unaccounted is (hidden_loss).
    log_text = (log_dir / "daemon.log").read_text() if (log_dir / "daemon.log").exists() else d.output()
    out["open_ranks"] = {}
    for rank, pr in final["per_rank"].items():
        if pr["open"]:
            info = ranks[int(rank)]["final"]
            window = pr["received"] + pr["refused"] + pr["lost"] + pr["earlier"]    # seqs 0..last
            out["open_ranks"][rank] = {"last_seq": window - 1, "tail": info["sent"] - window,
                                       "named": f"rank {rank} (src {info['src']}, last seq {window - 1})" in log_text}
    out["hidden_loss"] = out["unaccounted_intake"] - sum(o["tail"] for o in out["open_ranks"].values() if o["named"])
    d.cleanup()
    return out


def disk_full(work: Path, limit_bytes: int = 256 * 1024, n: int = 4000, rate: float = 2000) -> dict:
    """The JSONL file may not grow past `limit_bytes`: batches fail whole, PUB carries on."""
    import zmq

    eps = Endpoints()
    log_dir = work / "telemetry"
    d = launch(log_dir, eps, world_size=1, fsize_limit=limit_bytes, config={"jsonl": {"fsync_interval_s": 0.2}})
    sub = d.subscribe(b"metrics", rcvtimeo_ms=100)   # owned by the reader thread until it stops
    got: set[int] = set()
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                _, line = sub.recv_multipart()
            except zmq.Again:
                continue
            rec = json.loads(line)
            if "rank" not in rec:
                got.add(rec["step"])

    t = threading.Thread(target=read, daemon=True)
    t.start()
    time.sleep(0.3)
    procs = start_ranks(eps.ingest, [0], n, rate, work / "ranks")
    ranks = wait_ranks(procs, work / "ranks")
    deadline = time.monotonic() + 120   # a hang detector: the test asserts all n arrived
    while len(got) < n and time.monotonic() < deadline:
        time.sleep(0.1)
    status = d.status()
    alive = d.proc.poll() is None
    final = d.drain()
    stop.set()
    t.join(10)
    assert not t.is_alive(), "PUB reader did not stop"
    sub.close(linger=0)   # only after its thread is gone: a zmq socket is never shared
    j = final["sinks"]["jsonl"]
    out = {"scenario": "disk_full", "limit_bytes": limit_bytes, "steps": n, "alive_when_full": alive,
           "jsonl_write_errors": j.get("write_errors", 0), "jsonl_dropped": j["dropped"],
           "jsonl_written": j["written"], "pub_steps_received": len(got), "integrity": jsonl_integrity(log_dir),
           "status_reports_error": "last_error" in status["sinks"]["jsonl"], "exit_code": d.proc.returncode,
           "sent": ranks[0]["final"]["sent"]}
    d.cleanup()
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_keys(work: Path, num_nodes: int) -> tuple[Path, Path]:
    """CURVE keys as a job makes them (docs/multinode.md): `keys/head.key_secret` for the head,
    `keys/node<i>.key_secret` for each node, and `keys/allowed/` (every node's public key), the
    head's allow-list. Returns (keys, allowed)."""
    from telemetry.tools.keygen import make_pair

    keys = work / "keys"
    make_pair(keys, "head")
    allowed = keys / "allowed"
    allowed.mkdir(mode=0o700)
    for i in range(num_nodes):
        pub_key, _ = make_pair(keys, f"node{i}")
        (allowed / pub_key.name).write_bytes(pub_key.read_bytes())
    return keys, allowed


def multinode(work: Path, num_nodes: int = 2, ranks_per_node: int = 2, rate: float = 20.0,
              before_s: float = 2.0, outage_s: float = 5.0, after_s: float = 3.0, max_buffered: int = 50,
              relaunch_steps: int = 0) -> dict:
    """Node daemons forward to a head over TCP + CURVE; the head is stopped for `outage_s`.
    relaunch_steps: once the ranks are done, new rank processes (a relaunched job) log that many
    steps more, going on from the last step. The result holds the goodput ledgers of the head's
    and each node's metrics.jsonl, and the head's own live ledger before its drain."""
    from telemetry.shared.goodput import ledger

    keys, allowed = node_keys(work, num_nodes)
    port = free_port()
    head_eps = Endpoints()
    head_cfg = {"security": {"server_secret_key": str(keys / "head.key_secret"),
                             "allowed_clients_dir": str(allowed), "curve_loopback": True},
                "aggregator": {"step_timeout_s": 5.0}}
    head_args = ("--remote-ingest", f"tcp://127.0.0.1:{port}")
    head = launch(work / "head", head_eps, config=head_cfg, extra=head_args, world_size=num_nodes)
    nodes, node_eps = [], []
    for i in range(num_nodes):
        eps = Endpoints()
        cfg = {"forward": {"endpoint": f"tcp://127.0.0.1:{port}", "node_rank": i, "num_nodes": num_nodes,
                           "server_public_key": str(keys / "head.key"),
                           "client_secret_key": str(keys / f"node{i}.key_secret"), "max_buffered": max_buffered,
                           "heartbeat_ivl_s": 0.5, "heartbeat_timeout_s": 2.0}}
        nodes.append(launch(work / f"node{i}", eps, config=cfg, world_size=ranks_per_node))
        node_eps.append(eps)
    world = num_nodes * ranks_per_node
    n = int(rate * (before_s + outage_s + after_s))
    procs = []
    for i, eps in enumerate(node_eps):
        ranks = list(range(i * ranks_per_node, (i + 1) * ranks_per_node))
        procs += start_ranks(eps.ingest, ranks, n, rate, work / f"ranks{i}", env={"WORLD_SIZE": str(world)})
    time.sleep(before_s)

    def fwd(d) -> dict:
        return d.status()["sinks"]["forward"]

    head_finals = []
    outage = {}
    if outage_s > 0:
        # The outage starts when the head has exited: its drain takes records in until the ranks'
        # byes or a quiet moment (up to shutdown.BYE_WAIT_S while the nodes keep forwarding).
        head_finals.append(head.drain())
        at_stop = [fwd(nd) for nd in nodes]
        time.sleep(outage_s)
        at_restart = [fwd(nd) for nd in nodes]
        head = launch(work / "head", head_eps, config=head_cfg, extra=head_args, world_size=num_nodes)
        for i in range(num_nodes):
            tried = at_restart[i]["seq"] - at_stop[i]["seq"]
            dropped = at_restart[i]["dropped"] - at_stop[i]["dropped"]
            outage[i] = {"records_during_outage": tried, "dropped_during_outage": dropped,
                         "buffered": tried - dropped}
    for i in range(num_nodes):
        wait_ranks(procs[i * ranks_per_node:(i + 1) * ranks_per_node], work / f"ranks{i}")
    if relaunch_steps:
        procs = []
        for i, eps in enumerate(node_eps):
            ranks = list(range(i * ranks_per_node, (i + 1) * ranks_per_node))
            procs += start_ranks(eps.ingest, ranks, relaunch_steps, rate, work / f"relaunch{i}",
                                 env={"WORLD_SIZE": str(world)}, extra=("--first-step", str(n)))
        for i in range(num_nodes):
            wait_ranks(procs[i * ranks_per_node:(i + 1) * ranks_per_node], work / f"relaunch{i}")
    node_finals = [nd.drain() for nd in nodes]
    # The head has every node's bye once their forwarders have flushed.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        per = head.status()["per_rank"]
        if all(per.get(str(i), {}).get("received", 0) + sum(h["per_rank"].get(str(i), {}).get("received", 0)
                                                            for h in head_finals)
               >= node_finals[i]["sinks"]["forward"]["sent"] for i in range(num_nodes)):
            break
        time.sleep(0.2)
    # The head's own ledger, once it has fed it every step it wrote (a hang detector).
    deadline = time.monotonic() + 60
    while (live := head.status()["goodput"]).get("steps") != len(head.steps()) and time.monotonic() < deadline:
        time.sleep(0.2)
    head_finals.append(head.drain())
    steps = head.steps()
    out = {"scenario": "multinode", "nodes": num_nodes, "ranks_per_node": ranks_per_node, "steps_per_rank": n,
           "outage_s": outage_s, "max_buffered": max_buffered, "per_node": {},
           "head_steps": len(steps), "head_security": head_finals[-1]["security"],
           "head_world_size": head_finals[-1]["world_size"], "head_live_goodput": live,
           "head_ledger": ledger(head.read_jsonl()), "node_ledgers": [ledger(nd.read_jsonl()) for nd in nodes]}
    complete = [s for s, r in steps.items() if "missing_ranks" not in r]
    if complete:
        r = steps[complete[len(complete) // 2]]["values"]
        out["sample_step"] = {k: r.get(k) for k in ("train/loss", "perf/tokens", "perf/step_time")}
    for i in range(num_nodes):
        f = node_finals[i]["sinks"]["forward"]
        received = sum(h["per_rank"].get(str(i), {}).get("received", 0) for h in head_finals)
        # Lost in transit and counted by the head: what was in flight when the head went (the
        # restarted head continues the node's seq window from sources.json).
        last = head_finals[-1]["per_rank"].get(str(i), {})
        counted = last.get("lost", 0) - last.get("dropped_by_client", 0) \
            + sum(h["per_rank"].get(str(i), {}).get("refused", 0) for h in head_finals)
        out["per_node"][i] = {"tried": f["seq"], "sent": f["sent"], "dropped": f["dropped"], "received": received,
                              "counted_lost": counted, "silent_loss": f["seq"] - f["dropped"] - received - counted,
                              **outage.get(i, {})}
    for d in [head, *nodes]:
        d.cleanup()
    return out


def wait_forwarded(upper, lower_finals: dict[int, dict], what: str) -> None:
    """Wait until `upper` has taken in (or counted lost) all that each drained daemon of
    `lower_finals` (index -> its final counters) forwarded to it: a hang detector."""
    sent = {k: f["sinks"]["forward"]["seq"] for k, f in lower_finals.items()}

    def done() -> bool:
        per = upper.status()["per_rank"]
        return all(sum(per.get(str(k), {}).get(x, 0) for x in ("received", "refused", "lost", "earlier")) >= v
                   for k, v in sent.items())
    wait_until(what, done, lambda: upper.status()["per_rank"], timeout_s=120, period_s=0.2)


class NodeTree:
    """A head daemon (a remote ingest on loopback TCP, no CURVE) and `num_nodes` node daemons
    forwarding to it, each fed by `ranks_per_node` rank processes logging `n` steps at `rate`:
    for tests that do something to a node or to the head meanwhile. A context manager: whatever
    is still running at its end is killed and cleaned up.

    head_config / node_config: daemon config (node_config(i) -> dict, merged with `forward`);
    node_env(i): the environment of node i's daemon and ranks; rank_extra(r): rank r's worker's
    extra arguments."""

    def __init__(self, work: Path, num_nodes: int, ranks_per_node: int, n: int, rate: float, *,
                 head_config: dict | None = None, node_config=None, node_env=None, rank_extra=None) -> None:
        self.work, self.num_nodes, self.ranks_per_node = work, num_nodes, ranks_per_node
        self.n, self.rate = n, rate
        self.head_config = head_config
        self._node_config = node_config or (lambda i: {})
        self._node_env = node_env or (lambda i: {})
        self._rank_extra = rank_extra or (lambda i: ())
        self.port = free_port()
        self.head_eps = Endpoints()
        self.head = None
        self.nodes: list = []
        self.procs: list[subprocess.Popen] = []
        self._started: list = []

    def __enter__(self) -> "NodeTree":
        try:
            self.head = self._launch_head()
            for i in range(self.num_nodes):
                eps = Endpoints()
                cfg = self._node_config(i)
                cfg = {**cfg, "forward": {"endpoint": f"tcp://127.0.0.1:{self.port}", "node_rank": i,
                                          "num_nodes": self.num_nodes, **cfg.get("forward", {})}}
                node = launch(self.work / f"node{i}", eps, config=cfg, world_size=self.ranks_per_node,
                              env=self._node_env(i) or None)
                self._started.append(node)
                self.nodes.append(node)
                for r in range(i * self.ranks_per_node, (i + 1) * self.ranks_per_node):
                    self.procs += start_ranks(eps.ingest, [r], self.n, self.rate, self.work / "ranks",
                                              env={"WORLD_SIZE": str(self.world), **self._node_env(i)},
                                              extra=self._rank_extra(r))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    @property
    def world(self) -> int:
        return self.num_nodes * self.ranks_per_node

    def _launch_head(self):
        head = launch(self.work / "head", self.head_eps, config=self.head_config, world_size=self.num_nodes,
                      extra=("--remote-ingest", f"tcp://127.0.0.1:{self.port}"))
        self._started.append(head)
        return head

    def restart_head(self) -> None:
        """SIGKILL the head and start it again on its log directory, endpoints and port."""
        self.head.proc.kill()
        self.head.proc.wait(60)
        self.head.cleanup()
        self.head = self._launch_head()

    def finish(self, gone: tuple[int, ...] = ()) -> dict:
        """Wait for the ranks, drain every node but those `gone`, wait until the head has what
        each forwarded, take its status, drain it: {"finals" (per node), "status", "head_final"}."""
        done = wait_ranks(self.procs, self.work / "ranks")
        assert sorted(done) == list(range(self.world)) and all(p.returncode == 0 for p in self.procs), \
            f"a rank did not finish: {sorted(done)}, exit codes {[p.returncode for p in self.procs]}"
        finals = {i: node.drain() for i, node in enumerate(self.nodes) if i not in gone}
        wait_forwarded(self.head, finals, "the head has every live node's records")
        status = self.head.status()
        return {"finals": finals, "status": status, "head_final": self.head.drain()}

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for d in self._started:
            d.cleanup()


def group_tree(work: Path, num_groups: int = 2, nodes_per_group: int = 2, ranks_per_node: int = 2,
               n: int = 60, rate: float = 20.0) -> dict:
    """One level more (issue 33): node daemons forward to their group's head, each group head
    (remote ingest and forward) to the job's head; CURVE on both links (loopback, curve_loopback),
    each group head a CURVE server for its nodes and a client of the job head. Each rank logs n
    steps at `rate`; then the daemons drain from the leaves up. The result: each daemon's final
    counters, the job head's steps, hellos and events, and per link what was tried and received."""
    from telemetry.tools.keygen import make_pair

    keys = work / "keys"
    make_pair(keys, "job")
    num_nodes = num_groups * nodes_per_group
    allowed = {name: keys / f"allowed-{name}" for name in ("job", *(f"group{g}" for g in range(num_groups)))}
    for d in allowed.values():
        d.mkdir(mode=0o700)
    for g in range(num_groups):
        pub, _ = make_pair(keys, f"group{g}")
        (allowed["job"] / pub.name).write_bytes(pub.read_bytes())
    for i in range(num_nodes):
        pub, _ = make_pair(keys, f"node{i}")
        (allowed[f"group{i // nodes_per_group}"] / pub.name).write_bytes(pub.read_bytes())

    def server(name: str) -> dict:
        return {"server_secret_key": str(keys / f"{name}.key_secret"), "allowed_clients_dir": str(allowed[name]),
                "curve_loopback": True}

    def link(port: int, me: str, index: int, count: int, server_name: str) -> dict:
        return {"endpoint": f"tcp://127.0.0.1:{port}", "node_rank": index, "num_nodes": count,
                "server_public_key": str(keys / f"{server_name}.key"),
                "client_secret_key": str(keys / f"{me}.key_secret"), "heartbeat_ivl_s": 0.5, "heartbeat_timeout_s": 2.0}

    # Generous: the daemons and ranks start one after the other on a loaded machine; every rank
    # sends every step, so a timeout only ever closes a step that would never be complete.
    timeouts = {"step_timeout_s": 30.0}
    started: list = []
    try:
        job_port = free_port()
        job = launch(work / "job", Endpoints(), config={"security": server("job"), "aggregator": timeouts},
                     extra=("--remote-ingest", f"tcp://127.0.0.1:{job_port}"), world_size=num_groups)
        started.append(job)
        groups, group_ports = [], []
        for g in range(num_groups):
            group_ports.append(free_port())
            cfg = {"security": server(f"group{g}"), "aggregator": timeouts,
                   "forward": link(job_port, f"group{g}", g, num_groups, "job")}
            groups.append(launch(work / f"group{g}", Endpoints(), config=cfg, world_size=nodes_per_group,
                                 extra=("--remote-ingest", f"tcp://127.0.0.1:{group_ports[g]}")))
            started.append(groups[-1])
        nodes, node_eps, procs = [], [], []
        world = num_nodes * ranks_per_node
        for i in range(num_nodes):
            node_eps.append(Endpoints())
            g = i // nodes_per_group
            cfg = {"aggregator": timeouts, "forward": link(group_ports[g], f"node{i}", i, num_nodes, f"group{g}")}
            nodes.append(launch(work / f"node{i}", node_eps[i], config=cfg, world_size=ranks_per_node))
            started.append(nodes[-1])
        for i in range(num_nodes):
            procs.append(start_ranks(node_eps[i].ingest, list(range(i * ranks_per_node, (i + 1) * ranks_per_node)), n,
                                     rate, work / f"ranks{i}", env={"WORLD_SIZE": str(world)}))
        for i in range(num_nodes):
            wait_ranks(procs[i], work / f"ranks{i}")

        node_finals = {i: nd.drain() for i, nd in enumerate(nodes)}
        for g, gd in enumerate(groups):
            wait_forwarded(gd, {i: node_finals[i] for i in range(g * nodes_per_group, (g + 1) * nodes_per_group)},
                           f"group head {g} has its nodes' records")
        group_finals = {g: gd.drain() for g, gd in enumerate(groups)}
        wait_forwarded(job, group_finals, "the job head has its groups' records")
        job_final = job.drain()
        return {"node_finals": node_finals, "group_finals": group_finals, "job_final": job_final,
                "job_records": job.read_jsonl(), "job_steps": job.steps(), "job_hellos": job.read_jsonl("hello"),
                "job_events": job.read_jsonl("event")}
    finally:
        for d in started:
            d.cleanup()


def multinode_straggler(work: Path, num_nodes: int = 4, ranks_per_node: int = 2, n: int = 240,
                        slow_from: int = 200, slow_ranks: tuple[int, ...] = (5,), rate: float = 40.0) -> dict:
    """Node daemons forwarding to a head (loopback, no CURVE); every rank reports the same phase
    timings (testkit VALUES) except `slow_ranks`, whose forward is 0.05 s longer from step
    `slow_from` on. Returns each node's and the head's straggler findings (diagnosis/straggler
    events) and the head's steps."""
    slow = {"aggregator": {"step_timeout_s": 30.0}}
    with NodeTree(work, num_nodes, ranks_per_node, n, rate, head_config=slow, node_config=lambda i: slow,
                  rank_extra=lambda r: ("--slow-from", str(slow_from)) if r in slow_ranks else ()) as tree:
        end = tree.finish()

        def findings(d) -> list[dict]:
            return [e for e in d.read_jsonl("event") if e["name"] == "diagnosis/straggler"]
        return {"node_findings": {i: findings(nd) for i, nd in enumerate(tree.nodes)},
                "head_findings": findings(tree.head), "head_steps": tree.head.steps(),
                "head_final": end["head_final"], "node_finals": end["finals"]}


def load(work: Path, num_ranks: int = 8, n: int = 125_000, rate: float = 5000, sndhwm: int = 10_000,
         rcvhwm: int | None = None, name: str = "load", max_connections: int | None = None,
         close_s: float = 30.0, slices: int = 1) -> dict:
    """`num_ranks` rank processes x `n` records at `rate` each (0: unpaced) into one daemon whose
    ingest queue budget is `rcvhwm`, shared by `max_connections` (None: the daemon's defaults);
    each rank's close waits up to `close_s` for its queue to reach the daemon. With `slices` > 1
    each rank sends its records in that many slices, the next only once the daemon's status
    accounts for every rank's last one (received, or counted lost): paced by the daemon."""
    eps = Endpoints()
    log_dir = work / "telemetry"
    limits = {"rcvhwm": rcvhwm, "max_connections": max_connections}
    d = launch(log_dir, eps, world_size=num_ranks, config={k: v for k, v in limits.items() if v is not None})
    t0 = time.monotonic()
    slice_dir = work / "slices"
    slice_dir.mkdir(parents=True, exist_ok=True)
    procs = start_ranks(eps.ingest, list(range(num_ranks)), n, rate, work / "ranks", sndhwm=sndhwm,
                        extra=("--close-s", str(close_s), "--slices", str(slices), "--slice-dir", str(slice_dir)))
    slice_n = -(-n // slices)
    for k in range(1, slices):
        deadline = time.monotonic() + 600          # a hang detector, generous for a loaded machine
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            per = d.status()["per_rank"]
            if all(sum(per.get(str(r), {}).get(x, 0) for x in ("received", "lost")) >= 1 + k * slice_n
                   for r in range(num_ranks)):       # + hello
                break
            time.sleep(0.05)
        (slice_dir / f"go-{k}").touch()
    ranks = wait_ranks(procs, work / "ranks")
    send_s = time.monotonic() - t0
    # Everything sent is in the daemon's socket or on its way: wait until each rank's records
    # are accounted for (received, or counted lost once its bye arrived); the drain takes the rest.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        per = d.status()["per_rank"]
        if all(sum(per.get(str(r), {}).get(k, 0) for k in ("received", "lost")) >= ranks[r]["final"]["seq"]
               for r in ranks):
            break
        time.sleep(0.25)
    final = d.drain(timeout_s=120)
    steps = d.read_jsonl("metrics", aggregated=True)
    out = {"scenario": name, "ranks": num_ranks, "records_per_rank": n, "rate_per_rank": rate, "sndhwm": sndhwm,
           "rcvhwm": rcvhwm, "max_connections": max_connections, "send_s": send_s, "offered_per_s": num_ranks * n / max(send_s, 1e-9),
           "steps_written": len(steps), "steps_incomplete": sum(1 for s in steps if "missing_ranks" in s),
           "per_rank": {}}
    tokens_ok = sum(1 for s in steps if s["values"].get("perf/tokens") == VALUES["perf/tokens"] * num_ranks)
    out["steps_with_all_ranks_tokens"] = tokens_ok
    out["byes_in"] = final["records_in_by_kind"]["bye"]
    out["lost_in_transit"] = final["records_lost_in_transit"]
    for r, fig in ranks.items():
        f = fig["final"]
        per = final["per_rank"].get(str(r), {})
        out["per_rank"][r] = {"tried": f["seq"], "sent": f["sent"], "dropped": f["dropped"],
                              "received": per.get("received", 0), "lost": per.get("lost", 0),
                              "worst_log_s": fig["worst_log_s"]}
    d.cleanup()
    return out


def kill_counted(work: Path, n_before: int = 2000, n_stopped: int = 500, n_after: int = 500) -> dict:
    """SIGKILL with records inside the daemon, then restart on the same log dir: the successor
    counts what vanished (sources.json, the predecessor's per-source accounting) once the
    client's next records arrive, so that sent == written + counted lost, exactly.

    One client (a PUSH socket sending what TelemetryClient sends, src 7, seq 0, 1, ...):
    n_before records written by the first daemon; n_stopped sent while it is SIGSTOPped (in its
    socket buffers: they die with it, or reach the successor from the client's own queue); then
    SIGKILL, restart, n_after more and a bye."""
    import zmq

    from protocol import encode_bye, encode_metrics

    eps = Endpoints()
    log_dir = work / "telemetry"
    d = launch(log_dir, eps, per_rank=True, world_size=1)
    ctx = zmq.Context()
    push = d.push(ctx)          # a raw PUSH: linger 0, sndhwm 100,000
    seq = 0

    def send(count: int) -> None:
        nonlocal seq
        for _ in range(count):
            push.send(encode_metrics(7, 0, seq, 0, time.time_ns(), seq, {"train/loss": 1.0}))
            seq += 1

    send(n_before)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:       # written, and checkpointed (CHECKPOINT_INTERVAL_S)
        snap = json.loads((log_dir / "sources.json").read_text()) if (log_dir / "sources.json").exists() else {}
        if any(row[4] >= n_before for row in snap.get("sources", [])):
            break
        time.sleep(0.1)
    d.proc.send_signal(signal.SIGSTOP)
    send(n_stopped)
    time.sleep(0.5)
    d.proc.kill()
    d.proc.wait(10)
    d._pump.join(2)
    written_by_first = d.read_jsonl("metrics")
    d2 = launch(log_dir, eps, per_rank=True, world_size=1)
    send(n_after)
    push.send(encode_bye(7, 0, seq, 0, time.time_ns(), {"sent": seq + 1, "dropped": 0}))
    sent = seq + 1
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and d2.status()["records_in"] < n_after + 1:
        time.sleep(0.1)
    final = d2.drain()
    push.close(0)
    ctx.term()
    # The whole file, both daemons' lines; a per-rank line per record (step = seq).
    rank_lines = [r for r in d2.read_jsonl("metrics", aggregated=False)]
    steps = {r["step"] for r in rank_lines}
    written = len(steps) + len(d2.read_jsonl("bye"))
    out = {"scenario": "kill_counted", "sent": sent, "written": written,
           "written_by_first": len({r["step"] for r in written_by_first if "rank" in r}),
           "counted_lost": final["records_lost"], "lost_in_transit": final["records_lost_in_transit"],
           "lines_written_twice": len(rank_lines) - len(steps)}
    out["unaccounted"] = sent - written - final["records_lost"]
    d2.cleanup()
    return out


# -- the rank worker's command line --------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="The rank worker the scenarios start: python -m testkit.faults rank ...")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("rank")
    r.add_argument("--endpoint", required=True)
    r.add_argument("--rank", type=int, required=True)
    r.add_argument("--n", type=int, required=True)
    r.add_argument("--rate", type=float, default=0.0)
    r.add_argument("--sndhwm", type=int, default=10_000)
    r.add_argument("--close-s", type=float, default=30.0)   # let a slow daemon take the queue
    r.add_argument("--no-hello", action="store_true")
    r.add_argument("--no-close", action="store_true")
    r.add_argument("--slices", type=int, default=1, help="send in this many slices, each after go-<k> exists")
    r.add_argument("--slice-dir", default="")
    r.add_argument("--progress", help="a file that holds the number of log calls completed")
    r.add_argument("--until", help="log until this file exists, then --after more records")
    r.add_argument("--after", type=int, default=0)
    r.add_argument("--first-step", type=int, default=0, help="the step of the first log call (a relaunch goes on)")
    r.add_argument("--slow-from", type=int, default=-1, help="from this step on, log --slow-phase --slow-by s longer")
    r.add_argument("--slow-phase", default="forward")
    r.add_argument("--slow-by", type=float, default=0.05)
    r.add_argument("--out", required=True)
    return rank_main(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
