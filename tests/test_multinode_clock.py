"""Nodes whose clocks are 5 minutes off (issue 33 item 3): the head tells, corrects their times,
and says so. Node 1's daemon and ranks run 300 s behind, node 2's 300 s ahead (time.time shifted
in those processes: testkit/clockshift). Before, node 2 made every head step 300 s late (a step's
time is its latest record's) and the goodput ledger counted 300 s of start-up in a 10 s run."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from testkit.faults import NodeTree, wait_ranks

NODES, RANKS_PER_NODE, RATE, N = 4, 2, 20.0, 200
OFFSETS = {1: -300.0, 2: 300.0}
SHIM = str(Path(__file__).resolve().parent.parent / "testkit" / "clockshift")
# Generous next to the offsets: what a loaded machine adds to a record's way is seconds.
SLACK_S = 30.0


def _shifted(offset_s: float | None) -> dict:
    if offset_s is None:
        return {}
    path = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": SHIM + (os.pathsep + path if path else ""), "TESTKIT_CLOCK_OFFSET_S": str(offset_s)}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    t0 = time.time()
    with NodeTree(tmp_path_factory.mktemp("clocks"), NODES, RANKS_PER_NODE, N, RATE,
                  node_env=lambda i: _shifted(OFFSETS.get(i))) as tree:
        wait_ranks(tree.procs, tree.work / "ranks")
        t1 = time.time()
        end = tree.finish()
        yield {"head": tree.head, "t0": t0, "t1": t1, "finals": end["finals"], "status": end["status"],
               "head_final": end["head_final"]}


def test_each_node_whose_clock_is_off_is_told_once_with_its_offset(run):
    said = [e for e in run["head"].read_jsonl("event") if e["name"] == "clock_offset"]
    assert sorted(e["rank"] for e in said) == sorted(OFFSETS), said
    for e in said:
        assert abs(e["data"]["offset_s"] - OFFSETS[e["rank"]]) < 5, e
    assert sorted(float(v) for v in run["status"]["node_clocks"]["offsets_s"].values()) == \
        pytest.approx(sorted(OFFSETS.values()), abs=5)
    assert run["status"]["node_clocks"]["records_corrected"] > 0


def test_the_heads_times_are_its_own_clocks(run):
    lo, hi = run["t0"] - SLACK_S, run["t1"] + SLACK_S
    head = run["head"]
    steps = head.steps()
    assert sorted(steps) == list(range(N)) and not any(s.get("missing_ranks") for s in steps.values())
    late = {s: r["t"] - run["t1"] for s, r in steps.items() if not lo <= r["t"] <= hi}
    assert not late, f"steps outside the run's wall clock (s past its end): {dict(list(late.items())[:5])}"
    for h in head.read_jsonl("hello"):
        started = h["info"].get("started_at")
        assert started is None or lo <= started <= hi, h
    # The goodput ledger over the run's own wall time, not 300 s of start-up more.
    ledger = [r for r in head.read_jsonl("daemon")][-1]["values"]
    assert ledger["goodput/wall_s"] <= run["t1"] - run["t0"] + SLACK_S, ledger
    assert ledger["goodput/startup_s"] < SLACK_S, ledger


def test_every_node_is_still_exact(run):
    per = run["head_final"]["per_rank"]
    for node, final in run["finals"].items():
        got = per[str(node)]
        assert got["received"] + got["refused"] + got["lost"] == final["sinks"]["forward"]["seq"], (node, got)
        assert got["lost"] == 0
