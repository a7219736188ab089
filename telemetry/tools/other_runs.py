"""The script's other runs under `telemetry run`: a W&B run it makes with another id (a fold's
second run, a sweep's trials, a forked child's run) has a daemon of its own, started by the
script's process that made it (client/autostart.py) on `<runtime>/run-<id>/`, beside the
launch's sockets. That process drains it at `finish` or at its exit. When the script ended
without its exit hooks (os._exit, SIGTERM, SIGKILL) the daemon drains by itself once that
process is gone (--watch-pid), after `telemetry run` would have returned: a CI step or a
container ending then lost the run. `wait` waits for them, bounded and said, and names the
ones it does not wait for."""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from telemetry.shared import endpoints

# How often a daemon's lock is looked at, and how often the wait says whom it still waits for.
POLL_S = 0.2
PROGRESS_S = 10.0
# How long a daemon has to answer `status` (who it is); a draining one may not: named by its directory.
STATUS_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class OtherRun:
    runtime: Path                  # its socket directory, served while its daemon lives (daemon.lock)
    name: str                      # the run's name, else its directory's
    log_dir: str | None            # where its daemon writes the run
    pid: int | None                # its daemon's
    starter: int | None            # the process it drains after (its --watch-pid), while that runs

    def where(self) -> str:
        pid = f"daemon pid {self.pid}" if self.pid else "its daemon"
        return f"run {self.name} ({pid}, {self.log_dir or self.runtime})"


def serving(runtime: Path) -> list[OtherRun]:
    """The runs in `runtime` whose daemon is still up."""
    from telemetry.shared import control

    try:
        dirs = sorted(d for d in runtime.iterdir() if d.name.startswith("run-") and not d.is_symlink() and d.is_dir())
    except OSError:
        return []
    runs = []
    for d in dirs:
        if not endpoints.daemon_serves(d):
            continue
        try:
            st = control.request(f"ipc://{d}/control.sock", "status", timeout_s=STATUS_TIMEOUT_S)
        except Exception:
            st = {}
        pid = st.get("pid") if type(st.get("pid")) is int else None
        log_dir = st.get("log_dir") if isinstance(st.get("log_dir"), str) else None
        name = st.get("run_name") if isinstance(st.get("run_name"), str) else d.name[len("run-"):]
        runs.append(OtherRun(d, name, log_dir, pid, _running_starter(pid)))
    return runs


def _running_starter(pid: int | None) -> int | None:
    """The process daemon `pid` drains after (--watch-pid), when it still runs (not a zombie)."""
    if pid is None:
        return None
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        starter = int(args[args.index(b"--watch-pid") + 1])
        state = Path(f"/proc/{starter}/stat").read_bytes().rsplit(b")", 1)[-1].split()[0]
    except (OSError, ValueError, IndexError):
        return None
    return None if state in (b"Z", b"X") else starter


def wait(runtime: Path, timeout_s: float, say: Callable[[str], None]) -> None:
    """Wait up to `timeout_s` for the other runs' daemons in `runtime` to end (each drains by
    itself, its process gone), saying whom it waits for, each run as it is done and whom it
    stopped waiting for. A daemon whose process still runs (a process the script left behind)
    drains when that process ends: named, not waited for. A run done has its directory removed."""
    runs = serving(runtime)
    for r in runs:
        if r.starter is not None:
            say(f"telemetry run: not waiting for {r.where()}: it drains when its process (pid {r.starter}), "
                f"still running, ends")
    pending = [r for r in runs if r.starter is None]
    if not pending:
        return
    say(f"telemetry run: waiting up to {timeout_s:.0f} s for the script's other "
        f"{'run' if len(pending) == 1 else 'runs'} to drain: {'; '.join(r.where() for r in pending)}")
    start = time.monotonic()
    next_say = start + PROGRESS_S
    while pending:
        for r in list(pending):
            if endpoints.daemon_serves(r.runtime):
                continue
            pending.remove(r)
            final = Path(r.log_dir) / "drain.json" if r.log_dir else None
            said = f"drained: {final}" if final is not None and final.is_file() else "its daemon ended without a drain.json"
            say(f"telemetry run: run {r.name} {said}")
            shutil.rmtree(r.runtime, ignore_errors=True)
        now = time.monotonic()
        if pending and now - start >= timeout_s:
            for r in pending:
                say(f"telemetry run: not waiting any longer for {r.where()}: it finishes by itself"
                    + (f"; its final counters go to {Path(r.log_dir) / 'drain.json'}" if r.log_dir else ""))
            return
        if pending and now >= next_say:
            next_say = now + PROGRESS_S
            say(f"telemetry run: still waiting ({now - start:.0f} s) for {', '.join('run ' + r.name for r in pending)}")
        if pending:
            time.sleep(POLL_S)

