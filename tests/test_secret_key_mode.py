"""The daemon's CURVE secret key (security.server_secret_key) is refused, as ssh refuses a
private key, when others can read it: whoever can read it can pose as the head to its nodes and
consumers. One line naming the file and the fix, exit 2. And no key file is read from a FIFO."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from daemon_util import ROOT
from telemetry.tools.keygen import make_pair


def _command(tmp_path, keys) -> list[str]:
    """A head daemon with CURVE on its remote ingest (loopback TCP, port chosen by the kernel)."""
    cfg = tmp_path / "daemon.yaml"
    cfg.write_text(yaml.safe_dump({"security": {"server_secret_key": str(keys / "head.key_secret"),
                                                "allowed_clients_dir": str(keys / "allowed")}}))
    rt = tmp_path / "rt"
    rt.mkdir(mode=0o700)
    cmd = [sys.executable, "-m", "telemetry", "daemon", "--log-dir", str(tmp_path / "tm"), "--wandb", "disabled",
           "--ingest", f"ipc://{rt}/i", "--pub", f"ipc://{rt}/p", "--control", f"ipc://{rt}/c",
           "--remote-ingest", "tcp://127.0.0.1:0", "--config", str(cfg)]
    return cmd


def _daemon(tmp_path, keys) -> subprocess.CompletedProcess:
    return subprocess.run(_command(tmp_path, keys), cwd=ROOT, capture_output=True, text=True,
                          timeout=120)     # a hang detector


@pytest.fixture
def keys(tmp_path):
    d = tmp_path / "keys"
    make_pair(d, "head")
    (d / "allowed").mkdir(mode=0o700)
    return d


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660], ids=lambda m: f"{m:o}")
def test_a_secret_key_others_can_read_is_refused(tmp_path, keys, mode):
    secret = keys / "head.key_secret"
    os.chmod(secret, mode)
    out = _daemon(tmp_path, keys)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert "telemetry daemon ready" not in out.stdout
    line, = out.stderr.splitlines()
    assert str(secret) in line and f"chmod 600 {secret}" in line and f"mode {mode:o}" in line, line
    assert os.stat(secret).st_mode & 0o777 == mode        # said, not changed behind the user's back


def test_a_secret_key_only_its_owner_reads_is_used(tmp_path, keys):
    """The refusal above is not every key's: the same daemon with the key 0600 gets past it (to
    a bind it then closes: SIGTERM once it is ready)."""
    p = subprocess.Popen(_command(tmp_path, keys), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = p.stdout.readline()
    finally:
        p.terminate()
        _, err = p.communicate(timeout=120)
    assert "telemetry daemon ready" in ready, err[-3000:]


def test_a_client_key_at_a_fifo_is_refused_not_waited_on(tmp_path, keys):
    fifo = tmp_path / "node.key_secret"
    os.mkfifo(fifo)
    code = ("import zmq\n"
            "from telemetry.shared.security.curve import SecurityError, apply_client_curve\n"
            "s = zmq.Context().socket(zmq.PUSH)\n"
            f"try: apply_client_curve(s, {str(keys / 'head.key')!r}, {str(fifo)!r})\n"
            "except SecurityError as e: print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)     # old: open() waited for a writer
    assert out.stdout.startswith("refused:") and "not a regular file" in out.stdout, (out.stdout, out.stderr)


@pytest.mark.parametrize("name", ["x\ny", "a b", "tab\there", "bell\x07", "", "a/b", ".hidden"])
def test_a_key_name_that_is_no_plain_file_name_is_refused_with_exit_2(tmp_path, name):
    """`keygen --name $'x\\ny'` and `--name 'a b'` made files such as `keys/x\\ny.key` (an outside
    tester's find): a name is refused, one line, exit 2, nothing made."""
    out = subprocess.run([sys.executable, "-m", "telemetry", "keygen", "--dir", str(tmp_path / "k"), "--name", name],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not list((tmp_path / "k").glob("*.key")) if (tmp_path / "k").exists() else True
