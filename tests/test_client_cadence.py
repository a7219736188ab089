"""log() hands every record to the client's sender thread (telemetry/client/deferred.py): the
caller's thread encodes and queues, and makes no ZeroMQ call; the queue is bounded and what it
refuses is counted in-band; close() with no daemon there, and none ever, does not wait on the
linger; fork and call order hold as before. And exclude(): the goodput ledger's window, as two
events in order."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import zmq

from protocol import Bye, Event, Hello, Metrics
from telemetry import TelemetryClient
from telemetry.client import core
from telemetry.shared.goodput import EXCLUDE_BEGIN, EXCLUDE_END
from test_client import Receiver

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def rx():
    r = Receiver()
    yield r
    r.close()


def _loss(records: list, src: int) -> int:
    mine = [r for r in records if r.src == src]
    return max(r.seq for r in mine) + 1 - len(mine)


def test_log_makes_no_zmq_call_on_the_callers_thread(rx, monkeypatch):
    caller = threading.get_ident()
    on_caller: list[bool] = []
    original = zmq.Socket.send

    def spy(self, *a, **k):
        on_caller.append(threading.get_ident() == caller)
        return original(self, *a, **k)

    # Every call as if at a training loop's fast cadence (a slow loop's record is sent by the
    # caller itself, the sender thread parked: core.DIRECT_AFTER_NS).
    monkeypatch.setattr(core, "DIRECT_AFTER_NS", 1 << 62, raising=False)
    monkeypatch.setattr(zmq.Socket, "send", spy)
    tm = TelemetryClient(rx.endpoint, rank=0)   # its hello: sent here, before any thread exists
    del on_caller[:]
    for step in range(200):
        tm.log(step, {"x": float(step), "n": step})
    got = rx.recv_until(lambda r: isinstance(r, Metrics) and r.step == 199)
    assert [r.step for r in got if isinstance(r, Metrics)] == list(range(200))
    assert on_caller and not any(on_caller), "log() sent on the caller's thread"
    monkeypatch.undo()
    tm.close(timeout_s=5.0)


@pytest.mark.filterwarnings("ignore:telemetry. a row of")
def test_a_full_queue_drops_and_counts_in_band_and_order_holds(rx, monkeypatch):
    # The sender thread is held on a record it must resolve (a row wider than a record takes:
    # sorted and split on that thread); the float records behind it fill the queue, which holds
    # `sndhwm` items: the rest are dropped, counted, and said in the next records.
    import telemetry.client.deferred as deferred

    gate = threading.Event()
    real_resolve = deferred.resolve

    def held(job):
        gate.wait(60)
        return real_resolve(job)

    monkeypatch.setattr(deferred, "resolve", held)
    tm = TelemetryClient(rx.endpoint, rank=0, sndhwm=10)
    tm.log(0, {f"w/{i}": float(i) for i in range(5000)})   # wider than a record: a Job, held
    for step in range(1, 101):
        tm.log(step, {"x": float(step)})
    # The held Job takes one of the 10 places: 9 records wait behind it, 91 are refused.
    dropped_now = tm._counts()["dropped"]
    assert dropped_now == 100 - (10 - 1)
    gate.set()
    tm.stats()                              # waits until the sender thread has handed them over
    records = rx.drain(500)                 # (the socket's own queue holds 10 too: more may drop)
    tm.log(101, {"x": 101.0})
    records += rx.recv_until(lambda r: isinstance(r, Metrics) and r.step == 101)
    st = tm.stats()
    assert st["sent"] + st["dropped"] == st["seq"] and st["dropped"] >= dropped_now
    assert records[-1].dropped == st["dropped"]                   # in-band
    assert _loss(records, st["src"]) == st["dropped"]             # what the daemon would report
    seqs = [r.seq for r in records]
    assert seqs == sorted(seqs)
    steps = [r.step for r in records if isinstance(r, Metrics)]
    assert steps == sorted(steps) and steps[-1] == 101
    tm.close(timeout_s=5.0)


@pytest.mark.filterwarnings("ignore:telemetry. a row of")
def test_a_slow_loops_record_sent_by_the_caller_still_waits_behind_a_queued_one(rx, monkeypatch):
    # At a slow cadence log() sends itself; never past a record the sender thread still holds.
    import telemetry.client.deferred as deferred

    gate = threading.Event()
    real_resolve = deferred.resolve

    def held(job):
        gate.wait(60)
        return real_resolve(job)

    monkeypatch.setattr(deferred, "resolve", held)
    monkeypatch.setattr(core, "DIRECT_AFTER_NS", 0, raising=False)   # every call "slow"
    tm = TelemetryClient(rx.endpoint, rank=0)
    tm.log(0, {"a": 1.0})                                   # sent by the caller
    tm.log(1, {f"w/{i}": float(i) for i in range(5000)})    # a Job, held on the sender thread
    for step in range(2, 20):
        tm.log(step, {"a": float(step)})
    gate.set()
    records = rx.recv_until(lambda r: isinstance(r, Metrics) and r.step == 19)
    steps = [r.step for r in records if isinstance(r, Metrics)]
    assert steps == sorted(steps) and set(steps) == set(range(20))
    tm.close(timeout_s=5.0)


_NO_DAEMON_SCRIPT = r"""
import json, sys
from telemetry import TelemetryClient
from telemetry.client import core
tm = TelemetryClient(sys.argv[1], linger_ms=600_000)
for step in range(100):
    tm.log(step, {"x": float(step)})
