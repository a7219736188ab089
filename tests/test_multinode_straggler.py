"""A slow rank named end to end across nodes (issue 33 item 4): its node daemon names the rank
and the phase, the head names the node and passes the node's finding on with the rank; a node
whose every rank is slow is named as a node (its own daemon sees no rank stand out); no one is
accused in the balanced steps before. One slow rank among a node's 8 (the usual node) moves the
node's mean by an eighth of its excess: the head compares the nodes' slowest ranks, which each
node forwards. Phase timings are what the ranks report (synthetic, the
same on every rank but the slow ones), so a loaded machine changes nothing the rules see."""
from __future__ import annotations

import pytest

from testkit import faults

NODES, SLOW_FROM, N = 4, 200, 240
# Named within this many log steps of the slowdown: straggler_consecutive (8), and one for the
# step the rule sees it first.
WITHIN = 10


@pytest.mark.parametrize("ranks_per_node, slow_ranks, slow_node", [(8, (21,), 2), (2, (6, 7), 3)],
                         ids=["one_rank_of_8", "whole_node"])
def test_a_slow_rank_and_a_slow_node_are_named_end_to_end(tmp_path, ranks_per_node, slow_ranks, slow_node):
    r = faults.multinode_straggler(tmp_path, num_nodes=NODES, ranks_per_node=ranks_per_node, n=N,
                                   slow_from=SLOW_FROM, slow_ranks=slow_ranks)
    assert len(r["head_steps"]) == N and all("missing_ranks" not in s for s in r["head_steps"].values())
    # No false accusation: nothing named before the slowdown, on any node or at the head.
    every = [e for f in r["node_findings"].values() for e in f] + r["head_findings"]
    assert all(e["data"]["step"] >= SLOW_FROM for e in every), every
    node_own = r["node_findings"][slow_node]
    if len(slow_ranks) == 1:
        # The node names the rank and the phase ...
        (rank,) = slow_ranks
        assert len(node_own) == 1, node_own
        e = node_own[0]
        assert e["data"]["slowest_rank"] == rank and e["data"]["phase"] == "forward"
        assert f"rank {rank} is slow in forward" in e["data"]["message"]
        assert e["data"]["step"] < SLOW_FROM + WITHIN, e
        # ... and the head receives it with the rank and the node.
        passed = [e for e in r["head_findings"] if e["data"].get("node_rank") == slow_node and "unit" not in e["data"]]
        assert len(passed) == 1 and passed[0]["data"]["rank"] == rank and passed[0]["data"]["slowest_rank"] == rank
    else:
        assert node_own == []          # its ranks are equally slow: none stands out on the node
    assert all(r["node_findings"][i] == [] for i in range(NODES) if i != slow_node), r["node_findings"]
    # The head names the node, in its own words.
    own = [e for e in r["head_findings"] if e["data"].get("unit") == "node"]
    assert len(own) == 1, own
    e = own[0]
    assert e["rank"] == slow_node and e["data"]["slowest_rank"] == slow_node and e["data"]["phase"] == "forward"
    assert f"node {slow_node} is slow in forward" in e["data"]["message"] and "rank" not in e["data"]["message"].split(":")[1]
    assert e["data"]["step"] < SLOW_FROM + WITHIN, e
