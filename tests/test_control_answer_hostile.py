"""`telemetry status` and `drain` read whatever answers on their control endpoint: on a TCP
port, another local user's server (a port taken while no daemon holds it). An answer nested past
json's recursion limit, or one shaped unlike the daemon's, is one line and a nonzero exit, never
a traceback. The server is run by the other unix user (uid 65534) where the tests can act as it."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import zmq

from other_user import OTHER_UID, SYSTEM_PYTHON, can_act_as_other_user

ROOT = Path(__file__).resolve().parent.parent

SERVER = """
import sys, zmq
port, answer = int(sys.argv[1]), sys.stdin.buffer.read()
s = zmq.Context().socket(zmq.REP)
s.bind(f"tcp://127.0.0.1:{port}")
print("bound", flush=True)
while True:
    s.recv()
    s.send(answer)
"""

ANSWERS = {
    "deep": b"[" * 100_000,
    "misshapen": b'{"ok": true, "drained": true, "sinks": 5, "unfinished_sinks": 3, "records_unread_at_drain": "x",'
                 b' "records_shed_at_intake": "y", "per_rank": [], "security": 1}',
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(port: int, answer: bytes) -> subprocess.Popen:
    zmq_dir = str(Path(zmq.__file__).resolve().parent.parent)
    if can_act_as_other_user() and os.access(zmq_dir, os.R_OK):
        cmd, kw = [SYSTEM_PYTHON, "-c", SERVER], {"user": OTHER_UID, "group": OTHER_UID, "cwd": "/"}
        env = {"PYTHONPATH": zmq_dir, "PATH": "/usr/bin:/bin"}
    else:
        cmd, kw, env = [sys.executable, "-c", SERVER], {}, dict(os.environ)
    proc = subprocess.Popen([*cmd, str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, **kw)
    proc.stdin.write(answer)
    proc.stdin.close()
    line = proc.stdout.readline().decode()
    if "bound" not in line:
        proc.kill()
        pytest.skip(f"the other user's server did not start: {proc.stderr.read()[-500:]!r}")
    return proc


@pytest.mark.parametrize("answer", sorted(ANSWERS))
@pytest.mark.parametrize("cmd", ["status", "drain"])
def test_a_hostile_answer_is_one_line_not_a_traceback(tmp_path, cmd, answer):
    port = _free_port()
    server = _serve(port, ANSWERS[answer])
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TELEMETRY_")}
        env.update(TELEMETRY_CONTROL=f"tcp://127.0.0.1:{port}", TELEMETRY_RUNTIME_DIR=str(tmp_path / "rt"))
        p = subprocess.run([sys.executable, "-m", "telemetry", cmd, "--timeout", "20"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    finally:
        server.kill()
        server.wait()
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    if answer == "deep":
        assert p.returncode == 1 and "not JSON" in p.stderr, (p.returncode, p.stderr[-2000:])
    else:
        assert p.returncode in (0, 1) and p.stdout.strip(), (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
