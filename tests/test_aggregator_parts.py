"""Several records per rank per step (issue 29 item 6): a training step's metrics and its eval
results, two log() calls, each saying parts=2. Whatever the order the ranks' records reach the
daemon in, each step is written once, holding every rank's values of both records reduced across
the ranks, with no missing_ranks; in the Python and the C inner loops.

Before `parts`, a step closed as soon as every rank had sent one record: rank 0's train and eval
records followed by rank 1's train record closed the step with rank 0's eval values alone, and
rank 1's eval record opened a second aggregate of the step that waited for rank 0 until the
timeout and went out with missing_ranks [0]."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import decode, encode_metrics
from telemetry.daemon import hotpath
from telemetry.daemon import loops as python_loops
from telemetry.daemon.aggregator import Aggregator
from telemetry.daemon.config import AggregatorConfig
from aggregator_util import finish_many

ROOT = Path(__file__).resolve().parent.parent
LOOPS = [pytest.param(python_loops, id="python"),
         pytest.param(hotpath.native, id="c",
                      marks=pytest.mark.skipif(hotpath.native is None, reason="the C loops are not built here"))]
TRAIN = ("train/grad_norm", "train/lr")
EVAL = ("eval/score", "eval/ppl")
VALUE = st.floats(-1e6, 1e6, allow_nan=False)


@st.composite
def runs(draw):
    """2-4 ranks over 1-4 neighbouring steps, each step with or without eval; each rank's records
    (its train record, then its eval one, rarely the other way round: only their number counts)
    merged with the other ranks' in any interleaving, cut into batches anywhere."""
    world = draw(st.integers(2, 4))
    first = draw(st.integers(0, 100))
    steps = [(first + i, draw(st.booleans())) for i in range(draw(st.integers(1, 4)))]
    if not any(e for _, e in steps):
        steps[0] = (first, True)
    values = {}
    per_rank = []
    for rank in range(world):
        seq = []
        for step, with_eval in steps:
            parts = 2 if with_eval else 1
            train = values[rank, step, "train"] = {k: draw(VALUE) for k in TRAIN}
            mine = [(step, train, parts)]
            if with_eval:
                ev = values[rank, step, "eval"] = {k: draw(VALUE) for k in EVAL}
                mine.append((step, ev, parts))
                if draw(st.integers(0, 9)) == 0:
                    mine.reverse()
            seq += mine
        per_rank.append(seq)
    # One interleaving: which rank's next record comes next, drawn record by record.
    order, cursors = [], [0] * world
    while any(c < len(per_rank[r]) for r, c in enumerate(cursors)):
        live = [r for r in range(world) if cursors[r] < len(per_rank[r])]
        r = draw(st.sampled_from(live))
        order.append((r, *per_rank[r][cursors[r]]))
        cursors[r] += 1
    cuts = sorted(draw(st.lists(st.integers(0, len(order)), max_size=4)))
    return world, steps, values, order, cuts


def _frames(order: list) -> list:
    """The records as the daemon decodes them, through the wire format."""
    seqs: dict[int, int] = {}
    recs = []
    for rank, step, values, parts in order:
        seq = seqs[rank] = seqs.get(rank, -1) + 1
        recs.append(decode(encode_metrics(100 + rank, rank, seq, 0, 1000 * step + seq, step, values, parts=parts)))
    return recs


@pytest.mark.parametrize("loops", LOOPS)
@settings(max_examples=300, deadline=None)
@given(run=runs())
def test_every_step_is_written_once_with_every_ranks_train_and_eval_values(loops, run):
    world, steps, values, order, cuts = run
    agg = Aggregator(AggregatorConfig(world_size=world, step_timeout_s=3600), loops=loops)
    recs = _frames(order)
    closed, late = [], []
    for lo, hi in zip([0, *cuts], [*cuts, len(recs)]):
        done, came_late = agg.add_many(recs[lo:hi])
        closed += done
        late += came_late
    still_open = sorted(agg.pending)
    closed += agg.flush()
    out = finish_many(agg, closed)
    assert not late, [(r.rank, r.step, r.values) for r in late]
    assert not still_open, f"steps left waiting after every rank sent every record: {still_open}"
    by_step: dict[int, list] = {}
    for rec in out:
        by_step.setdefault(rec["step"], []).append(rec)
    assert sorted(by_step) == [s for s, _ in steps]
    for step, with_eval in steps:
        (rec,) = by_step[step]                  # one aggregate per step, not a train one and an eval one
        assert "missing_ranks" not in rec, rec
        for part, names in (("train", TRAIN), ("eval", EVAL)):
            if part == "eval" and not with_eval:
                continue
            for name in names:
                xs = [values[r, step, part][name] for r in range(world)]
                assert rec["values"][name] == pytest.approx(sum(xs) / world, rel=1e-9, abs=1e-9), (step, name, xs)


