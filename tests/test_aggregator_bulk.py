"""A batch of closed steps (a StepBatch: one column per metric) reduces to what the plain
definition gives step by step (mean, sum, max, min, last of the values the ranks logged; one
value kept as it is; the straggler view), in the order the steps were closed, uniform steps and
the others alike; and the MFU of a batch's steps is each step's own."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from telemetry.daemon.aggregator import Aggregator
from telemetry.daemon.config import AggregatorConfig
from mfu_util import step_metrics
from telemetry.daemon.mfu import MfuEstimator
from aggregator_util import finish_many


def derived_for(batch, recs, world: int) -> list:
    """What the daemon adds to the records of a batch (derived.py); the derivations that failed."""
    from telemetry.daemon.config import MfuConfig
    from telemetry.daemon.derived import Derived

    return Derived(MfuConfig()).apply(batch, [r["values"] for r in recs], world)

KEYS = ("train/loss", "perf/tokens", "perf/step_time", "memory/max_allocated_gb", "custom/n_count", "train/lr")
NUMBER = st.one_of(st.floats(-1e6, 1e6, allow_nan=False), st.integers(-10**6, 10**6), st.booleans())
VALUE = st.one_of(NUMBER, NUMBER, NUMBER, st.none())


def _close(agg: Aggregator, steps: list[dict[int, dict]]):
    """Feed whole steps (rank -> values) through add_many; return the closed accumulators."""
    recs = [_Rec(rank, step, step * 10 + rank, values) for step, rows in enumerate(steps) for rank, values in rows.items()]
    done, late = agg.add_many(recs)
    assert not late
    return done


class _Rec:
    parts = 1       # one record per rank per step (the protocol's default)

    def __init__(self, rank, step, t_ns, values):
        self.rank, self.step, self.t_ns, self.values = rank, step, t_ns, values


# The rules the batch below is reduced with, written out by hand.
RULES = {"train/loss": "mean", "perf/tokens": "sum", "perf/step_time": "max", "memory/max_allocated_gb": "max",
         "custom/n_count": "sum", "train/lr": "last"}
PLAIN = {"mean": lambda xs: sum(xs) / len(xs), "sum": sum, "max": max, "last": lambda xs: xs[-1]}


def _one_at_a_time(rows: dict[int, dict]) -> dict:
    """The plain definition of one step's record values."""
    values = {}
    for name in dict.fromkeys(k for row in rows.values() for k in row):
        xs = [row[name] for row in rows.values() if row.get(name) is not None]
        values[name] = None if not xs else xs[0] if len(xs) == 1 else PLAIN[RULES[name]](xs)
    timed = [(row["perf/step_time"], rank) for rank, row in rows.items() if row.get("perf/step_time") is not None]
    if timed:
        times = [t for t, _ in timed]
        values["perf/step_time_max"] = max(times)
        values["perf/step_time_min"] = min(times)
        values["perf/slowest_rank"] = timed[times.index(max(times))][1]
    return values


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b and type(a) is type(b)


@st.composite
def batches(draw):
    world = draw(st.integers(1, 5))
    num_steps = draw(st.integers(1, 12))
    steps = []
    for _ in range(num_steps):
        shuffle = draw(st.booleans())
        keys = draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=len(KEYS), unique=True))
        rows = {}
        for rank in draw(st.permutations(range(world))):
            ks = draw(st.permutations(keys)) if shuffle else keys
            uniform_values = draw(st.booleans())
            rows[rank] = {k: draw(NUMBER if uniform_values else VALUE) for k in ks}
        steps.append(rows)
    return world, steps


@settings(max_examples=300, deadline=None)
@given(batches())
def test_bulk_reduction_equals_one_step_at_a_time(case):
    world, steps = case
    agg = Aggregator(AggregatorConfig(world_size=world, reductions={"train/lr": "last"}))
    done = _close(agg, steps)
    assert [acc.step for acc in done] == list(range(len(steps)))
    recs = finish_many(agg, done, only=("step time view",))
    for step, (rows, rec) in enumerate(zip(steps, recs)):
        want = _one_at_a_time(rows)
        assert rec["step"] == step and "missing_ranks" not in rec
        got = rec["values"]
        assert list(got) == list(want)
        for k in want:
            assert _same(got[k], want[k]), (k, got[k], want[k], rows)


def test_a_batch_of_uniform_steps_is_grouped_and_keeps_its_order():
    agg = Aggregator(AggregatorConfig(world_size=2))
    steps = []
    for s in range(6):
        a = {"train/loss": 1.0 + s, "perf/step_time": 0.5, "perf/tokens": 100}
        b = {"train/loss": 3.0 + s, "perf/step_time": 0.7, "perf/tokens": 300}
        if s == 3:                                   # rank 1 logs its keys in another order
            b = dict(reversed(list(b.items())))
        steps.append({0: a, 1: b})
    done = _close(agg, steps)
    batch, recs = agg.finish_batch(done)
    assert not derived_for(batch, recs, 2)
    assert [r["step"] for r in recs] == list(range(6))
    for s, r in enumerate(recs):
        v = r["values"]
        assert v["train/loss"] == 2.0 + s and v["perf/tokens"] == 400 and type(v["perf/tokens"]) is int
        assert v["perf/step_time"] == v["perf/step_time_max"] == 0.7 and v["perf/step_time_min"] == 0.5
        assert v["perf/slowest_rank"] == 1
    # One shape for every step: per metric, per step, one value per rank (in order of first report).
    assert batch.ranks == [(0, 1)] * 6 and batch.steps == list(range(6))
    assert batch.columns["perf/tokens"] == [(100, 300)] * 6 and batch.columns["perf/step_time"] == [(0.5, 0.7)] * 6
    assert batch.column("perf/attn_doc_len_sq") == [None] * 6


