"""A daemon for the node, started by the first local process that needs one.

Without it a script switched to `telemetry.wandb` (or the HF callback, the Lightning logger, the
Accelerate tracker) and run without a daemon trained and kept nothing: its records queued for a
socket nobody listened on. `wandb.init()` starts W&B's own service process; these start ours:

- When the ranks would send to the default endpoints (no $TELEMETRY_ENDPOINT: a launcher that
  runs its own daemon, like `launch/run.sh`, sets it) and no daemon serves the runtime directory
  (a daemon holds its `daemon.lock`: shared/endpoints.daemon_serves), the first local process to
  take the start lock starts `telemetry daemon` there, writing the run to
  `./telemetry/<run-id>/` ($TELEMETRY_DIR/<run-id>/, or DIR/telemetry/<run-id>/ for
  `wandb.init(dir=DIR)`), and prints one line saying so. The other ranks find it and connect.
- A W&B run (telemetry.wandb) has a daemon of its own: its runtime directory is keyed by its run
  id (`run_runtime_dir`: `<runtime dir>/run-<id>/`), so trials of a sweep, forked children and
  the folds of a k-fold loop, each with its own id, never share a daemon, a run directory or a
  W&B run; ranks that share one id (torchrun with $WANDB_RUN_ID) converge on one daemon under
  the start lock of that directory. The process that started a run's daemon drains it when the
  run finishes (`drain_started`), so the run is complete when `finish()` returns.
- The daemon watches the process that started it (`--watch-pid`): when the script ends, however
  it ends (normal exit, exception, SIGTERM, SIGKILL), it drains and writes everything. On a
  normal exit (and an exception, and Ctrl-C) the starting process also asks it to drain at once
  (a drain request, as `telemetry drain` sends) and waits for it (up to WAIT_DRAIN_S), so the run
  is complete when the script returns, and prints where it is and what it holds.
- When no daemon can be started, one warning says the metrics are not kept.

$TELEMETRY_AUTOSTART=0 turns it off; =1 also starts one for a bare TelemetryClient (opt-in). A
bare client's then, and an integration's (HF, Lightning, Accelerate) unless =0, is its job's (shared/endpoints.job_runtime_dir: `<runtime dir>/job-<key>/`, key of
the job's first process, shared/job.py): two scripts of one user, each a job, each get a daemon and
a run of their own, as two W&B runs do, while a launch's ranks meet at one. Its sockets'
directory goes when it exits (--remove-runtime-dir).
"""
from __future__ import annotations

import atexit
import os
import re
import secrets
import string
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from telemetry.shared import endpoints
from telemetry.shared.ourpython import module_cmd

ENV_AUTOSTART = endpoints.ENV_AUTOSTART
ENV_DIR = "TELEMETRY_DIR"
# The W&B mode of the daemons started here when the script names none: `telemetry run` sets it to
# its own daemon's, for the runs a script makes beside the launcher's (k-fold's next fold).
ENV_WANDB_MODE = "TELEMETRY_WANDB_MODE"
# ... and their daemon config (`telemetry run --daemon-config`): every daemon of the launch reads
# the same one (a run's own daemon binds its endpoints by flag, whatever the file says).
ENV_DAEMON_CONFIG = "TELEMETRY_DAEMON_CONFIG"
# `telemetry run --as-wandb` puts this package first on the script's PYTHONPATH (its `import
# wandb` is telemetry's); a daemon started from the script must import the real W&B.
AS_WANDB_DIR = str(Path(__file__).resolve().parent.parent / "integrations" / "as_wandb")
# The daemon's ready line (telemetry.daemon.core.READY_LINE; the client imports nothing of the
# daemon's: tests/test_autostart.py checks the two are equal).
READY_LINE = "telemetry daemon ready"
START_LOCK_FILE = "autostart.lock"
# A daemon that is not ready in this long (imports on a loaded machine take seconds) is given up.
START_TIMEOUT_S = 60.0
# How long the starting process waits at exit for the drain (the daemon's own deadline is 12 s).
WAIT_DRAIN_S = 30.0
_ID_CHARS = string.ascii_lowercase + string.digits
_SAFE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass
class Started:
    """A daemon this process started."""

    proc: subprocess.Popen
    log_dir: Path
    run_id: str
    prog: str = "telemetry"
    runtime: Path | None = None       # its own runtime directory (a W&B run's); None: the default one
    # The process that started it, the one to drain it: a forked child inherits this record and
    # its exit hook, and must leave the parent's daemon alone.
    starter_pid: int = field(default_factory=os.getpid)


