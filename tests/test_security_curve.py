"""CURVE beyond loopback: keygen, refusal to listen unprotected, the allow-list, per-bind options."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import time

import pytest
import zmq

from daemon_util import ROOT
from protocol import encode_metrics
from telemetry.client import TelemetryClient
from telemetry.shared.security.curve import ENV_CLIENT_KEY, ENV_SERVER_KEY, SecurityError, apply_client_curve
from telemetry.tools.keygen import make_pair
from testkit.daemon_proc import raw_push


def _keygen(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "telemetry", "keygen", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


@pytest.fixture
def keys(tmp_path):
    d = tmp_path / "keys"
    r = _keygen("--dir", str(d), "--name", "head", "--name", "node0", "--allow", str(d / "allowed"))
    assert r.returncode == 0, r.stderr
    os.remove(d / "allowed" / "head.key")   # only node0 is a client
    make_pair(d, "stranger")                # a valid key pair nobody allowed
    return d


def test_keygen_writes_private_key_files(keys):
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    assert stat.S_IMODE((keys / "allowed").stat().st_mode) == 0o700
    assert stat.S_IMODE((keys / "head.key_secret").stat().st_mode) == 0o600
    assert "secret-key" in (keys / "head.key_secret").read_text()
    assert "secret-key" not in (keys / "head.key").read_text()
    assert sorted(p.name for p in (keys / "allowed").iterdir()) == ["node0.key"]
    again = _keygen("--dir", str(keys), "--name", "head")
    assert again.returncode == 1 and "exists" in again.stderr   # never overwrites a key silently


def _daemon_cmd(tmp_path, *extra):
    rt = tmp_path / "rt"
    return [sys.executable, "-m", "telemetry", "daemon", "--log-dir", str(tmp_path / "tm"), "--wandb", "disabled",
            "--ingest", f"ipc://{rt}/i", "--pub", f"ipc://{rt}/p", "--control", f"ipc://{rt}/c", *extra]


@pytest.mark.parametrize("flag", ["--remote-ingest", "--pub"])
def test_daemon_refuses_to_listen_beyond_loopback_without_curve(tmp_path, flag):
    cmd = _daemon_cmd(tmp_path) + [flag, "tcp://0.0.0.0:0"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "refusing to listen beyond loopback without CURVE" in r.stderr
    assert "telemetry daemon ready" not in r.stdout


def test_bad_security_section_is_a_config_error(make_daemon, tmp_path):
    with pytest.raises(RuntimeError, match="server_secret_key"):
        make_daemon(config={"security": {"server_secret_key": str(tmp_path / "nope")}}, ready_timeout_s=180)


def test_allow_list_admits_listed_keys_and_counts_refusals(make_daemon, keys, monkeypatch):
    d = make_daemon(world_size=1, per_rank=True, extra_args=("--remote-ingest", "tcp://0.0.0.0:0"),
                    config={"security": {"server_secret_key": str(keys / "head.key_secret"),
                                         "allowed_clients_dir": str(keys / "allowed")}})
    line = next(ln for ln in d.lines if "telemetry daemon ready" in ln)
    remote = [t.split("=", 1)[1] for t in line.split() if t.startswith("remote_ingest=")][0]
    assert remote.startswith("tcp://0.0.0.0:")
    endpoint = "tcp://127.0.0.1:" + remote.rsplit(":", 1)[1]
    ctx = zmq.Context()
    try:
        # An unlisted key and a client without CURVE: refused; their records never land.
        stranger = raw_push(ctx, endpoint, curve_keys=(keys / "head.key", keys / "stranger.key_secret"))
        plain = raw_push(ctx, endpoint)
        for i in range(5):
            for sock, frame in ((stranger, encode_metrics(11, 7, i, 0, time.time_ns(), 100 + i, {"x": 1.0})),
                                (plain, encode_metrics(12, 8, i, 0, time.time_ns(), 200 + i, {"x": 1.0}))):
                try:
                    sock.send(frame, zmq.NOBLOCK)
                except zmq.Again:   # its refused link's pipe already gone (a loaded box): not queued either
                    pass
        # The allow-listed node, through the client's own hook ($TELEMETRY_CURVE_*).
        monkeypatch.setenv(ENV_SERVER_KEY, str(keys / "head.key"))
        monkeypatch.setenv(ENV_CLIENT_KEY, str(keys / "node0.key_secret"))
        tm = TelemetryClient(endpoint, rank=0)
        for step in range(5):
            tm.log(step, {"train/loss": float(step)})
        tm.close()
        monkeypatch.delenv(ENV_SERVER_KEY)
        monkeypatch.delenv(ENV_CLIENT_KEY)
        # Local ranks on the same PULL socket over ipc need no keys (options are per bind).
        local = TelemetryClient(d.ingest, rank=0)
        local.log(50, {"train/loss": 5.0})
        local.close()
        d.wait_for(lambda recs: {0, 1, 2, 3, 4, 50} <= {r.get("step") for r in recs}, kind="metrics")
        deadline = time.monotonic() + 120
        while True:
            sec = d.status()["security"]
            if sec["auth_refused"] >= 1 and sec["connections"]["ingest"]["handshake_failed"] >= 1:
                break
            assert time.monotonic() < deadline, sec
            time.sleep(0.2)
    finally:
        ctx.destroy(linger=0)
    final = d.drain()
    assert final["security"]["curve"] is True and final["security"]["auth_allowed"] >= 1
    steps = {r["step"] for r in d.read_jsonl("metrics")}
    assert not steps & set(range(100, 105)) and not steps & set(range(200, 205))
    assert set(final["per_rank"]) == {"0"}           # ranks 7 and 8 never got in
    daemon_recs = d.read_jsonl("daemon")
    assert daemon_recs[-1]["values"]["telemetry/auth_refused"] >= 1


def test_client_hook_needs_both_keys(keys):
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.PUSH)
    try:
        assert apply_client_curve(s) is False   # nothing set: plain socket (ipc, loopback)
        with pytest.raises(SecurityError):
            apply_client_curve(s, server_key=str(keys / "head.key"))
        with pytest.raises(SecurityError):      # a public key file where a secret one belongs
            apply_client_curve(s, str(keys / "head.key"), str(keys / "node0.key"))
    finally:
        s.close(linger=0)


def test_defaults_stay_private(tmp_path, monkeypatch):
    from telemetry.shared import endpoints

    assert endpoints.normalize("5555") == "tcp://127.0.0.1:5555"
    assert endpoints.normalize("tcp://*:5555") == "tcp://127.0.0.1:5555"     # '*' means loopback here
    assert endpoints.is_loopback("tcp://127.0.0.2:1") and not endpoints.is_loopback("tcp://0.0.0.0:1")
    run_dir = tmp_path / "rt"
    run_dir.mkdir(mode=0o755)
    monkeypatch.setenv(endpoints.ENV_RUNTIME_DIR, str(run_dir))
    ep = endpoints.resolve("ingest", create_dir=True)
    assert ep == f"ipc://{run_dir}/ingest.sock"
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700                      # tightened to 0700


def test_a_curve_subscriber_gets_the_pub_records(make_daemon, keys):
    """A PUB beyond loopback speaks CURVE: an allow-listed subscriber completes the handshake and
    gets the records. The PUB's bound on a subscriber's message (MAXMSGSIZE, against subscriptions
    that grow the daemon) applies to the handshake's messages too: at 256 bytes the CURVE
    INITIATE (~300) was refused and no CURVE subscriber ever got a record."""
    d = make_daemon(world_size=1, extra_args=("--pub", "tcp://0.0.0.0:0"),
                    config={"security": {"server_secret_key": str(keys / "head.key_secret"),
                                         "allowed_clients_dir": str(keys / "allowed")}})
    line = next(ln for ln in d.lines if "telemetry daemon ready" in ln)
    pub = [t.split("=", 1)[1] for t in line.split() if t.startswith("pub=")][0]
    endpoint = "tcp://127.0.0.1:" + pub.rsplit(":", 1)[1]
    ctx = zmq.Context()
    try:
        sub = ctx.socket(zmq.SUB)
        apply_client_curve(sub, str(keys / "head.key"), str(keys / "node0.key_secret"))
        sub.setsockopt(zmq.SUBSCRIBE, b"metrics")
        sub.connect(endpoint)
        poller = zmq.Poller()
        poller.register(sub, zmq.POLLIN)
        tm = TelemetryClient(d.ingest, rank=0)
        deadline, step = time.monotonic() + 120, 0         # hang detector
        while not poller.poll(100):
            assert time.monotonic() < deadline, "no record reached the CURVE subscriber"
            tm.log(step, {"train/loss": 1.0})
            step += 1
        topic, _line = sub.recv_multipart()
        assert topic == b"metrics"
        tm.close()
    finally:
        ctx.destroy(linger=0)
