"""The stacks signal (telemetry/client/stacks.py) asks a live rank for its Python stacks; once the
client is closed it must do nothing at all: the interpreter's finalization unregisters
faulthandler's handler, and a signal arriving then would end a rank that was exiting cleanly."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import os, signal, sys, time
import telemetry
tm = telemetry.TelemetryClient(sys.argv[1], rank=0)
hello = tm._stacks_hello
sig, path = hello["stacks_signal"], hello["stacks_file"]
os.kill(os.getpid(), sig)                    # registered: a dump, and the process goes on
time.sleep(0.3)
size_open = os.path.getsize(path)
tm.close(timeout_s=0.5)
os.kill(os.getpid(), sig)                    # closed: ignored
time.sleep(0.3)
print(size_open > 0, os.path.getsize(path) == size_open)
"""


def test_the_stacks_signal_dumps_while_open_and_is_ignored_after_close(tmp_path):
    ep = f"ipc://{tmp_path}/ingest.sock"       # no daemon needed: nothing waits for one
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TELEMETRY_STACKS_DIR": str(tmp_path)}
    env.pop("TELEMETRY_STACKS_SIGNAL", None)
    p = subprocess.run([sys.executable, "-c", SCRIPT, ep], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    assert p.stdout.split() == ["True", "True"], p.stdout