def test_a_value_that_is_not_a_number_sends_the_group_one_step_at_a_time():
    agg = Aggregator(AggregatorConfig(world_size=2))
    steps = [{0: {"x": 1.0, "perf/tokens": 2}, 1: {"x": 3.0, "perf/tokens": 4}},
             {0: {"x": None, "perf/tokens": 2}, 1: {"x": 5.0, "perf/tokens": 4}}]
    recs = finish_many(agg, _close(agg, steps))
    assert recs[0]["values"] == {"x": 2.0, "perf/tokens": 6}
    assert recs[1]["values"] == {"x": 5.0, "perf/tokens": 6}      # the None is left out, as step by step


LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 128, "tie_word_embeddings": False}
POSITIVE = st.one_of(st.floats(1e-3, 1e6), st.integers(1, 10**6))
ODD = st.one_of(POSITIVE, POSITIVE, POSITIVE, st.just(0), st.none(), st.just(math.inf), st.floats(-5, 0))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mfu_of_a_batch_is_each_steps_own(data):
    from telemetry.daemon.config import MfuConfig
    from telemetry.daemon.derived import Derived

    hello = {"model": {"hf_config": LLAMA, "seq_len": data.draw(st.sampled_from([0, 16])),
                       "gradient_checkpointing": data.draw(st.booleans())},
             "device_name": data.draw(st.sampled_from(["NVIDIA H100 80GB HBM3", "cpu"]))}
    est = MfuEstimator.from_hello(hello)
    derived = Derived(MfuConfig())
    derived.on_hello(hello)
    value = POSITIVE if data.draw(st.booleans()) else ODD
    with_sq = data.draw(st.booleans())
    steps = []
    for _ in range(data.draw(st.integers(1, 8))):
        rows = {}
        for rank in range(data.draw(st.integers(1, 4))):
            row = {"perf/tokens": data.draw(value), "perf/step_time": data.draw(value)}
            if with_sq:
                row["perf/attn_doc_len_sq"] = data.draw(value)
            rows[rank] = {k: v for k, v in row.items() if data.draw(st.integers(0, 9)) or k != "perf/step_time"}
        steps.append(rows)
    world = data.draw(st.sampled_from([1, 4, 6]))
    agg = Aggregator(AggregatorConfig(world_size=10))    # never complete: every step goes out at the flush
    batch, recs = agg.finish_batch(_close_each(agg, steps))
    values = [rec["values"] for rec in recs]
    derived.apply(batch, values, world)
    for rows, v in zip(steps, values):
        want = step_metrics(est, rows, world)
        got = {k: v[k] for k in v if k in ("perf/model_flops_per_second", "perf/mfu", "perf/mfu_percent", "perf/hfu")}
        assert got.keys() == want.keys()
        for k in want:
            assert got[k] == pytest.approx(want[k], rel=1e-9)


def _close_each(agg: Aggregator, steps: list[dict]) -> list:
    """Every step closed, with all its records."""
    recs = [_Rec(rank, step, step, values) for step, rows in enumerate(steps) for rank, values in rows.items()]
    done, _ = agg.add_many(recs)
    assert not done
    return agg.flush()


def test_a_steps_derived_metrics_are_added_as_its_record_is_made():
    """finish_batch hands the batch and each step's reduced values to `derive` (the daemon's
    derived metrics) before it makes the records: they come out with their derived metrics, the
    values `derive` was given, never records edited after they were made."""
    from telemetry.daemon.config import MfuConfig
    from telemetry.daemon.derived import Derived

    agg = Aggregator(AggregatorConfig(world_size=10))
    steps = [{0: {"perf/step_time": 0.5, "perf/tokens": 100}, 1: {"perf/step_time": 0.25, "perf/tokens": 100}},
             {0: {"perf/step_time": 2.0, "perf/tokens": 50}}]
    given_values = []

    def derive(batch, values) -> None:
        given_values.extend(values)
        assert not Derived(MfuConfig()).apply(batch, values, 2)

    _, recs = agg.finish_batch(_close_each(agg, steps), derive)
    assert [rec["values"] for rec in recs] == given_values and all(
        rec["values"] is v for rec, v in zip(recs, given_values))
    assert [rec["values"]["perf/steps_per_second"] for rec in recs] == [2.0, 0.5]
    assert [rec["values"]["perf/tokens_per_second"] for rec in recs] == [400.0, 25.0]