@pytest.mark.parametrize("loops", LOOPS)
def test_the_interleaving_of_the_issue(loops):
    """Rank 0's train and eval records, then rank 1's: one aggregate with both ranks' means."""
    agg = Aggregator(AggregatorConfig(world_size=2, step_timeout_s=3600), loops=loops)
    order = [(0, 50, {"train/grad_norm": 1.0}, 2), (0, 50, {"eval/score": 10.0}, 2),
             (1, 50, {"train/grad_norm": 3.0}, 2), (1, 50, {"eval/score": 30.0}, 2)]
    closed, late = agg.add_many(_frames(order))
    out = finish_many(agg, closed)
    assert not late and not agg.pending
    assert [(r["step"], r["values"]["train/grad_norm"], r["values"]["eval/score"], r.get("missing_ranks"))
            for r in out] == [(50, 2.0, 20.0, None)]


@pytest.mark.parametrize("loops", LOOPS)
def test_a_rank_that_never_sends_its_second_part_is_missing_and_its_late_part_is_its_own(loops):
    """Rank 1 said parts=2 and sent one: when the next step closes the step, rank 1 is named in
    missing_ranks (its step is not complete), and its record arriving after is late (written as
    its own record, counted), not the start of a second aggregate."""
    agg = Aggregator(AggregatorConfig(world_size=2, step_timeout_s=3600), loops=loops)
    order = [(0, 4, {"train/grad_norm": 1.0}, 2), (0, 4, {"eval/score": 1.0}, 2), (1, 4, {"train/grad_norm": 3.0}, 2),
             (0, 5, {"train/grad_norm": 1.0}, 1), (1, 5, {"train/grad_norm": 1.0}, 1)]
    recs = _frames(order)
    closed, late = agg.add_many(recs)
    out = finish_many(agg, closed)
    assert [(r["step"], r.get("missing_ranks")) for r in out] == [(4, [1]), (5, None)]
    assert out[0]["values"]["train/grad_norm"] == 2.0
    _, late = agg.add_many(_frames([(1, 4, {"eval/score": 3.0}, 2)]))
    assert len(late) == 1 and agg.num_records_late == 1 and not agg.pending


@pytest.mark.slow
def test_the_trainer_on_2_ranks_writes_each_eval_step_once_with_both_ranks(make_daemon, tmp_path):
    """The trainer itself, 2 gloo ranks under torchrun, eval every 2 steps: metrics.jsonl holds
    one record per step, and at an eval step it holds the eval values of both ranks reduced
    (per_rank records give each rank's own values to check against)."""
    steps = 6
    d = make_daemon(world_size=2, config={"aggregator": {"per_rank": True, "step_timeout_s": 600},
                                          "pollers": {"nvml_enabled": False}})
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            "-m", "trainer.train", "--config", str(ROOT / "launch" / "configs" / "tiny.yaml"),
            f"run_dir={tmp_path / 'run'}", f"steps={steps}", "log_every=1", "eval.every_steps=2",
            "checkpoint.every_steps=0", "checkpoint.save_final=false", "engine.backend=ddp",
            "engine.zero_stage=0", f"telemetry_endpoint={d.ingest}"]
    p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-4000:]
    recs = d.wait_for(lambda rs: sum(r["kind"] == "metrics" and "rank" not in r for r in rs) >= steps)
    d.drain()
    recs = [json.loads(line) for line in Path(d.log_dir, "metrics.jsonl").read_text().splitlines()]
    agg = [r for r in recs if r["kind"] == "metrics" and "rank" not in r]
    own = [r for r in recs if r["kind"] == "metrics" and "rank" in r]
    assert sorted(r["step"] for r in agg) == list(range(1, steps + 1)), [(r["step"], sorted(r["values"])[:3]) for r in agg]
    for rec in agg:
        assert "missing_ranks" not in rec, rec
        evals = sorted(k for k in rec["values"] if k.startswith("eval/"))
        assert bool(evals) == (rec["step"] % 2 == 0), (rec["step"], evals)
        for name in evals:
            if not name.endswith("/loss"):
                continue
            tokens = name[:-len("loss")] + "tokens"
            mine = [(r["values"][name], r["values"][tokens]) for r in own if r["step"] == rec["step"]
                    and name in r["values"]]
            assert len(mine) == 2, (rec["step"], name, mine)
            weighted = sum(x * n for x, n in mine) / sum(n for _, n in mine)
            assert rec["values"][tokens] == sum(n for _, n in mine)
            assert rec["values"][name] == pytest.approx(weighted, rel=1e-6), (rec["step"], name, mine)
