"""The stacks signal (telemetry/client/stacks.py) asks a live rank for its Python stacks. When the
interpreter exits it must do nothing at all: finalization unregisters faulthandler's handler,
and a signal arriving then would end a rank that was exiting cleanly (seen: -37, SIGRTMIN+3,
on a rank that exited as another one did). And it must not be ignored before that: an ignored
signal is inherited by the processes this one starts, which could then register nothing."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import atexit, os, signal, subprocess, sys, time

def at_exit():                      # registered first, so it runs after telemetry's own hooks
    os.kill(os.getpid(), sig)       # during the exit: ignored
    time.sleep(0.3)
    print(os.fstat(fd).st_size == size_closed, not os.path.exists(path), flush=True)

atexit.register(at_exit)
import telemetry
tm = telemetry.TelemetryClient(sys.argv[1], rank=0)
hello = tm._stacks_hello
sig, path = hello["stacks_signal"], hello["stacks_file"]
fd = os.open(path, os.O_RDONLY)     # the file as it is after its name is gone
os.kill(os.getpid(), sig)           # open: a dump, and the process goes on
time.sleep(0.3)
size_open = os.path.getsize(path)
tm.close(timeout_s=0.5)
os.kill(os.getpid(), sig)           # closed, still running: still a dump
time.sleep(0.3)
size_closed = os.path.getsize(path)
child = subprocess.run([sys.executable, "-c", f"import signal; print(signal.getsignal({sig}) == signal.SIG_DFL)"],
                       capture_output=True, text=True)
print(size_open > 0, size_closed > size_open, child.stdout.strip(), flush=True)
"""


def test_the_stacks_signal_dumps_while_running_and_is_ignored_at_exit(tmp_path):
    ep = f"ipc://{tmp_path}/ingest.sock"       # no daemon needed: nothing waits for one
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TELEMETRY_STACKS_DIR": str(tmp_path)}
    env.pop("TELEMETRY_STACKS_SIGNAL", None)
    p = subprocess.run([sys.executable, "-c", SCRIPT, ep], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    # open: dumps; closed: dumps; a child started after close: default action (can register);
    # at exit: ignored (no dump, no death), and the file removed
    assert p.stdout.split() == ["True"] * 5, p.stdout
    assert not list(tmp_path.glob("stacks-rank*")), list(tmp_path.iterdir())


FORKED = r"""
import os, sys
import telemetry
tm = telemetry.TelemetryClient(sys.argv[1], rank=0)
path = tm._stacks_hello["stacks_file"]
pid = os.fork()
if pid == 0:
    sys.exit(0)                     # a child that ends normally runs its parent's atexit hooks
os.waitpid(pid, 0)
print(os.path.exists(path), flush=True)
"""


def test_the_stacks_file_is_removed_at_exit_by_its_own_process_only(tmp_path):
    """One file per process that ever logged was left behind (a TCP client's `stacks/` directory
    is the user's, never cleaned by a run); a forked child that exits must not take its parent's."""
    ep = f"ipc://{tmp_path}/ingest.sock"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TELEMETRY_STACKS_DIR": str(tmp_path)}
    env.pop("TELEMETRY_STACKS_SIGNAL", None)
    p = subprocess.run([sys.executable, "-c", FORKED, ep], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    assert p.stdout.split() == ["True"], p.stdout          # the child's exit left the parent's file
    assert not list(tmp_path.glob("stacks-rank*")), list(tmp_path.iterdir())   # the parent's exit took it
    # Stacks off: the file is still made (the daemon recognises the rank by it), and still removed.
    env["TELEMETRY_STACKS_SIGNAL"] = "off"
    p = subprocess.run([sys.executable, "-c", "import sys, telemetry; telemetry.TelemetryClient(sys.argv[1], rank=3)", ep],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert not list(tmp_path.glob("stacks-rank*")), list(tmp_path.iterdir())
