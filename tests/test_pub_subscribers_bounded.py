"""Subscribers that never read cannot take the daemon's memory (issue 26's memory class; a case
not in its list).

PUB queues per subscriber: at 100,000 records a subscriber and no limit on subscribers, 200
SUB sockets of another local user on a loopback TCP PUB (open to every local user, README "Trust
model"), subscribed to everything and never reading, held 2.3 GB of the daemon while one rank
logged 100,000 steps, and kept it. Now the PUB socket takes at most MAX_SUBSCRIBERS at once
(one beyond is shut and counted) and queues PUB_SNDHWM records a subscriber.

A real daemon, a real rank, real SUB sockets held by a process running as uid 65534; the
daemon's VmRSS from /proc. Hang detectors only.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import zmq

from daemon_util import ROOT
from other_user import OTHER_UID
from telemetry.daemon.sinks.pub import MAX_SUBSCRIBERS

NUM_SUBSCRIBERS = 100
STEPS = 40_000
# The daemon's default memory budget (memory_mb): the old code went to ~500 MB here.
BUDGET_MB = 256

RANK = r"""
import sys, time
import telemetry
tm = telemetry.TelemetryClient(sys.argv[1], rank=0)
vals = {f"train/v{i}": float(i) for i in range(10)}
for s in range(1, int(sys.argv[2]) + 1):
    tm.log(s, vals)
    if s % 500 == 0:
        time.sleep(0.05)          # the client's own queue is not what this test is about
print(tm.stats(), flush=True)
tm.close(timeout_s=60)
"""


def _rss_mb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) // 1024
    return 0


def _as_stranger(work) -> tuple[int, int]:
    """A forked process as uid 65534 that runs work(), then holds what it made until the test
    closes its end of a pipe (or dies); (pid, fd to close)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(w)
            os.setgroups([])
            os.setgid(OTHER_UID)
            os.setuid(OTHER_UID)
            held = work()           # noqa: F841  (kept open while the test runs)
            os.read(r, 1)
        finally:
            os._exit(0)
    os.close(r)
    return pid, w


def _silent_subscribers(endpoint: str, n: int) -> tuple[int, int]:
    """Another user holding `n` SUB sockets that never read."""
    def work():
        ctx = zmq.Context()
        socks = []
        for _ in range(n):
            s = ctx.socket(zmq.SUB)
            s.setsockopt(zmq.RCVHWM, 1)
            s.setsockopt(zmq.RCVBUF, 4096)
            s.setsockopt(zmq.SUBSCRIBE, b"")
            s.connect(endpoint)
            socks.append(s)
        return ctx, socks
    return _as_stranger(work)


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
def test_subscribers_that_never_read_are_bounded_in_number_and_memory(make_daemon):
    d = make_daemon(transport="tcp", world_size=1, config={"pollers": {"nvml_enabled": False}})
    sub_pid, sub_w = _silent_subscribers(d.pub, NUM_SUBSCRIBERS)
    rank = None
    try:
        deadline = time.monotonic() + 120          # a hang detector: every subscriber has come
        while True:
            pub = d.status()["security"]["connections"].get("pub", {})
            if pub.get("open", 0) >= MAX_SUBSCRIBERS and pub.get("refused", 0) >= NUM_SUBSCRIBERS - MAX_SUBSCRIBERS:
                break
            assert time.monotonic() < deadline, f"the subscribers never all came: {pub}"
            time.sleep(0.5)
        rank = subprocess.Popen([sys.executable, "-c", RANK, d.ingest, str(STEPS)], cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)
        peak = 0
        deadline = time.monotonic() + 600
        while rank.poll() is None:
            assert time.monotonic() < deadline, "the rank hung"
            peak = max(peak, _rss_mb(d.proc.pid))
            time.sleep(0.2)
        d.wait_for(lambda recs: any(r.get("kind") == "metrics" and r.get("step") == STEPS for r in recs),
                   timeout_s=300)
        peak = max(peak, _rss_mb(d.proc.pid))
        pub = d.status()["security"]["connections"]["pub"]
    finally:
        os.close(sub_w)
        os.kill(sub_pid, signal.SIGKILL)
        os.waitpid(sub_pid, 0)
        if rank is not None and rank.poll() is None:
            rank.kill()
            rank.wait(30)
    assert pub["open"] <= MAX_SUBSCRIBERS and pub["refused"] >= NUM_SUBSCRIBERS - MAX_SUBSCRIBERS, pub
    assert peak < BUDGET_MB, f"the daemon reached {peak} MB with {NUM_SUBSCRIBERS} silent subscribers"
    final = d.drain()
    assert final["security"]["connections"]["pub"]["refused"] >= NUM_SUBSCRIBERS - MAX_SUBSCRIBERS


def _subscribing_stranger(endpoint: str, topics: list[bytes]) -> tuple[int, int]:
    """Another user's SUB socket sending `topics` as subscriptions, held open."""
    def work():
        ctx = zmq.Context()
        s = ctx.socket(zmq.SUB)
        s.setsockopt(zmq.RCVHWM, 1)
        s.connect(endpoint)
        time.sleep(1.0)             # connected: a SUB drops what its queue (1,000) cannot hold
        for i, t in enumerate(topics):
            s.setsockopt(zmq.SUBSCRIBE, t)
            if i % 200 == 199:
                time.sleep(0.02)
        return ctx, s
    return _as_stranger(work)


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
def test_a_huge_subscription_of_another_user_cannot_grow_the_daemon(make_daemon):
    """libzmq keeps each distinct subscription in a trie, at ~45 bytes of the daemon's memory per
    byte of it: one 20 MB subscription from another local user on a loopback TCP PUB grew the
    daemon by 1.2 GB (an outside tester's find; 10 of 100 MB: 14 GB, and the host's OOM killer).
    Now a subscriber's message longer than MAX_SUBSCRIBER_MESSAGE_BYTES shuts its connection. A
    subscriber of the daemon's own records still gets them."""
    from telemetry.client import TelemetryClient
    from telemetry.consumers.subscribe import Subscriber

    d = make_daemon(transport="tcp", world_size=1, config={"pollers": {"nvml_enabled": False}})
    before = _rss_mb(d.proc.pid)
    pids = [_subscribing_stranger(d.pub, [b"m" * (20 << 20)])]
    sub = Subscriber(d.pub, ["metrics"])
    try:
        peak, got = 0, set()
        client = TelemetryClient(d.ingest, rank=0)
        deadline = time.monotonic() + 120       # hang detector
        step, dwell = 0, time.monotonic() + 5   # the stranger's subscription has arrived by then
        while len(got) < 20 or time.monotonic() < dwell:
            assert time.monotonic() < deadline, f"the subscriber got {sorted(got)}"
            step += 1
            client.log(step, {"train/loss": 1.0})
            for kind, rec in sub.records(100):
                assert kind == "metrics"
                got.add(rec["step"])
            peak = max(peak, _rss_mb(d.proc.pid))
            time.sleep(0.05)
        client.close()
    finally:
        sub.close()
        for pid, w in pids:
            os.close(w)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert peak - before < 64, f"the daemon grew from {before} to {peak} MB"
