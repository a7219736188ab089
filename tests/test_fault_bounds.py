"""Memory and descriptors are bounded: the ingest queue is one budget (rcvhwm) shared by the
connections, connections beyond max_connections are refused and counted, and the daemon raises
its soft descriptor limit to the hard one (libzmq aborts when accept() runs out)."""
from __future__ import annotations

import os
import resource
import time

import pytest
import zmq

from benchmarks import reliability
from protocol import encode_metrics
from test_daemon_e2e import SINKS_ENV


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def test_the_soft_descriptor_limit_is_raised_to_the_hard_one(tmp_path):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= 512:
        pytest.skip(f"hard descriptor limit {hard}: nothing to raise to")
    eps = reliability.Endpoints()
    d = reliability.launch(tmp_path / "telemetry", eps, nofile_soft=256)
    try:
        limits = d.status()["limits"]
        want = min(hard if hard != resource.RLIM_INFINITY else 1 << 20, 1 << 20)
        assert limits["fd_limit"] == want, limits
        assert limits["max_connections"] == 1024
    finally:
        d.drain()
        d.cleanup()


def test_connections_beyond_the_limit_are_refused_and_counted(tmp_path):
    eps = reliability.Endpoints()
    d = reliability.launch(tmp_path / "telemetry", eps, config={"max_connections": 4})
    ctx = zmq.Context()
    socks = []
    try:
        for i in range(12):
            s = d.push(ctx)
            s.send(encode_metrics(100 + i, 0, 0, 0, time.time_ns(), 0, {"x": 1.0}), zmq.NOBLOCK)
            socks.append(s)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            conns = d.status()["security"]["connections"]["ingest"]
            if conns["refused"] >= 8:
                break
            time.sleep(0.2)
        assert conns["refused"] >= 8 and conns["open"] <= 4, conns          # and it still answers
        for s in socks:
            s.close(0)
        socks = []
        # Room again once they are gone: a new client's records arrive.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and d.status()["security"]["connections"]["ingest"]["open"] > 0:
            time.sleep(0.2)
        before = d.status()["records_in"]
        s = d.push(ctx)
        socks.append(s)
        s.send(encode_metrics(999, 0, 0, 0, time.time_ns(), 1, {"x": 1.0}))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and d.status()["records_in"] == before:
            time.sleep(0.1)
        final = d.drain()
        assert final["records_in"] > before
        daemon_rec = [r for r in d.read_jsonl("daemon")][-1]["values"]
        assert daemon_rec["telemetry/connections_refused"] >= 8
    finally:
        for s in socks:
            s.close(0)
        ctx.term()
        d.cleanup()


def _flood(tmp_path, rcvhwm: int) -> tuple[float, dict, int]:
    """4 clients push up to 60,000 records of ~1 KB each at a daemon whose loop stalls (an inline
    sink sleeping per batch); returns the daemon's RSS growth (MB), its limits, records sent."""
    eps = reliability.Endpoints()
    cfg = {"rcvhwm": rcvhwm, "max_connections": 16,
           "custom_sinks": [{"class": "daemon_sinks:StallSink", "options": {"sleep_s": 0.5}}]}
    d = reliability.launch(tmp_path / f"telemetry-{rcvhwm}", eps, config=cfg, env=SINKS_ENV)
    ctx = zmq.Context()
    socks = []
    try:
        payload = {f"v{i:03d}": float(i) for i in range(80)}            # ~1 KB a record
        sent = 0
        for c in range(4):
            socks.append(d.push(ctx))
        for i in range(50):                   # warm-up: what the daemon builds for its first records
            for c, s in enumerate(socks):
                s.send(encode_metrics(200 + c, c, i, 0, 0, i, payload))
        while d.status()["records_in"] < 200:
            time.sleep(0.5)
        time.sleep(1.0)
        rss_before = _rss_mb(d.proc.pid)
        for i in range(50, 60_000):
            for c, s in enumerate(socks):
                try:
                    s.send(encode_metrics(200 + c, c, i, 0, 0, i, payload), zmq.NOBLOCK)
                    sent += 1
                except zmq.Again:
                    pass
        time.sleep(3.0)                       # libzmq's I/O thread takes what the queues allow
        grown = _rss_mb(d.proc.pid) - rss_before
        return grown, d.status(timeout_s=30)["limits"], sent
    finally:
        for s in socks:
            s.close(0)
        ctx.term()
        d.proc.kill()
        d.cleanup()


@pytest.mark.slow
def test_fast_clients_against_a_stalled_loop_stay_within_the_budget(tmp_path):
    """Each connection's queue is rcvhwm // max_connections: a budget of 4,000 (250 a connection)
    holds the daemon to the records its stalled loop took in, while 100 times that budget lets
    libzmq queue what 4 fast clients send (the old per-connection rcvhwm was 1,000,000)."""
    small, limits, sent = _flood(tmp_path, 4_000)
    assert limits["rcvhwm_per_connection"] == 250 and sent > 100_000      # it really was a flood
    large, limits, _ = _flood(tmp_path, 400_000)
    assert limits["rcvhwm_per_connection"] == 25_000
    assert small < 100 and small < large / 2, (small, large)