# By runtime directory: the daemons this process started (one per run), and the directories it
# could not start one for (said so once: no second try, no second warning).
_started: dict[str, Started] = {}
_failed: set[str] = set()
_num_started = 0
# A run directory name is the run id when the socket paths stay within the unix-socket limit
# (107 bytes, shared/endpoints.normalize) with the longest socket file name, else its hash.
_LONGEST_SOCKET = "control.sock"


def tried() -> bool:
    """Whether this process started a daemon or failed to (and said so)."""
    return _num_started > 0 or bool(_failed)


def run_runtime_dir(run_id: str) -> Path:
    """The runtime directory of the daemon of W&B run `run_id`: `run-<id>` in this user's
    private runtime directory (shared/endpoints.runtime_dir; made 0700 when missing). Ranks that
    share the id share it; distinct ids never do."""
    import hashlib

    base = endpoints.runtime_dir(create=True)
    name = f"run-{run_id}" if _SAFE_ID.fullmatch(run_id) else ""
    if not name or len(str(base / name / _LONGEST_SOCKET)) > 107:
        name = "run-" + hashlib.sha256(run_id.encode()).hexdigest()[:16]
    return endpoints.private_dirs(base / name)


def run_endpoint(runtime: Path, which: str) -> str:
    """The ipc endpoint ('ingest', 'pub', 'control') of the daemon serving `runtime`."""
    return f"ipc://{runtime}/{which}.sock"


def new_run_id() -> str:
    """Eight lowercase letters and digits, as W&B's run ids."""
    return "".join(secrets.choice(_ID_CHARS) for _ in range(8))


def wanted(default: bool) -> bool:
    """Whether to start a daemon: $TELEMETRY_AUTOSTART ("0" no, "1" yes), else `default`
    (yes for the integrations, no for a bare TelemetryClient); never with $TELEMETRY_ENDPOINT
    (someone runs their own daemon) or $TELEMETRY_DISABLED."""
    if os.environ.get(endpoints.ENV_INGEST) or endpoints.telemetry_disabled():
        return False
    setting = endpoints.autostart_setting()
    return default if setting is None else setting


def ensure_daemon(prog: str, *, default: bool = True, run_id: str | None = None, run_name: str | None = None,
                  wandb_mode: str | None = None, root: str | os.PathLike | None = None,
                  runtime: Path | None = None, copy: int = 1) -> Started | None:
    """A daemon serving `runtime` (default: the directory this process's clients send to by
    default: its job's with $TELEMETRY_AUTOSTART=1, endpoints.job_runtime_dir, else the node's
    default endpoints' directory): the one running, or one started now.

    `copy` > 1: a run of `run_id` kept apart from another of that id (telemetry.wandb's
    _rank_of_its_own): its run directory is `<run-id>.<copy>`.

    Returns what this process started (None when one was running already, or none is wanted, or
    none could be started: then one warning, on stderr, says the metrics are not kept).
    """
    if not wanted(default):
        return None
    try:
        job_dir = endpoints.job_runtime_dir(create=True, default_on=default) if runtime is None else None
        rdir = runtime if runtime is not None else job_dir or endpoints.runtime_dir(create=True)
    except (endpoints.EndpointError, OSError) as exc:
        if "" not in _failed:
            _warn(prog, f"no daemon could be started (runtime directory: {exc})", "")
        return None
    key = str(rdir)
    started = _started.get(key)
    if key in _failed or (started is not None and started.proc.poll() is None):
        return started
    if endpoints.daemon_serves(rdir):
        return None
    lock = _take_start_lock(rdir / START_LOCK_FILE)
    if lock is None:
        _warn(prog, f"no daemon could be started (cannot lock {rdir / START_LOCK_FILE})", key)
        return None
    try:
        if endpoints.daemon_serves(rdir):         # another rank started it while we waited
            return None
        if not (run_id and _SAFE_ID.fullmatch(run_id)):      # a directory name: no "/", "..", spaces
            run_id, copy = new_run_id(), 1
        started = _start(prog, run_id, run_name, wandb_mode, root, runtime or job_dir, key, job=job_dir is not None,
                         dir_name=run_id if copy == 1 else f"{run_id}.{copy}")
        if started is not None:
            global _num_started
            _started[key] = started
            _num_started += 1
        return started
    finally:
        os.close(lock)


