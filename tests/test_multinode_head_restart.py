"""A head SIGKILLed mid-run and restarted on its log directory (issue 33 item 3): per node, what
the head's metrics.jsonl holds of it plus what the head counts lost is exactly what the node's
forwarder sent, no over-count; and `status` gives the run's totals across the two heads.

Before, the head's checkpoint (sources.json, once a second) counted what had arrived, not what
was written: lines written after it were counted lost by the next head as well (over-count), and
records in open steps when it died were counted arrived though never written. Now the checkpoint
is written by the JSONL sink once the lines it counts are, with the offset they end at, and a
restarted head moves aside what was written past it (counted lost)."""
from __future__ import annotations

import pytest

from testkit.faults import NodeTree, wait_until

NODES, RANKS_PER_NODE, RATE, N = 2, 2, 20.0, 300


def written_per_node(records: list[dict]) -> dict[int, int]:
    """Each node's records in the head's lines: one per aggregated step it is not missing from,
    its own (late) step records, its hellos, events (they carry its node_rank) and its bye."""
    out = dict.fromkeys(range(NODES), 0)
    for r in records:
        kind, rank = r["kind"], r.get("rank")
        if kind == "metrics" and rank is None:
            for n in set(range(NODES)) - set(r.get("missing_ranks", [])):
                out[n] += 1
        elif kind == "metrics" or kind == "bye":
            out[rank] += 1
        elif kind == "hello" and r["info"].get("forwarded_by") == "node daemon":
            out[rank] += 1
        elif kind == "event" and r["data"].get("node_rank") == rank and rank in out:
            out[rank] += 1
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    heartbeats = {"forward": {"heartbeat_ivl_s": 0.5, "heartbeat_timeout_s": 2.0}}
    with NodeTree(tmp_path_factory.mktemp("head-restart"), NODES, RANKS_PER_NODE, N, RATE,
                  node_config=lambda i: heartbeats) as tree:

        def received() -> dict:
            return {i: tree.head.status()["per_rank"].get(str(i), {}).get("received", 0) for i in range(NODES)}

        wait_until("the first head taking in 60 records of each node", lambda: min(received().values()) >= 60,
                   received, period_s=0.05)
        tree.restart_head()              # SIGKILL, then the same directory and endpoints
        end = tree.finish()
        yield {"head": tree.head, "finals": end["finals"], "head_final": end["head_final"]}


def test_written_plus_counted_lost_is_what_each_node_sent_exactly(run):
    written = written_per_node(run["head"].read_jsonl())
    per = run["head_final"]["per_rank"]
    for node, final in run["finals"].items():
        tried = final["sinks"]["forward"]["seq"]
        assert final["sinks"]["forward"]["dropped"] == 0
        # (refused: shed at the head's intake or unread at its drain, counted lost there too)
        assert written[node] + per[str(node)]["lost"] + per[str(node)]["refused"] == tried, \
            (node, written[node], per[str(node)], tried)


def test_status_gives_the_runs_totals_across_the_two_heads(run):
    final = run["head_final"]
    r = final["run"]
    assert r["incarnations"] == 2
    assert r["records_in"] == sum(written_per_node(run["head"].read_jsonl()).values())
    assert r["records_in"] > final["records_in"]                # the first head's count is in it
    assert r["records_lost"] == final["records_lost"] == sum(p["lost"] for p in final["per_rank"].values())
    assert r["steps_out"] == len(run["head"].read_jsonl("metrics", aggregated=True))
    moved = r["restart"].get("moved_lines")
    if moved:                   # what the first head wrote past its last checkpoint: kept aside
        assert len(open(r["restart"]["moved_to"], "rb").read().splitlines()) == moved