tm.event("e")
tm.close(timeout_s=600)
print(json.dumps(tm.stats()))
"""


def test_close_with_no_daemon_ever_does_not_wait_on_the_linger(tmp_path):
    # A linger of 10 minutes: the code before waited half of close()'s budget on the records
    # connection and the rest on the bye's, for records no daemon could ever take. The timeout
    # is a hang detector only.
    ep = f"ipc://{tmp_path}/ingest.sock"
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", _NO_DAEMON_SCRIPT, ep], capture_output=True,
                         text=True, cwd=ROOT, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    import json

    st = json.loads(out.stdout.strip().splitlines()[-1])
    # Nothing left the process: every record (hello, 100 metrics, the event) counted as dropped.
    assert st["sent"] == 0 and st["dropped"] == st["seq"] == 102 and st["pending"] == 0


def test_close_with_a_live_daemon_still_drains_and_says_bye(rx):
    tm = TelemetryClient(rx.endpoint, rank=0, linger_ms=60_000)
    for step in range(300):
        tm.log(step, {"x": float(step)})
    tm.close(timeout_s=30.0)
    records = rx.recv_until(lambda r: isinstance(r, Bye)) + rx.drain()
    assert sorted(r.step for r in records if isinstance(r, Metrics)) == list(range(300))
    st = tm.stats()
    assert st["dropped"] == 0 and st["sent"] == 302 and _loss(records, st["src"]) == 0


def test_fork_with_records_still_queued_in_the_parent(rx):
    tm = TelemetryClient(rx.endpoint, rank=0)
    tm.log(0, {"x": 0.0})
    for step in range(1, 500):               # likely still queued for the parent's sender thread
        tm.log(step, {"x": float(step)})
    parent_src = tm._src
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            tm.log(1000, {"child/x": 1.0})
            tm.close(timeout_s=5.0)
            st = tm.stats()
            code = 0 if st["src"] != parent_src and st["sent"] == 3 and st["dropped"] == 0 else 2
        finally:
            os._exit(code)
    tm.log(500, {"x": 500.0})
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    tm.close(timeout_s=10.0)
    records = []
    while sum(isinstance(r, Bye) for r in records) < 2:
        records += rx.recv_until(lambda r: isinstance(r, Bye))
    records += rx.drain()
    parent = [r for r in records if r.src == parent_src and not isinstance(r, Bye)]
    child = sorted((r for r in records if r.src != parent_src), key=lambda r: r.seq)
    assert [r.step for r in parent if isinstance(r, Metrics)] == list(range(501))
    assert [type(r) for r in child] == [Hello, Metrics, Bye] and child[1].values == {"child/x": 1.0}


def test_exclude_sends_its_two_events_in_order(make_daemon):
    d = make_daemon(per_rank=True, world_size=1)
    tm = TelemetryClient(d.ingest, rank=0)
    tm.log(1, {"train/loss": 1.0})
    with tm.exclude("eval on the side"):
        tm.log(2, {"eval/loss": 0.5})
    with tm.exclude():
        pass
    tm.log(3, {"train/loss": 0.9})
    tm.close(timeout_s=10.0)
    d.drain()
    lines = [r for r in d.read_jsonl() if r.get("kind") in ("metrics", "event") and r.get("rank") == 0
             and (r.get("kind") == "metrics" or str(r.get("name")).startswith("goodput/"))]
    seen = [(r["kind"], r.get("name") or r.get("step")) for r in lines]
    assert seen == [("metrics", 1), ("event", EXCLUDE_BEGIN), ("metrics", 2), ("event", EXCLUDE_END),
                    ("event", EXCLUDE_BEGIN), ("event", EXCLUDE_END), ("metrics", 3)], seen
    events = [r for r in lines if r["kind"] == "event"]
    assert [e.get("data") or {} for e in events] == [{"reason": "eval on the side"}] * 2 + [{}, {}]


def test_exclude_in_a_receiver_and_on_a_disabled_client(rx):
    from telemetry import DisabledClient

    with DisabledClient().exclude("x"):
        pass
    tm = TelemetryClient(rx.endpoint, rank=0)
    with tm.exclude("r"):
        pass
    got = [r for r in rx.recv_n(3) if isinstance(r, Event)]
    assert [(e.name, e.data) for e in got] == [(EXCLUDE_BEGIN, {"reason": "r"}), (EXCLUDE_END, {"reason": "r"})]
    tm.close(timeout_s=5.0)