def drain_started(runtime: Path, exit_code: int | None = None) -> None:
    """The run of the daemon this process started on `runtime` is over: drain it now (nothing
    when this process started none there, or it was drained already)."""
    started = _started.pop(str(runtime), None)
    if started is not None and started.starter_pid == os.getpid():
        _drain(started.prog, started, exit_code)
        if started.proc.poll() is not None:      # its sockets' directory: nothing serves it now
            import shutil

            shutil.rmtree(runtime, ignore_errors=True)


def _take_start_lock(path: Path) -> int | None:
    import fcntl

    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    deadline = time.monotonic() + START_TIMEOUT_S + 5
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                return None
            time.sleep(0.02)


def _start(prog: str, run_id: str, run_name: str | None, wandb_mode: str | None,
           root: str | os.PathLike | None, runtime: Path | None, key: str, job: bool = False,
           dir_name: str = "") -> Started | None:
    from telemetry.shared import files

    base = Path(os.environ.get(ENV_DIR) or (Path(root) / "telemetry" if root else Path("telemetry")))
    log_dir = (base / (dir_name or run_id)).absolute()
    try:
        files.make_dir(log_dir, own=True)
        out = files.open_append(log_dir / "daemon.out")
        out_start = out.seek(0, os.SEEK_END)     # an earlier run's lines (a reused run id) come before
    except OSError as exc:
        _warn(prog, f"no daemon could be started (cannot make {log_dir}: {exc.strerror or exc})", key)
        return None
    cmd = [*module_cmd("telemetry"), "daemon", "--log-dir", str(log_dir),
           "--run-name", run_name or run_id, "--watch-pid", str(os.getpid())]
    if runtime is not None:
        cmd += [arg for which in ("ingest", "pub", "control") for arg in (f"--{which}", run_endpoint(runtime, which))]
        if os.environ.get(ENV_DAEMON_CONFIG):
            cmd += ["--config", os.environ[ENV_DAEMON_CONFIG]]
    wandb_mode = wandb_mode or os.environ.get(ENV_WANDB_MODE)
    if wandb_mode in ("online", "offline", "disabled"):
        cmd += ["--wandb", wandb_mode]
    env = dict(os.environ)
    if job:
        # A job's directory, made for this daemon alone: it removes it when it exits, however the
        # job ends (the daemon is the one sure to outlive it).
        cmd.append("--remove-runtime-dir")
        env[endpoints.ENV_RUNTIME_DIR] = str(runtime)
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != AS_WANDB_DIR]
    env["PYTHONPATH"] = os.pathsep.join(path)
    # No --world-size: the ranks' hellos say whom to wait for (a W&B script often logs on rank 0
    # alone, and its hello promises only itself; every rank of a bare client says the world).
    try:
        # Its own session: a Ctrl-C meant for the script does not stop it before it has drained.
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True, env=env)
    except OSError as exc:
        out.close()
        _warn(prog, f"no daemon could be started ({exc})", key)
        return None
    out.close()
    why = _wait_ready(proc, log_dir / "daemon.out", start=out_start)
    if why:
        if proc.poll() is None:
            proc.kill()
        _warn(prog, f"no daemon could be started: {why}", key)
        return None
    started = Started(proc, log_dir, run_id, prog, runtime)
    # What the drain at exit uses, imported now: a module first imported during an exit after
    # Ctrl-C that runs exec() on a string (a dataclass, a namedtuple) makes CPython forget the
    # KeyboardInterrupt, and the script exits 1 instead of dying by SIGINT as it would alone.
    from telemetry.shared import control  # noqa: F401
    from telemetry.shared.security import curve  # noqa: F401
    atexit.register(_drain_at_exit, key)
    print(f"{prog}: run {run_id}: telemetry daemon started (pid {proc.pid}), writing to {log_dir}; "
          f"it drains when this script ends (`telemetry tail --run-dir {log_dir}` to watch)", file=sys.stderr,
          flush=True)
    return started


