"""`telemetry run` at a terminal: Ctrl-C reaches the script once, as it would without us.

The terminal sends SIGINT to its whole foreground process group, the launcher and the script
alike; a launcher that passed it on as well interrupted the script a second time, inside its exit
hooks (a second traceback, and the W&B run's exit code 130 where W&B records 255)."""
from __future__ import annotations

import hashlib
import os
import pty
import select
import signal
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import time
import wandb
run = wandb.init(project="ctrl-c")
run.log({"x": 1.0})
try:
    print("script is logging", flush=True)
    time.sleep(600)
finally:                       # a script's own clean-up on Ctrl-C (a last checkpoint, say)
    time.sleep(1.0)
    print("clean-up done", flush=True)
"""


def _read_until(fd: int, needle: bytes, timeout_s: float) -> bytes:
    out, deadline = b"", time.monotonic() + timeout_s
    while needle not in out and time.monotonic() < deadline:
        if select.select([fd], [], [], 0.5)[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:           # the terminal's other end closed: the process is gone
                break
            if not chunk:
                break
            out += chunk
    return out


def test_ctrl_c_at_the_terminal_reaches_the_script_once(tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent(SCRIPT))
    runtime = Path("/tmp") / f"tmtty-{hashlib.sha1(str(tmp_path).encode()).hexdigest()[:12]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRY_", "WANDB_"))}
    env.update(WANDB_MODE="offline", WANDB_DIR=str(tmp_path), WANDB_SILENT="true", PYTHONPATH=str(ROOT),
               PYTHONUNBUFFERED="1", TELEMETRY_RUNTIME_DIR=str(runtime))
    pid, fd = pty.fork()        # the child leads a session whose controlling terminal is this pty
    if pid == 0:
        os.chdir(tmp_path)
        # SIGINT as a shell gives it (a test worker's ignored or blocked one would be inherited).
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        os.execve(sys.executable, [sys.executable, "-m", "telemetry", "run", "--as-wandb", "--", "train.py"], env)
    try:
        out = _read_until(fd, b"script is logging", 180)
        assert b"script is logging" in out, out.decode(errors="replace")[-3000:]
        os.write(fd, b"\x03")                     # Ctrl-C: the terminal signals its foreground group
        out += _read_until(fd, b"\x00never", 180)
        _, status = os.waitpid(pid, 0)
    finally:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
        os.close(fd)
    text = out.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 130, text[-3000:]      # the shell's code for SIGINT
    assert "clean-up done" in text, text[-3000:]                      # not interrupted a second time
    assert text.count("KeyboardInterrupt") == 1, text[-3000:]
    sys.path.insert(0, str(ROOT / "tests"))
    from wandb_offline import read_records, wait_finished

    (path,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    exits = [r.exit.exit_code for r in read_records(wait_finished(path)) if r.WhichOneof("record_type") == "exit"]
    assert exits == [255], (exits, text[-3000:])                      # W&B's code for a KeyboardInterrupt
