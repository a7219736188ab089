"""The daemon as a process, over real sockets: accounting, aggregation, timeouts, slow and hung
sinks, drain on SIGTERM, torn-tail repair, malformed input, PUB, control."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import msgspec
import pytest
import zmq

from protocol import encode_metrics
from telemetry.client import TelemetryClient
from telemetry.daemon import hotpath

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
SINKS_ENV = {"PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")])}

RANK_SCRIPT = """
import json, sys
from telemetry.client import TelemetryClient
ep, rank, world, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
tm = TelemetryClient(ep, rank=rank)
tm.hello({"world_size": world, "config": {"lr": 3e-4}})
for step in range(n):
    tm.log(step, {"train/loss": 2.0 + rank, "perf/tokens": 100, "perf/samples": 1,
                  "perf/step_time": 0.1 + 0.01 * rank, "train/lr": 3e-4})
stats = tm.stats()
tm.close()
print(json.dumps(stats))
"""


def run_ranks(ingest: str, world: int, n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, ingest, str(r), str(world), str(n)], cwd=ROOT,
                             stdout=subprocess.PIPE, text=True) for r in range(world)]


def finish_ranks(procs) -> list[dict]:
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def test_eight_ranks_exactly_once(make_daemon):
    world, n = 8, 300
    d = make_daemon(world_size=world, per_rank=True)
    stats = finish_ranks(run_ranks(d.ingest, world, n))
    assert all(s["dropped"] == 0 for s in stats)
    d.wait_for(lambda recs: n - 1 in {r.get("step") for r in recs if r.get("kind") == "metrics"
                                       and "rank" not in r})
    final = d.drain()
    assert final["drained"] and final["records_lost"] == 0 and final["records_malformed"] == 0
    assert final["records_in_by_kind"]["metrics"] == world * n
    per_rank = d.read_jsonl("metrics", aggregated=False)
    keys = Counter((r["rank"], r["step"]) for r in per_rank)
    assert len(per_rank) == world * n and max(keys.values()) == 1          # sent == written, no duplicates
    assert set(keys) == {(r, s) for r in range(world) for s in range(n)}
    steps = d.read_jsonl("metrics", aggregated=True)
    assert sorted(r["step"] for r in steps) == list(range(n))             # each step exactly once
    assert not any("missing_ranks" in r for r in steps)
    v = steps[-1]["values"]
    assert v["perf/tokens"] == 800 and v["perf/samples"] == 8
    assert v["train/loss"] == pytest.approx(2.0 + 3.5)
    assert v["perf/step_time_max"] == pytest.approx(0.17) and v["perf/slowest_rank"] == 7
    assert v["perf/tokens_per_second"] == pytest.approx(800 / 0.17)
    assert v["perf/steps_per_second"] == pytest.approx(1 / 0.17)
    assert sum(s["sent"] for s in stats) == final["records_in"] - final["records_in_by_kind"]["bye"]
    assert len(d.read_jsonl("hello")) == final["records_in_by_kind"]["hello"] >= world


def test_step_timeout_with_a_missing_rank(make_daemon):
    d = make_daemon(world_size=3, config={"aggregator": {"step_timeout_s": 0.5}})
    clients = [TelemetryClient(d.ingest, rank=r) for r in (0, 1)]
    for r, c in enumerate(clients):
        c.log(0, {"train/loss": float(r)})
    for c in clients:
        c.close()
    recs = d.wait_for(lambda recs: any(r.get("step") == 0 for r in recs), kind="metrics")
    (rec,) = [r for r in recs if r.get("step") == 0]
    assert rec["missing_ranks"] == [2] and rec["values"]["train/loss"] == 0.5
    st = d.status()
    assert st["steps_incomplete"] == 1 and st["steps_pending"] == 0


def test_slow_sink_does_not_slow_ingest_or_jsonl(make_daemon):
    cfg = {"custom_sinks": [{"class": "daemon_sinks:SleepySink", "options": {"sleep_s": 1.0}, "max_queued": 50}]}
    d = make_daemon(world_size=2, config=cfg, env=SINKS_ENV)
    n = 1000
    finish_ranks(run_ranks(d.ingest, 2, n))
    d.wait_for(lambda recs: len({r["step"] for r in recs if "rank" not in r}) == n, kind="metrics")
    st = d.status()
    # JSONL has every step while the slow sink has taken at most a few batches, and its overflow
    # was dropped and counted instead of pushing back on ingest.
    assert st["records_in_by_kind"]["metrics"] == 2 * n and st["records_lost"] == 0
    sleepy = st["sinks"]["sleepy"]
    assert sleepy["written"] < n and sleepy["dropped"] > 0
    assert st["sinks"]["jsonl"]["dropped"] == 0
    assert d.stop() == 0


def test_hung_sink_does_not_hold_the_drain(make_daemon):
    cfg = {"drain_timeout_s": 2.0, "custom_sinks": [{"class": "daemon_sinks:HangSink"}]}
    d = make_daemon(world_size=1, config=cfg, env=SINKS_ENV)
    tm = TelemetryClient(d.ingest, rank=0)
    for s in range(20):
        tm.log(s, {"train/loss": 1.0})
    tm.close()
    d.wait_for(lambda recs: len(recs) >= 20, kind="metrics")
    # The sink blocks in consume() for good: a drain that waited for it would never end (stop's
    # 120 s is a hang detector), so its end at all is the drain deadline at work.
    rc = d.stop(timeout_s=120)
    assert rc == 0                                  # JSONL finished; only the hung sink was abandoned
    assert "abandoned: hang" in d.output()
    assert [r["step"] for r in d.read_jsonl("metrics")] == list(range(20))


def test_sigterm_mid_stream_loses_nothing_accepted(make_daemon):
    world, n = 4, 4000
    d = make_daemon(world_size=world, per_rank=True, config={"jsonl": {"fsync_interval_s": 0.5}})
    procs = run_ranks(d.ingest, world, n)
    d.wait_for(lambda recs: len(recs) > 200, kind="metrics")     # mid-stream
    assert d.stop() == 0
    finish_ranks(procs)
    recs = d.read_jsonl()
    final = [r for r in recs if r["kind"] == "daemon"][-1]["values"]
    metrics_in = final["telemetry/records_in"] - final["telemetry/records_in_by_kind/hello"] \
        - final["telemetry/records_in_by_kind/event"] - final["telemetry/records_in_by_kind/bye"]
    per_rank = [r for r in recs if r["kind"] == "metrics" and "rank" in r]
    assert len(per_rank) == metrics_in > 0                      # every accepted record is on disk
    assert len(set((r["rank"], r["step"]) for r in per_rank)) == len(per_rank)
    # ... and every one of them went into exactly one aggregated step
    steps = [r for r in recs if r["kind"] == "metrics" and "rank" not in r]
    assert sum(r["values"]["perf/samples"] for r in steps) == metrics_in
    assert final["telemetry/sink_dropped"] == 0
    # Nothing was left in a queue that no thread will read again (the final counters included).
    status = json.loads((d.log_dir / "drain.json").read_text())
    assert status["drained"] and set(status["queued"].values()) == {0}, status["queued"]


def test_torn_tail_repaired_and_appended_on_restart(tmp_path, make_daemon):
    log_dir = tmp_path / "tel"
    log_dir.mkdir()
    whole = json.dumps({"kind": "metrics", "t": 1.0, "step": 0, "values": {"x": 1.0}}).encode() + b"\n"
    (log_dir / "metrics.jsonl").write_bytes(whole + b'{"kind": "metrics", "t": 2.0, "st')
    d = make_daemon(world_size=1, log_dir=log_dir)
    tm = TelemetryClient(d.ingest, rank=0)
    tm.log(1, {"x": 2.0})
    tm.close()
    d.wait_for(lambda recs: any(r.get("step") == 1 for r in recs), kind="metrics")
    assert d.status()["sinks"]["jsonl"]["repaired_bytes"] == len(b'{"kind": "metrics", "t": 2.0, "st')
    assert d.stop() == 0
    data = (log_dir / "metrics.jsonl").read_bytes()
    assert data.startswith(whole) and data.endswith(b"\n")
    assert [r["step"] for r in d.read_jsonl("metrics")] == [0, 1]
    # a second daemon on the same dir appends
    d2 = make_daemon(world_size=1, log_dir=log_dir)
    tm = TelemetryClient(d2.ingest, rank=0)
    tm.log(2, {"x": 3.0})
    tm.close()
    d2.wait_for(lambda recs: any(r.get("step") == 2 for r in recs), kind="metrics")
    assert d2.stop() == 0
    assert [r["step"] for r in d2.read_jsonl("metrics")] == [0, 1, 2]


def test_malformed_input_and_sequence_gaps_are_counted(daemon):
    s = daemon.push()
    s.send(b"\xff\x00garbage")
    s.send(msgspec.msgpack.encode([2, 99, 1, 0, 0, 0, 0, 1, {}]))          # unknown protocol version
    s.send(msgspec.msgpack.encode([2, 1, 1, 0, 0, 0, 0, -5, {}]))          # negative step
    s.send_multipart([b"a", b"b"])                                        # two frames, neither a record
    src = 12345
    for seq, dropped in ((0, 0), (1, 0), (5, 2)):    # seq 2..4 missing: 2 dropped by the client, 1 in transit
        s.send(encode_metrics(src, 0, seq, dropped, time.time_ns(), seq, {"x": 1.0}))
    deadline = time.monotonic() + 120               # a hang detector: the asserts below say what was seen
    while True:
        st = daemon.status()
        if st["records_in"] >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    s.close()
    assert st["records_malformed"] == 5
    assert st["records_in"] == 3
    assert st["records_lost"] == 3                   # (max_seq + 1) - received
    assert st["records_dropped_by_clients"] == 2
    assert st["records_lost_in_transit"] == 1
    assert st["per_rank"]["0"]["lost"] == 3
    assert daemon.proc.poll() is None


def test_pub_sends_topic_and_the_jsonl_bytes(daemon):
    import zmq

    sub = daemon.subscribe(b"metrics", rcvtimeo_ms=200)
    tm = TelemetryClient(daemon.ingest, rank=0)
    # A SUB joins some time after connect() (PUB drops what it sends before): a step a try until
    # one arrives, not a fixed sleep; the deadline is a hang detector.
    deadline = time.monotonic() + 120
    step = 4
    while True:
        tm.log(step, {"train/loss": 1.25})
        try:
            topic, body = sub.recv_multipart()
            break
        except zmq.Again:
            assert time.monotonic() < deadline, f"nothing on PUB within 120 s (logged steps 4..{step})"
            step += 1
    tm.close()
    sub.close()
    assert topic == b"metrics"
    rec = json.loads(body)
    assert 4 <= rec["step"] <= step and rec["values"]["train/loss"] == 1.25
    daemon.stop()
    assert body in daemon.jsonl.read_bytes().splitlines()


def test_status_and_drain_over_the_control_socket(daemon):
    tm = TelemetryClient(daemon.ingest, rank=0)
    tm.log(1, {"train/loss": 1.0})
    tm.close()
    # The three records the client sent (hello, the step, its bye) written: the jsonl sink's queue
    # is then empty, unless the daemon's own record of a tick went in just now (polled again).
    daemon.wait_for(lambda recs: any(r.get("step") == 1 for r in recs) and any(r["kind"] == "bye" for r in recs))
    deadline = time.monotonic() + 60
    while (st := daemon.status())["queued"]["jsonl"] != 0:
        assert time.monotonic() < deadline, st
        time.sleep(0.05)
    for key in ("records_in", "records_malformed", "records_dropped_by_clients", "ranks", "sinks", "uptime_s",
                "queued", "last_step", "steps_out"):
        assert key in st, key
    assert st["ranks"] == [0] and st["last_step"] == 1 and st["uptime_s"] > 0
    assert st["inner_loops"] == hotpath.name()        # the daemon subprocess runs the same ones
    assert {"jsonl", "pub"} <= set(st["sinks"])
    assert daemon.request("nonsense")["ok"] is False
    final = daemon.drain()
    assert final["ok"] and final["drained"] and final["unfinished_sinks"] == []
    assert daemon.proc.returncode == 0
    assert daemon.read_jsonl("daemon")[-1]["values"]["telemetry/records_in"] == st["records_in"]


def test_sigint_drains_like_sigterm(daemon):
    tm = TelemetryClient(daemon.ingest, rank=0)
    for s in range(50):
        tm.log(s, {"train/loss": 1.0})
    tm.close()
    daemon.wait_for(lambda recs: len(recs) >= 1, kind="metrics")
    assert daemon.stop(sig=signal.SIGINT) == 0
    recs = daemon.read_jsonl()
    assert [r["step"] for r in recs if r["kind"] == "metrics"] == list(range(50))
    assert recs[-1]["kind"] == "daemon" and recs[-1]["values"]["telemetry/records_in"] >= 51