def _wait_ready(proc: subprocess.Popen, out_path: Path, start: int = 0) -> str:
    """'' once the daemon printed its ready line; else why not. Its own line, with its pid: the
    file may hold another daemon's (one that served the directory before, or serves it now and
    so made this one refuse it). `start`: the file's size before this daemon began; its lines
    come after it, so a failure said is this daemon's, not an earlier run's in the directory."""
    deadline = time.monotonic() + START_TIMEOUT_S
    ready = f"{READY_LINE} pid={proc.pid} "
    while time.monotonic() < deadline:
        text = _tail(out_path, start=start)
        if ready in text:
            return ""
        if proc.poll() is not None:
            last = " | ".join(ln for ln in text.strip().splitlines()[-3:])
            return f"it exited with code {proc.returncode}: {last or 'no output'} ({out_path})"
        time.sleep(0.02)
    return f"not ready within {START_TIMEOUT_S:.0f} s ({out_path})"


def _tail(path: Path, max_bytes: int = 1 << 16, start: int = 0) -> str:
    """The last `max_bytes` of the file past offset `start`."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(start, f.tell() - max_bytes))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _drain_at_exit(key: str) -> None:
    """The script is ending: the daemon started on runtime directory `key`, not drained yet,
    drains now (a drain request, as `telemetry drain` sends: the clients' byes are in) and the run
    is complete before the script returns. Runs after the clients' own exit hooks (they were
    registered later), so this process's bye was sent."""
    started = _started.pop(key, None)
    if started is not None and started.starter_pid == os.getpid():
        _drain(started.prog, started, None)


def _drain(prog: str, started: Started, exit_code: int | None) -> None:
    """Ask `started` to drain (carrying the script's `exit_code` when known), wait for it, and say
    where the run is and what it holds."""
    from telemetry.shared import control

    proc = started.proc
    final: dict = {}
    if proc.poll() is None:
        ep = run_endpoint(started.runtime, "control") if started.runtime is not None else endpoints.resolve("control")
        try:
            final = control.request(ep, "drain", timeout_s=WAIT_DRAIN_S, exit_code=exit_code)
        except Exception:          # no answer: it drains on its own once this process is gone
            final = {}
        try:
            proc.wait(5 if final else WAIT_DRAIN_S)
        except subprocess.TimeoutExpired:
            print(f"{prog}: run {started.run_id}: the daemon is still draining (pid {proc.pid}); "
                  f"{started.log_dir} fills as it finishes", file=sys.stderr, flush=True)
            return
    ok = proc.returncode == 0
    counts = (f"{final.get('records_in', 0):,} records in, {final.get('records_lost', 0):,} lost, "
              f"{final.get('steps_out', 0):,} steps; " if final.get("ok") else "")
    print(f"{prog}: run {started.run_id}: {counts}"
          f"{'written to' if ok else 'the daemon exited with code ' + str(proc.returncode) + ';'} "
          f"{started.log_dir / 'metrics.jsonl'} (counters: {started.log_dir / 'drain.json'})",
          file=sys.stderr, flush=True)


def _warn(prog: str, why: str, key: str) -> None:
    _failed.add(key)
    print(f"{prog}: {why}: the metrics of this process are not kept. Start one by hand "
          f"(`telemetry daemon`) or set $TELEMETRY_ENDPOINT to one.", file=sys.stderr, flush=True)
