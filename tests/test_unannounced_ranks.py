"""Records of ranks no hello announced (world.py), forged by another local user over loopback TCP
as the wire format allows: they never enlarge the world a step waits for or names missing, what
is kept of them is bounded and counted, and a restarted daemon still waits for the ranks whose
hellos went to its predecessor. Real daemons, real sockets, a real client."""
from __future__ import annotations

import json
import time

import zmq

from protocol import encode_metrics
from telemetry import TelemetryClient
from telemetry.daemon.continuity import SOURCES_FILE
from telemetry.daemon.world import MAX_UNANNOUNCED_RANKS

NUM_FORGED = 3000          # ranks never announced, one record each
NUM_STEPS = 30
# What the forged records may add to the daemon's memory: generous (its records, their sources'
# accounting); the world they made before grew every step's record by their number.
RSS_GROWTH_MAX_MB = 120


def _rss_mb(pid: int, field: str = "VmRSS") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} for pid {pid}")


def _forge(push: zmq.Socket, ranks: range, steps: range) -> None:
    """One metrics record per rank, as a stranger makes them: its own src per rank, steps in turn."""
    for i, rank in enumerate(ranks):
        push.send(encode_metrics(10_000 + rank, rank, 0, 0, time.time_ns(), steps[i % len(steps)], {"forged/x": 9.0}))


def test_ranks_no_hello_announced_neither_grow_the_world_nor_the_daemon(make_daemon):
    d = make_daemon(transport="tcp", config={"aggregator": {"step_timeout_s": 1.0}})
    tm = TelemetryClient(d.ingest, rank=0)
    d.wait_for(lambda recs: len(recs) >= 1, kind="hello")      # rank 0 is announced
    rss_before = _rss_mb(d.proc.pid)
    push = d.push()
    _forge(push, range(1, 1 + NUM_FORGED), range(NUM_STEPS))
    for step in range(NUM_STEPS):
        tm.log(step, {"train/loss": 1.0})
    tm.close()
    d.wait_for(lambda recs: NUM_STEPS - 1 in {r.get("step") for r in recs if "rank" not in r}, kind="metrics")
    steps = d.read_jsonl("metrics", aggregated=True)
    assert sorted(r["step"] for r in steps) == list(range(NUM_STEPS))
    assert all(set(r.get("missing_ranks", ())) <= {0} for r in steps), \
        f"missing_ranks up to {max(len(r.get('missing_ranks', ())) for r in steps)} long"
    assert all(r["values"]["train/loss"] == 1.0 for r in steps)
    deadline = time.monotonic() + 60
    while (st := d.status()).get("records_unannounced", 0) + st.get("records_unannounced_refused", 0) < NUM_FORGED:
        assert time.monotonic() < deadline, {k: v for k, v in st.items() if "announced" in k}
        time.sleep(0.1)
    rss_growth = _rss_mb(d.proc.pid, "VmHWM") - rss_before
    final = d.drain()
    push.close()
    # The first MAX_UNANNOUNCED_RANKS strangers' records are taken (in their steps or, late, as their
    # own records); the rest refused; every one counted, in status, drain.json and the daemon record.
    assert final["records_unannounced"] == MAX_UNANNOUNCED_RANKS
    assert final["records_unannounced_refused"] == NUM_FORGED - MAX_UNANNOUNCED_RANKS
    assert final["ranks_unannounced"] == MAX_UNANNOUNCED_RANKS and final["ranks"] == [0]
    on_file = json.loads((d.log_dir / "drain.json").read_text())
    assert on_file["records_unannounced_refused"] == NUM_FORGED - MAX_UNANNOUNCED_RANKS
    last = d.read_jsonl("daemon")[-1]["values"]
    assert last["telemetry/records_unannounced"] + last["telemetry/records_unannounced_refused"] == NUM_FORGED
    assert rss_growth < RSS_GROWTH_MAX_MB, f"the daemon grew by {rss_growth:.0f} MB"


def test_a_restarted_daemon_waits_for_the_ranks_its_predecessor_was_announced(make_daemon, monkeypatch):
    """Ranks whose hellos went to a daemon SIGKILLed since: its successor on the log directory
    (sources.json) waits for them at every step, and not for a stranger's ranks."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    d1 = make_daemon(config={"aggregator": {"step_timeout_s": 30.0}})
    clients = [TelemetryClient(d1.ingest, rank=r) for r in (0, 1)]
    for step in range(3):
        for r, c in enumerate(clients):
            c.log(step, {"train/loss": float(r)})
    d1.wait_for(lambda recs: 2 in {r.get("step") for r in recs if "rank" not in r}, kind="metrics")
    deadline = time.monotonic() + 60
    while json.loads((d1.log_dir / SOURCES_FILE).read_text()).get("run", {}).get("steps_out", 0) < 3:
        assert time.monotonic() < deadline, "no checkpoint of the three steps"
        time.sleep(0.05)
    d1.kill()
    d2 = make_daemon(log_dir=d1.log_dir, endpoints=(d1.ingest, d1.pub, d1.control),
                     config={"aggregator": {"step_timeout_s": 30.0}})
    push = d2.push()
    _forge(push, range(100, 100 + 2000), range(10, 15))
    # Every stranger's record in before the ranks log: the steps have them when they open (on
    # connections of their own, some could otherwise come after their step closed: late).
    deadline = time.monotonic() + 120
    while (st := d2.status()).get("records_unannounced", 0) + st.get("records_unannounced_refused", 0) < 2000:
        assert time.monotonic() < deadline, st
        time.sleep(0.05)
    for step in range(10, 15):
        for r, c in enumerate(clients):
            c.log(step, {"train/loss": float(r)})
    d2.wait_for(lambda recs: 14 in {r.get("step") for r in recs if "rank" not in r}, kind="metrics")
    for c in clients:
        c.close()
    final = d2.drain()
    push.close()
    steps = {r["step"]: r for r in d2.read_jsonl("metrics", aggregated=True) if r["step"] >= 10}
    assert sorted(steps) == list(range(10, 15))
    assert all("missing_ranks" not in r and r["values"]["train/loss"] == 0.5 for r in steps.values()), steps
    assert final["records_late"] == 0 and final["steps_incomplete"] == 0
    assert final["records_unannounced"] + final["records_unannounced_refused"] == 2000
