"""A node's key speaks only for its node: a head refuses, and counts, what one node's key sends as
another (security/identity.py); `telemetry status` and `drain` reach a daemon whose control
socket is CURVE (security.curve_loopback) with the keys the daemon wrote for them."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time

import msgspec
import pytest
import zmq

from daemon_util import ROOT
from protocol import KIND_EVENT, PROTOCOL_VERSION
from telemetry.shared.security.identity import AllowList, write_allowed
from telemetry.tools.keygen import make_pair
from testkit import faults
from testkit.daemon_proc import raw_push

STEPS = 60


def _keygen(*args: str) -> None:
    r = subprocess.run([sys.executable, "-m", "telemetry", "keygen", *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def _event(src: int, rank: int, seq: int, name: str, data: dict) -> bytes:
    return msgspec.msgpack.encode((KIND_EVENT, PROTOCOL_VERSION, src, rank, seq, 0, time.time_ns(), name, data))


def _node(work, name: str, port: int, keys, key: str, node_rank: int, ranks_per_node: int):
    return faults.launch(work / name, faults.Endpoints(), world_size=ranks_per_node, config={
        "pollers": {"nvml_enabled": False},
        "forward": {"endpoint": f"tcp://127.0.0.1:{port}", "node_rank": node_rank, "num_nodes": 2,
                    "server_public_key": str(keys / "head.key"), "client_secret_key": str(keys / f"{key}.key_secret"),
                    "heartbeat_ivl_s": 0.5, "heartbeat_timeout_s": 2.0}})


def test_a_key_that_speaks_as_another_node_is_refused_and_counted(tmp_path):
    keys = tmp_path / "keys"
    _keygen("--dir", str(keys), "--name", "head")
    _keygen("--dir", str(keys), "--name", "node0", "--name", "node1", "--allow", str(keys / "allowed"))
    port = faults.free_port()
    head = faults.launch(
        tmp_path / "head", faults.Endpoints(), world_size=2,
        config={"security": {"server_secret_key": str(keys / "head.key_secret"),
                             "allowed_clients_dir": str(keys / "allowed"), "curve_loopback": True},
                "aggregator": {"step_timeout_s": 2.0}},
        extra=("--remote-ingest", f"tcp://127.0.0.1:{port}"))
    # Node 0, honest: its own key, its ranks 0 and 1. The forger: node 1's key in a real node
    # daemon that says it is node 0 (forward.node_rank 0), with one rank of other losses.
    honest = _node(tmp_path, "node0", port, keys, "node0", 0, 2)
    forger = _node(tmp_path, "forger", port, keys, "node1", 0, 1)
    ctx = zmq.Context()
    try:
        procs = faults.start_ranks(honest.ingest, [0, 1], STEPS, 20.0, tmp_path / "ranks0", env={"WORLD_SIZE": "2"})
        procs += faults.start_ranks(forger.ingest, [0], STEPS, 20.0, tmp_path / "ranks1", env={"WORLD_SIZE": "1"})
        # By hand, node 1's key with its own rank in the header: an event naming node 0 (refused),
        # and one naming node 1 (its own: taken, so the link itself works).
        raw = raw_push(ctx, f"tcp://127.0.0.1:{port}", curve_keys=(keys / "head.key", keys / "node1.key_secret"))
        src = 12345
        raw.send(_event(src, 1, 0, "diagnosis/rank_exited", {"node_rank": 0, "rank": 0, "severity": "critical"}))
        raw.send(_event(src, 1, 1, "own_event", {"node_rank": 1}))
        faults.wait_ranks(procs[:2], tmp_path / "ranks0")
        faults.wait_ranks(procs[2:], tmp_path / "ranks1")
        honest_final, forger_final = honest.drain(), forger.drain()
        fwd = honest_final["sinks"]["forward"], forger_final["sinks"]["forward"]
        assert fwd[0]["dropped"] == 0 and fwd[1]["dropped"] == 0
        sent = {"honest": fwd[0]["seq"], "forger": fwd[1]["seq"]}
        deadline = time.monotonic() + 120       # a hang detector: what the nodes flushed reaches the head
        while True:
            st = head.status()
            got = st["per_rank"].get("0", {})
            refused = st["security"].get("identity_refused_by_key", {}).get("node1", 0)
            if got.get("received", 0) + got.get("lost", 0) >= sent["honest"] and refused >= sent["forger"] + 1:
                break
            assert got.get("received", 0) <= sent["honest"], ("the head took records as node 0 that it never sent",
                                                              got, sent)
            assert time.monotonic() < deadline, (st["per_rank"], st["security"], sent)
            time.sleep(0.2)
        final = head.drain()
    finally:
        ctx.destroy(linger=0)
        for d in (head, honest, forger):
            d.cleanup()
    # Every record the forger sent, and the hand-made event naming node 0, refused and counted.
    assert final["security"]["identity_refused_by_key"] == {"node1": sent["forger"] + 1}
    assert final["security"]["identity_refused"] == sent["forger"] + 1
    assert head.read_jsonl("daemon")[-1]["values"]["telemetry/identity_refused"] == sent["forger"] + 1
    # The honest node exactly accounted: what it sent is what the head received or counted lost.
    node0 = final["per_rank"]["0"]
    assert node0["received"] + node0["lost"] == sent["honest"] and node0["sources"] == 1
    # The head's aggregates are node 0's alone, step for step.
    mine = {s: r["values"]["train/loss"] for s, r in honest.steps().items()}
    theirs = {s: r["values"]["train/loss"] for s, r in head.steps().items()}
    assert len(theirs) >= STEPS // 2 and set(theirs) <= set(mine)
    assert all(theirs[s] == pytest.approx(mine[s]) for s in theirs), \
        [(s, theirs[s], mine[s]) for s in theirs if theirs[s] != pytest.approx(mine[s])][:5]
    events = head.read_jsonl("event")
    assert not [e for e in events if e["name"] == "diagnosis/rank_exited"]
    assert [e for e in events if e["name"] == "own_event" and e["rank"] == 1]
    assert [h for h in head.read_jsonl("hello") if h["rank"] == 0]       # node 0's own hello got in


def test_allow_list_bindings_old_and_new(tmp_path, caplog):
    keys = tmp_path / "keys"
    allowed = keys / "allowed"
    allowed.mkdir(parents=True, mode=0o700)
    for name in ("node0", "node7"):
        pub, _ = make_pair(keys, name)
        write_allowed(allowed, pub, {"node0": 0, "node7": 3}[name])    # the binding, not the name, counts
    old, _ = make_pair(keys, "node12")
    (allowed / "node12.key").write_bytes(old.read_bytes())           # made before bindings: its name
    nameless, _ = make_pair(keys, "dashboard")
    (allowed / "dashboard.key").write_bytes(nameless.read_bytes())   # no number: no node
    twice, _ = make_pair(keys, "node4")
    (allowed / "node4.key").write_bytes(twice.read_bytes())
    (allowed / "node5.key").write_bytes(twice.read_bytes())          # one key allowed as two nodes
    with caplog.at_level(logging.WARNING, logger="telemetry.shared.security"):
        allow = AllowList(allowed)
    assert allow.ranks == {"node0": 0, "node7": 3, "node12": 12, "dashboard": None, "node4": None, "node5": None}
    said = caplog.text
    assert "node12" in said and "no node binding" in said and "dashboard" in said and "two nodes" in said


def test_status_and_drain_reach_a_curve_control_socket(tmp_path, monkeypatch):
    keys = tmp_path / "keys"
    _keygen("--dir", str(keys), "--name", "head", "--name", "node0", "--allow", str(keys / "allowed"))
    rt = tmp_path / "rt"
    rt.mkdir(mode=0o700)
    monkeypatch.setenv("TELEMETRY_RUNTIME_DIR", str(rt))
    port = faults.free_port()
    control = f"tcp://127.0.0.1:{port}"
    d = faults.launch(tmp_path / "tm", faults.Endpoints(), world_size=1, extra=("--control", control),
                      config={"security": {"server_secret_key": str(keys / "head.key_secret"),
                                           "allowed_clients_dir": str(keys / "allowed"), "curve_loopback": True}})
    try:
        assert "control" in d.status()["security"]["secured"]        # the socket is a CURVE server
        env = {k: v for k, v in os.environ.items() if not k.startswith("TELEMETRY_CURVE_")}

        def cli(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "telemetry", *args, "--control", control, "--timeout", "30"],
                                  cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)

        st = cli("status", "--json")
        assert st.returncode == 0, st.stderr
        assert json.loads(st.stdout)["security"]["curve"] is True
        # A client without the daemon's keys file is still refused (CURVE holds): no answer.
        (rt / f"control-{port}.curve").rename(rt / "moved")
        shut = subprocess.run([sys.executable, "-m", "telemetry", "status", "--control", control, "--timeout", "2"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert shut.returncode != 0 and "Traceback" not in shut.stderr
        (rt / "moved").rename(rt / f"control-{port}.curve")
        dr = cli("drain")
        assert dr.returncode == 0, dr.stderr
        assert d.proc.wait(60) == 0
        assert not (rt / f"control-{port}.curve").exists()            # gone with its daemon
    finally:
        d.cleanup()


def test_the_guard_checks_every_frame_after_good_ones(tmp_path):
    """Unit, real sockets: after a key's good metrics (the fast path: their header bytes kept), a
    frame as another node, under another node's source, or a hello naming another node is still
    refused; the same key's new source and its own hello are taken."""
    from protocol import encode_metrics
    from telemetry.shared.security.curve import DaemonSecurity, SecurityConfig, apply_client_curve

    keys = tmp_path / "keys"
    make_pair(keys, "head")
    allowed = keys / "allowed"
    allowed.mkdir(mode=0o700)
    for name, rank in (("node0", 0), ("node1", 1)):
        write_allowed(allowed, make_pair(keys, name)[0], rank)
    ctx = zmq.Context()
    sec = DaemonSecurity(ctx, SecurityConfig(server_secret_key=str(keys / "head.key_secret"),
                                             allowed_clients_dir=str(allowed), curve_loopback=True), {})
    try:
        pull = ctx.socket(zmq.PULL)
        pull.linger = 0
        sec.prepare(pull, "tcp://127.0.0.1:0", "remote_ingest")
        pull.bind("tcp://127.0.0.1:0")
        guard = sec.node_guard(pull, "tcp://127.0.0.1:1")
        ep = pull.getsockopt(zmq.LAST_ENDPOINT).decode()
        pushes = {}
        for name in ("node0", "node1"):
            pushes[name] = s = ctx.socket(zmq.PUSH)
            s.linger = 0
            apply_client_curve(s, str(keys / "head.key"), str(keys / f"{name}.key_secret"))
            s.connect(ep)
        t = time.time_ns()
        hello = msgspec.msgpack.encode((1, PROTOCOL_VERSION, 77, 0, 3, 0, t, {"rank": 0, "node_rank": 0}))
        forged_hello = msgspec.msgpack.encode((1, PROTOCOL_VERSION, 77, 0, 4, 0, t, {"rank": 0, "node_rank": 1}))
        sent = [("node0", encode_metrics(77, 0, i, 0, t, i, {"x": 1.0}), True) for i in range(3)]
        sent += [("node0", encode_metrics(77, 1, 3, 0, t, 3, {"x": 1.0}), False),     # as node 1
                 ("node1", encode_metrics(77, 1, 0, 0, t, 0, {"x": 1.0}), False),     # node 0's source
                 ("node1", encode_metrics(88, 1, 0, 0, t, 0, {"x": 2.0}), True),      # its own
                 ("node0", encode_metrics(99, 0, 0, 0, t, 9, {"x": 1.0}), True),      # a new source of its own
                 ("node0", hello, True), ("node0", forged_hello, False),
                 ("node0", encode_metrics(77, 0, 5, 0, t, 5, {"x": 1.0}), True)]
        got = []
        for name, frame, _ in sent:           # one at a time: the order of two links is libzmq's
            target = len(got) + guard.num_refused + 1
            pushes[name].send(frame)
            deadline = time.monotonic() + 30  # a hang detector
            while len(got) + guard.num_refused < target:
                assert time.monotonic() < deadline, (name, frame)
                try:
                    got.append(guard.recv())
                except zmq.Again:
                    time.sleep(0.005)
        assert got == [frame for _, frame, ok in sent if ok]
        assert guard.num_refused == 3 and guard.refused_by_key == {"node0": 2, "node1": 1}
    finally:
        sec.close()
        ctx.destroy(linger=0)
