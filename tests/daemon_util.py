"""Start a real telemetry daemon subprocess for tests, and talk to it.

    from daemon_util import start_daemon   # tests/ is on pytest's path; or the `daemon` / `make_daemon` fixtures
    d = start_daemon(tmp_path, world_size=2)            # waits for "telemetry daemon ready"
    tm = TelemetryClient(d.ingest, rank=0); tm.log(1, {"train/loss": 1.0}); tm.close()
    d.wait_for(lambda recs: any(r.get("step") == 1 for r in recs))
    d.status()["records_in"]; final = d.drain()          # or d.stop() (SIGTERM), returns the exit code
    d.read_jsonl(kind="metrics")

Endpoints are ipc sockets in a short private directory (tmp_path can exceed the 107-byte unix
socket limit) or, with transport="tcp", tcp://127.0.0.1:0: the daemon binds a free port and its
ready line reports the real one, so there is no port race. The process handle (DaemonProc) is
testkit/daemon_proc.py, which the fault-injection scenarios (testkit/faults.py) and the
benchmarks use too.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from testkit.daemon_proc import DaemonProc, daemon_command

ROOT = Path(__file__).resolve().parent.parent


def start_daemon(tmp_path: Path, *, transport: str = "ipc", wandb: str = "disabled",
                 world_size: int | None = None, per_rank: bool = False, config: dict[str, Any] | None = None,
                 extra_args: tuple[str, ...] = (), env: dict[str, str] | None = None,
                 log_dir: Path | None = None, run_name: str | None = None,
                 endpoints: tuple[str, str, str] | None = None, ready_timeout_s: float = 180.0) -> DaemonProc:
    """Start `python -m telemetry daemon` and wait for its ready line.

    config: a dict written as the daemon's YAML config (flags still override it).
    env: extra environment; WANDB_MODE/WANDB_DIR point at tmp_path unless given.
    endpoints: (ingest, pub, control) to bind, e.g. a killed daemon's, as an operator restarts
    one where its clients still send (the caller keeps them; this one removes nothing of them).
    """
    tmp_path = Path(tmp_path)
    log_dir = Path(log_dir) if log_dir is not None else tmp_path / "telemetry"
    runtime_dir = None
    if endpoints is not None:
        ingest, pub, control = endpoints
    elif transport == "ipc":
        runtime_dir = Path(tempfile.mkdtemp(prefix="tmd-", dir="/tmp"))
        ingest, pub, control = (f"ipc://{runtime_dir}/{n}.sock" for n in ("ingest", "pub", "control"))
    elif transport == "tcp":
        ingest = pub = control = "tcp://127.0.0.1:0"
    else:
        raise ValueError(f"transport {transport!r}: expected ipc or tcp")
    cfg_path = None
    if config is not None:
        import yaml

        cfg_path = tmp_path / "daemon.yaml"
        cfg_path.write_text(yaml.safe_dump(config))
    full_env = {**os.environ, "WANDB_MODE": wandb if wandb != "online" else "offline",
                "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}
    full_env.update(env or {})
    if run_name:
        extra_args = ("--run-name", run_name, *extra_args)
    cmd = daemon_command(log_dir, ingest, pub, control, wandb=wandb, world_size=world_size, per_rank=per_rank,
                         config=cfg_path, extra_args=extra_args)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    d = DaemonProc(proc, log_dir, runtime_dir)
    try:
        d.wait_ready(ready_timeout_s)
    except BaseException:
        d.cleanup()
        raise
    return d


def step_values(log_dir: Path) -> dict[int, dict]:
    """The values the script logged at each aggregated step of a run directory's metrics.jsonl
    (a run whose daemon a test did not start itself: `telemetry run`, a daemon started by a
    script): without the client's own time (CLIENT_TIME_KEY, which the client adds by itself;
    test_goodput.py checks it)."""
    import json

    out = {}
    for line in (Path(log_dir) / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "metrics" and "rank" not in rec:
            out[rec["step"]] = script_values(rec["values"])
    return out


def script_values(values: dict) -> dict:
    """A step's values without the client's own time (CLIENT_TIME_KEY: the client adds it by
    itself; the W&B sink keeps it out of a user's run)."""
    from protocol.constants import CLIENT_TIME_KEY

    return {k: v for k, v in values.items() if k != CLIENT_TIME_KEY}


def feed(receiver, frames: list) -> tuple[list, bool]:
    """Hand `frames` to a Receiver as the daemon does (`take`): the valid records, and whether
    they are all metrics records."""
    recs, all_metrics, _ = receiver.take(iter(frames).__next__, StopIteration, len(frames))
    return recs, all_metrics


def feed_one(receiver, frame: bytes):
    """One frame through `feed`: its record, or None (counted) when it is not a valid record."""
    recs, _ = feed(receiver, [frame])
    return recs[0] if recs else None


def kernel_keeps_exit_status() -> bool:
    """Whether this kernel keeps a process's exit status for a pidfd holder after the parent
    reaped it (PIDFD_INFO_EXIT, Linux 6.15 and later): how a daemon learns how a process it only
    watched (its launcher, a --watch-pid script) ended."""
    from telemetry.daemon.forensics.collect import pidfd_exit_status

    child = subprocess.Popen(["sleep", "0.2"])
    try:
        fd = os.pidfd_open(child.pid)
    except (AttributeError, OSError):
        child.wait()
        return False
    try:
        child.wait()
        return pidfd_exit_status(fd) is not None
    finally:
        os.close(fd)
