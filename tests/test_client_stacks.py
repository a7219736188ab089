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
    print(os.path.getsize(path) == size_closed, flush=True)

atexit.register(at_exit)
import telemetry
tm = telemetry.TelemetryClient(sys.argv[1], rank=0)
hello = tm._stacks_hello
sig, path = hello["stacks_signal"], hello["stacks_file"]
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
    # at exit: ignored (no dump, no death)
    assert p.stdout.split() == ["True", "True", "True", "True"], p.stdout
