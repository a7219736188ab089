"""No other local user gets in: the directories on the sockets' path, the control socket's own
credential, a second daemon on the same sockets, secrets in the hello, and bad endpoints.

Real daemon processes and real sockets. "Another user" is uid 65534 (nobody): the tests chown
directories to it, which needs root (as in CI); they skip otherwise.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import msgpack
import pytest
import zmq

from daemon_util import ROOT, daemon_command, start_daemon
from telemetry.client import TelemetryClient

from other_user import OTHER_UID
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def _short_dir() -> Path:
    # ipc paths must stay under 107 bytes: pytest's tmp_path can be longer.
    return Path(tempfile.mkdtemp(prefix="tls-", dir="/tmp"))


def _run_daemon(args: list[str], env: dict | None = None, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "telemetry", "daemon", "--wandb", "disabled", *args],
                          cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout_s)


def _refused(out: subprocess.CompletedProcess, *words: str) -> None:
    text = out.stdout + out.stderr
    assert out.returncode == 2, text
    assert "Traceback" not in text, text
    assert "telemetry daemon ready" not in text, text
    for w in words:
        assert w in text, text


# -- the directories on the path -----------------------------------------------------------------
@needs_root
def test_daemon_refuses_a_runtime_dir_under_a_parent_another_user_owns(tmp_path):
    parent = _short_dir()
    os.chown(parent, OTHER_UID, OTHER_UID)
    out = _run_daemon(["--log-dir", str(tmp_path / "t")], env={"TELEMETRY_RUNTIME_DIR": str(parent / "run")})
    _refused(out, str(parent), "another user")
    assert not (parent / "run").exists()


def test_daemon_refuses_a_runtime_dir_under_a_parent_others_can_write(tmp_path):
    parent = _short_dir()
    parent.chmod(0o777)          # not sticky: anyone may rename our directory away
    out = _run_daemon(["--log-dir", str(tmp_path / "t")], env={"TELEMETRY_RUNTIME_DIR": str(parent / "run")})
    _refused(out, "writable by other users")


def test_daemon_never_follows_a_symlink_in_place_of_its_runtime_dir(tmp_path):
    base = _short_dir()
    target = base / "target"
    target.mkdir(mode=0o755)
    target.chmod(0o755)
    (base / "run").symlink_to(target)
    out = _run_daemon(["--log-dir", str(tmp_path / "t")], env={"TELEMETRY_RUNTIME_DIR": str(base / "run")})
    _refused(out, "symlink")
    assert stat.S_IMODE(target.stat().st_mode) == 0o755      # the link's target was not chmod-ed
    assert not list(target.iterdir())


@needs_root
def test_client_does_not_send_to_a_socket_planted_in_another_users_directory():
    planted = _short_dir()
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    pull.setsockopt(zmq.RCVTIMEO, 1500)
    pull.bind(f"ipc://{planted}/ingest.sock")            # the other user's listener
    os.chown(planted / "ingest.sock", OTHER_UID, OTHER_UID)
    os.chown(planted, OTHER_UID, OTHER_UID)
    old = os.environ.get("TELEMETRY_RUNTIME_DIR")
    os.environ["TELEMETRY_RUNTIME_DIR"] = str(planted)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tm = TelemetryClient(rank=0)
        assert any("not connecting" in str(w.message) for w in caught)
        tm.hello({"config": {"lr": 1e-3}})
        for step in range(5):
            tm.log(step, {"train/loss": 1.0})            # never raises: training goes on
        stats = tm.stats()
        tm.close()
        assert stats["sent"] == 0 and stats["dropped"] >= 5
        with pytest.raises(zmq.Again):
            pull.recv()                                  # nothing reached the planted socket
    finally:
        if old is None:
            os.environ.pop("TELEMETRY_RUNTIME_DIR", None)
        else:
            os.environ["TELEMETRY_RUNTIME_DIR"] = old
        pull.close()
        ctx.term()


# -- secrets never leave the rank ------------------------------------------------------------------
def test_hello_and_event_secrets_are_redacted_before_they_are_sent():
    d = _short_dir()
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    pull.setsockopt(zmq.RCVTIMEO, 5000)
    ep = f"ipc://{d}/ingest.sock"
    pull.bind(ep)
    secret = "wandb-key-0123456789abcdef"
    try:
        tm = TelemetryClient(ep, rank=0)
        tm.hello({"config": {"wandb": {"api_key": secret}, "hub_token": "hf_" + "x" * 20, "lr": 1e-3}})
        tm.event("uploaded", {"password": "hunter2-hunter2", "path": "/ckpt"})
        tm.close()
        frames = []
        while True:
            try:
                frames.append(pull.recv())
            except zmq.Again:
                break
            if len(frames) >= 4:   # hello, the caller's hello, event, bye (in any order)
                break
    finally:
        pull.close()
        ctx.term()
    wire = b"".join(frames)
    assert secret.encode() not in wire and b"hf_xxxx" not in wire and b"hunter2" not in wire
    assert b"<redacted>" in wire and b"/ckpt" in wire


# -- the control socket's own credential -------------------------------------------------------------
def test_control_needs_the_token_and_the_token_file_is_private(tmp_path):
    d = start_daemon(tmp_path, transport="tcp")
    try:
        from telemetry.shared.control import token_path

        path = token_path(d.control)
        st = path.stat()
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()
        ctx = zmq.Context.instance()
        for body in ({"cmd": "drain"}, {"cmd": "status"}, {"cmd": "drain", "token": "0" * 32}):
            req = ctx.socket(zmq.REQ)
            req.setsockopt(zmq.LINGER, 0)
            req.setsockopt(zmq.RCVTIMEO, 5000)
            req.connect(d.control)
            req.send(json.dumps(body).encode())
            reply = json.loads(req.recv())
            req.close()
            assert reply["ok"] is False and "not authorised" in reply["error"], reply
        time.sleep(0.2)
        assert d.proc.poll() is None                     # the drain without the token did nothing
        assert d.status()["ok"] is True                  # the owner's request reads the token
        st = subprocess.run([sys.executable, "-m", "telemetry", "status", "--control", d.control, "--json"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert st.returncode == 0 and "records_in" in json.loads(st.stdout), st.stderr
        d.drain()
        assert not path.exists()                         # removed at exit
    finally:
        d.cleanup()


def test_the_control_token_goes_only_to_the_listener_it_is_for(tmp_path):
    """An outside attack: the TCP token file is found by port alone, so `telemetry status
    --control tcp://127.0.0.2:P` (another local user listening on another loopback address at
    the daemon's port) sent that user the daemon's token, and took its made-up reply. Now the
    token goes only to the address the daemon is bound to (or a loopback name for it)."""
    d = start_daemon(tmp_path, transport="tcp")
    try:
        from telemetry.shared.control import read_token

        port = int(d.control.rsplit(":", 1)[1])
        token = read_token(d.control)
        assert len(token) == 32 and read_token(f"tcp://localhost:{port}") == token
        ctx = zmq.Context.instance()
        impostor = ctx.socket(zmq.REP)
        impostor.setsockopt(zmq.LINGER, 0)
        impostor.bind(f"tcp://127.0.0.2:{port}")
        got = []

        def answer() -> None:
            if impostor.poll(30_000):
                got.append(json.loads(impostor.recv()))
                impostor.send(b'{"ok": true}')

        t = threading.Thread(target=answer, daemon=True)
        t.start()
        st = subprocess.run([sys.executable, "-m", "telemetry", "status", "--control", f"tcp://127.0.0.2:{port}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
        t.join(40)
        impostor.close()
        assert got and token not in json.dumps(got[0]), got          # asked, without the token
        assert read_token(f"tcp://127.0.0.2:{port}") == "" and read_token(f"tcp://192.0.2.1:{port}") == ""
        import socket

        name = socket.gethostname()         # this host's name: the token iff it names the bound address
        resolves = "127.0.0.1" in {info[4][0] for info in socket.getaddrinfo(name, None)}
        assert (read_token(f"tcp://{name}:{port}") == token) == resolves, (name, resolves)
        assert d.status()["ok"] is True                              # the daemon's own still work
    finally:
        d.cleanup()


# -- one daemon per set of sockets ---------------------------------------------------------------------
def test_a_second_daemon_on_the_same_sockets_refuses_and_the_first_keeps_serving(tmp_path):
    first = start_daemon(tmp_path / "a")
    try:
        cmd = daemon_command(tmp_path / "b", first.ingest, first.pub, first.control)
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
        _refused(out, "another telemetry daemon", f"pid {first.proc.pid}")
        tm = TelemetryClient(first.ingest, rank=0)
        tm.log(1, {"train/loss": 2.0})
        tm.close()
        first.wait_for(lambda recs: any(r.get("step") == 1 for r in recs), kind="metrics")
        assert first.status()["records_in"] >= 2
    finally:
        first.cleanup()


# -- bad endpoints and directories: a clear error, exit code 2 ----------------------------------------
@pytest.mark.parametrize("args, words", [
    (["--ingest", "ipc://@telemetry-abstract"], ["abstract"]),
    (["--ingest", "tcp://127.0.0.1:99999"], ["0 to 65535"]),
    (["--ingest", "99999"], ["0 to 65535"]),
])
def test_bad_endpoints_are_refused(tmp_path, args, words):
    rt = _short_dir()
    out = _run_daemon(["--log-dir", str(tmp_path / "t"), *args], env={"TELEMETRY_RUNTIME_DIR": str(rt / "r")})
    _refused(out, *words)


def test_two_sockets_on_one_ipc_path_are_refused(tmp_path):
    rt = _short_dir()
    ep = f"ipc://{rt}/same.sock"
    out = _run_daemon(["--log-dir", str(tmp_path / "t"), "--ingest", ep, "--pub", ep,
                       "--control", f"ipc://{rt}/c.sock"])
    _refused(out, "two sockets")


def test_an_ipc_socket_in_a_directory_others_can_write_is_refused(tmp_path):
    rt = _short_dir()
    rt.chmod(0o1777)                                     # like /tmp: sticky, but anyone can add sockets
    out = _run_daemon(["--log-dir", str(tmp_path / "t"), "--ingest", f"ipc://{rt}/i.sock",
                       "--pub", f"ipc://{rt}/p.sock", "--control", f"ipc://{rt}/c.sock"])
    _refused(out, "writable by other users")


@pytest.mark.parametrize("where", ["under_a_file", "jsonl_is_a_directory", "proc"])
def test_a_log_dir_that_cannot_hold_the_source_of_truth_is_a_startup_error(tmp_path, where):
    if where == "under_a_file":
        (tmp_path / "file").write_text("x")
        log_dir = tmp_path / "file" / "telemetry"
    elif where == "jsonl_is_a_directory":
        log_dir = tmp_path / "telemetry"
        (log_dir / "metrics.jsonl").mkdir(parents=True)
    else:
        log_dir = Path("/proc/telemetry-test")
    rt = _short_dir()
    out = _run_daemon(["--log-dir", str(log_dir)], env={"TELEMETRY_RUNTIME_DIR": str(rt / "r")})
    _refused(out, str(log_dir))


# -- the W&B drop-in's media directory and keygen's key directory: the same checks -----------------
@needs_root
def test_a_media_directory_another_user_owns_is_refused_on_both_ends(tmp_path, monkeypatch):
    from telemetry.integrations.wandb_media import MediaWriter
    from telemetry.shared import media
    from telemetry.shared.endpoints import UnsafePathError

    planted = _short_dir()
    (planted / "1-0000000a-0.png").write_bytes(b"not ours")
    os.chown(planted, OTHER_UID, OTHER_UID)
    monkeypatch.setenv(media.ENV_MEDIA_DIR, str(planted))
    with pytest.raises(UnsafePathError):
        media.media_file("1-0000000a-0.png")             # the daemon reads nothing from it
    writer = MediaWriter()

    class Snap:
        def snapshot(self):
            raise AssertionError("not reached: the directory is refused first")

    assert writer.submit(Snap()) is None and "not owned by this user" in writer.unusable   # never raises


def test_keygen_refuses_a_key_directory_through_a_symlink(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    target.chmod(0o755)
    (tmp_path / "keys").symlink_to(target)
    out = subprocess.run([sys.executable, "-m", "telemetry", "keygen", "--dir", str(tmp_path / "keys"),
                          "--name", "n0"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "symlink" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not list(target.iterdir()) and stat.S_IMODE(target.stat().st_mode) == 0o755
