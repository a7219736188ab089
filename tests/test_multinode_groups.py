"""One level more for jobs one head cannot hold (issue 33): node daemons -> group heads -> the
job's head, each link TCP + CURVE on loopback. Exact at every level, the job's reductions
across all ranks, and who said what (rank, node, group) passed up unchanged."""
from __future__ import annotations

import pytest

from telemetry.shared.goodput import ledger
from testkit import faults

GROUPS, NODES_PER_GROUP, RANKS_PER_NODE, N = 2, 2, 2, 60


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return faults.group_tree(tmp_path_factory.mktemp("tree"), num_groups=GROUPS, nodes_per_group=NODES_PER_GROUP,
                             ranks_per_node=RANKS_PER_NODE, n=N)


def test_every_link_is_exact(tree):
    for i, f in tree["node_finals"].items():             # node -> its group head
        fwd = f["sinks"]["forward"]
        got = tree["group_finals"][i // NODES_PER_GROUP]["per_rank"][str(i)]
        assert fwd["dropped"] == 0 and fwd["sent"] == fwd["seq"], (i, fwd)
        assert got["received"] == fwd["seq"] and got["lost"] == got["refused"] == 0, (i, got, fwd)
    for g, f in tree["group_finals"].items():            # group head -> the job head
        fwd = f["sinks"]["forward"]
        got = tree["job_final"]["per_rank"][str(g)]
        assert fwd["dropped"] == 0 and fwd["sent"] == fwd["seq"] and fwd["curve"], (g, fwd)
        assert got["received"] == fwd["seq"] and got["lost"] == got["refused"] == 0, (g, got, fwd)
        assert f["records_lost"] == 0, f
    assert tree["job_final"]["records_lost"] == 0


def test_the_job_heads_steps_reduce_every_rank_of_the_job(tree):
    world = GROUPS * NODES_PER_GROUP * RANKS_PER_NODE
    steps = tree["job_steps"]
    assert sorted(steps) == list(range(N))
    for s, rec in steps.items():
        v = rec["values"]
        assert "missing_ranks" not in rec and not rec.get("late"), rec
        # Sums of sums of sums, max of max of max, and the mean of equal groups' means of equal
        # nodes' means: the mean over every rank (a rank logs 1 + x + rank).
        assert v["perf/tokens"] == world * 4096 and v["perf/step_time"] == 0.05, (s, v)
        assert v["train/loss"] == pytest.approx(1.0 + (s % 97) / 97 + (world - 1) / 2, rel=1e-12), (s, v)
    # Each step once in the job head's file.
    assert len([r for r in tree["job_records"] if r["kind"] == "metrics" and "rank" not in r]) == N


def test_who_said_what_reaches_the_job_head(tree):
    ev = tree["job_events"]
    byes = sorted((e["data"]["rank"], e["data"]["node_rank"], e["data"]["group_rank"]) for e in ev
                  if e["name"] == "rank_bye")
    world = GROUPS * NODES_PER_GROUP * RANKS_PER_NODE
    assert byes == [(r, r // RANKS_PER_NODE, r // (RANKS_PER_NODE * NODES_PER_GROUP)) for r in range(world)]
    node_byes = sorted((e["data"]["node_rank"], e["data"]["group_rank"]) for e in ev if e["name"] == "node_bye")
    assert node_byes == [(i, i // NODES_PER_GROUP) for i in range(GROUPS * NODES_PER_GROUP)]
    for e in ev:
        if e["name"] == "node_daemon":          # a node's heartbeat keeps its node and gains its group
            assert e["data"]["group_rank"] == e["data"]["node_rank"] // NODES_PER_GROUP, e
    hellos = {h["rank"]: h["info"] for h in tree["job_hellos"]}
    assert sorted(hellos) == list(range(GROUPS))
    for g, info in hellos.items():
        assert info["forwarded_by"] == "group head" and info["group_rank"] == g and info["num_groups"] == GROUPS
        assert info["world_size"] == GROUPS and info["nodes_per_group"] == NODES_PER_GROUP
        assert info["num_nodes"] == GROUPS * NODES_PER_GROUP and info["ranks_per_node"] == RANKS_PER_NODE
        assert info["global_world_size"] == world and "node_rank" not in info
    # The job head's findings would name groups, a group head's nodes.
    assert tree["job_final"]["sinks"]["diagnosis"]["unit"] == "group"
    assert all(f["sinks"]["diagnosis"]["unit"] == "node" for f in tree["group_finals"].values())


def test_the_job_heads_ledger_ends_at_the_ranks_not_at_the_daemons(tree):
    recs = tree["job_records"]
    led = ledger(recs)
    assert led["launches"] == 1 and led["steps"] == N and led["steps_missing"] == 0, led
    # A node's end (node_bye, when its daemon drained after its ranks were gone) and a group
    # head's own records are the daemons', not the job's: the wall is the ranks' alone (the
    # last rank's bye, as its node forwarded it).
    # Nor is the end of a forwarder's link (a group head's bye, when it drained).
    ranks_only = [r for r in recs if not (r["kind"] == "event" and r["name"].startswith(("node_", "group_")))
                  and not (r["kind"] == "bye" and "forwarded_by" in r["stats"])]
    assert len(ranks_only) < len(recs) - GROUPS
    assert led["wall_s"] == pytest.approx(ledger(ranks_only)["wall_s"], abs=1e-9), led


def test_a_group_heads_hello_speaks_for_its_nodes():
    # No sockets: what a group head says of itself, from one of its nodes' hellos.
    from telemetry.daemon.sinks.forward import ForwardConfig, ForwardSink

    node_hello = {"host": "n5", "rank": 5, "node_rank": 5, "num_nodes": 8, "world_size": 8, "ranks_per_node": 4,
                  "global_world_size": 32, "forwarded_by": "node daemon", "peak_flops": 4 * 989.4e12,
                  "src": 77, "pid": 12, "run_name": "r", "started_at": 1.5e9}
    sink = ForwardSink(ForwardConfig(endpoint="tcp://127.0.0.1:1", node_rank=1, num_nodes=2), relay=True)
    info = sink._node_info(node_hello)
    assert info["rank"] == info["group_rank"] == 1 and info["num_groups"] == info["world_size"] == 2
    assert info["nodes_per_group"] == 4 and info["forwarded_by"] == "group head" and info["src"] == sink.src
    # The job head's MFU divides by one "device" a group: a node's peak x nodes in a group.
    assert info["peak_flops"] == 4 * 989.4e12 * 4
    assert info["num_nodes"] == 8 and info["global_world_size"] == 32 and info["run_name"] == "r"
    assert "node_rank" not in info and "pid" not in info
    for bad in (float("nan"), float("inf"), True, "1e15", -1.0):   # a node's peak is input from the network
        assert "peak_flops" not in sink._node_info({**node_hello, "peak_flops": bad}), bad
