"""Scale-out: node daemons aggregate their ranks and forward to a head daemon over TCP + CURVE.

Loopback stands for the network (127.0.0.1; see docs/multinode.md). Per node, what the head
received plus what the node's forwarder dropped and counted equals what it tried to send."""
from __future__ import annotations

import os

import pytest

from telemetry.daemon.config import ConfigError, load
from testkit import faults


def test_nodes_forward_and_the_head_aggregates_across_nodes(tmp_path):
    # The job runs, its ranks close, and a relaunched job (new processes) goes on for 20 steps.
    r = faults.multinode(tmp_path, num_nodes=2, ranks_per_node=2, rate=20, before_s=1, outage_s=0, after_s=3,
                         relaunch_steps=20)
    assert r["head_world_size"] == 2
    sec = r["head_security"]
    assert sec["curve"] and sec["secured"] == ["remote_ingest"] and sec["auth_allowed"] >= 2
    for node, f in r["per_node"].items():
        assert f["dropped"] == 0 and f["received"] == f["tried"] == f["sent"], (node, f)
    # Cross-node reductions: sum of sums (4 ranks x 4096 tokens), max of max, mean of equal-node means.
    s = r["sample_step"]
    assert s["perf/tokens"] == 4 * 4096 and s["perf/step_time"] == 0.05
    assert 2.5 <= s["train/loss"] < 3.5     # ranks log 1 + x + rank: the mean over ranks 0..3
    # The head keeps the job's goodput ledger from what the nodes forward: both launches (each
    # node announces a launch's start), the first one ended (its ranks' byes, forwarded), not hung
    # until the nodes' own heartbeats stopped; nothing redone (the relaunch went on from the last
    # step); every step's time productive. The head's live ledger is its file's.
    head, nodes, n = r["head_ledger"], r["node_ledgers"], r["steps_per_rank"]
    for led in (head, *nodes):
        b = led["buckets_s"]
        assert led["launches"] == 2 and led["steps"] == n + 20 and led["steps_missing"] == 0, led
        assert sum(b.values()) == pytest.approx(led["wall_s"], abs=1e-6)
        assert b["hang"] == b["redone"] == 0.0 and b["recovery"] > 0, led
        # Every step's step time is 0.05 s on every rank (at the head the slowest node's, also
        # 0.05: the sample step above), but the ranks log ten steps at a time and then sleep: a
        # step is booked from the previous one's record on the job's timeline, so at most that.
        assert 0 < b["productive"] + b["telemetry"] <= (n + 20) * 0.05 + 1e-9, led
        assert all(v >= 0 for v in b.values()), led
    live = r["head_live_goodput"]
    assert live["launches"] == 2 and live["steps"] == head["steps"], live
    assert live["buckets_s"]["productive"] == pytest.approx(head["buckets_s"]["productive"], abs=1e-3)   # status rounds to ms


def _outage_checks(r: dict) -> None:
    for node, f in r["per_node"].items():
        # Exactly once, or counted: received + dropped (by the node) + counted lost (by the head:
        # in flight when the head went) == tried (nothing lost in silence).
        assert f["received"] + f["dropped"] + f["counted_lost"] + f["silent_loss"] == f["tried"], (node, f)
        assert f["silent_loss"] == 0, (node, f)
        # The outage overflowed the bounded buffer, and the buffer held no more than its bound.
        if f["records_during_outage"] > r["max_buffered"] + 5:
            assert f["dropped_during_outage"] > 0, (node, f)
        assert f["buffered"] <= r["max_buffered"] + 5, (node, f)
        assert f["received"] > 0


@pytest.mark.slow
def test_head_outage_short(tmp_path):
    r = faults.multinode(tmp_path, num_nodes=2, ranks_per_node=2, rate=20, before_s=2, outage_s=5,
                         after_s=3, max_buffered=50)
    assert all(f["dropped_during_outage"] > 0 for f in r["per_node"].values())   # 100 records > 50
    _outage_checks(r)


@pytest.mark.slow
def test_head_outage_60s(tmp_path):
    outage_s = float(os.environ.get("TELEMETRY_TEST_OUTAGE_S", "60"))
    r = faults.multinode(tmp_path, num_nodes=3, ranks_per_node=2, rate=10, before_s=2, outage_s=outage_s,
                         after_s=4, max_buffered=200)
    _outage_checks(r)


def test_forward_config_is_validated(tmp_path):
    with pytest.raises(ConfigError, match="beyond loopback"):
        load(None, {"forward.endpoint": "tcp://10.0.0.1:5557", "forward.num_nodes": 2, "forward.node_rank": 1})
    with pytest.raises(ConfigError, match="node_rank"):
        load(None, {"forward.endpoint": "tcp://127.0.0.1:5557", "forward.num_nodes": 2, "forward.node_rank": 2})
    cfg = load(None, {"forward.endpoint": "tcp://127.0.0.1:5557", "forward.num_nodes": 4, "forward.node_rank": 3,
                      "aggregator.world_size": 8})
    assert cfg.aggregator.first_rank == 24      # node 3 of 8 ranks each waits for ranks 24..31
