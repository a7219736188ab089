"""The bulk reduction (steps whose ranks logged the same keys in the same order, reduced a metric
at a time across the whole batch) gives what the one-step-at-a-time path gives, in the order the
steps were closed; and MFU for a batch of steps equals MFU step by step."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from telemetry.daemon.aggregator import Aggregator
from telemetry.daemon.config import AggregatorConfig
from telemetry.mfu import MfuEstimator

KEYS = ("train/loss", "perf/tokens", "perf/step_time", "memory/max_allocated_gb", "custom/n_count", "train/lr")
NUMBER = st.one_of(st.floats(-1e6, 1e6, allow_nan=False), st.integers(-10**6, 10**6), st.booleans())
VALUE = st.one_of(NUMBER, NUMBER, NUMBER, st.none())


def _close(agg: Aggregator, steps: list[dict[int, dict]]):
    """Feed whole steps (rank -> values) through add_many, with one key-order object per order,
    as the receiver hands them; return the closed accumulators."""
    orders: dict[tuple, tuple] = {}
    recs, keys = [], []
    for step, rows in enumerate(steps):
        for rank, values in rows.items():
            recs.append(_Rec(rank, step, step * 10 + rank, values))
            keys.append(orders.setdefault(tuple(values), tuple(values)))
    done, late = agg.add_many(recs, keys)
    assert not late
    return done


class _Rec:
    def __init__(self, rank, step, t_ns, values):
        self.rank, self.step, self.t_ns, self.values = rank, step, t_ns, values


def _one_at_a_time(agg: Aggregator, acc) -> dict:
    rows = list(acc.by_rank.values())
    values = dict(rows[0]) if len(rows) == 1 else agg._reduce_general(rows)
    return agg._straggle(acc, values)


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
    expected = [_one_at_a_time(Aggregator(AggregatorConfig(world_size=world, reductions={"train/lr": "last"})), acc)
                for acc in done]
    recs = agg.finish_many(done)
    for acc, rec, want in zip(done, recs, expected):
        assert rec["step"] == acc.step and "missing_ranks" not in rec
        got = rec["values"]
        assert list(got) == list(want) or set(got) == set(want)
        for k in want:
            assert _same(got[k], want[k]), (k, got[k], want[k], acc.by_rank)


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
    assert [acc.uniform for acc in done] == [True, True, True, False, True, True]
    recs = agg.finish_many(done)
    assert [r["step"] for r in recs] == list(range(6))
    for s, r in enumerate(recs):
        v = r["values"]
        assert v["train/loss"] == 2.0 + s and v["perf/tokens"] == 400 and type(v["perf/tokens"]) is int
        assert v["perf/step_time"] == v["perf/step_time_max"] == 0.7 and v["perf/step_time_min"] == 0.5
        assert v["perf/slowest_rank"] == 1
    assert done[0].cols == ((100, 300), None, (0.5, 0.7))     # for MFU: tokens, sum L^2, step times


def test_a_value_that_is_not_a_number_sends_the_group_one_step_at_a_time():
    agg = Aggregator(AggregatorConfig(world_size=2))
    steps = [{0: {"x": 1.0, "perf/tokens": 2}, 1: {"x": 3.0, "perf/tokens": 4}},
             {0: {"x": None, "perf/tokens": 2}, 1: {"x": 5.0, "perf/tokens": 4}}]
    recs = agg.finish_many(_close(agg, steps))
    assert recs[0]["values"] == {"x": 2.0, "perf/tokens": 6}
    assert recs[1]["values"] == {"x": 5.0, "perf/tokens": 6}      # the None is left out, as step by step


LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 128, "tie_word_embeddings": False}
POSITIVE = st.one_of(st.floats(1e-3, 1e6), st.integers(1, 10**6))
ODD = st.one_of(POSITIVE, POSITIVE, POSITIVE, st.just(0), st.none(), st.just(math.inf), st.floats(-5, 0))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mfu_for_many_steps_equals_step_by_step(data):
    est = MfuEstimator.from_hello({"model": {"hf_config": LLAMA, "seq_len": data.draw(st.sampled_from([0, 16])),
                                             "gradient_checkpointing": data.draw(st.booleans())},
                                   "device_name": data.draw(st.sampled_from(["NVIDIA H100 80GB HBM3", "cpu"]))},
                                  halve_causal=data.draw(st.booleans()))
    ranks = data.draw(st.integers(1, 4))
    same_ranks = data.draw(st.booleans())
    with_sq = data.draw(st.booleans())
    value = POSITIVE if data.draw(st.booleans()) else ODD
    tokens, doc_sq, times = [], [], []
    for _ in range(data.draw(st.integers(1, 8))):
        n = ranks if same_ranks else data.draw(st.integers(1, 4))
        tokens.append(tuple(data.draw(value) for _ in range(n)))
        times.append(tuple(data.draw(value) for _ in range(n)))
        doc_sq.append(tuple(data.draw(value) for _ in range(n)) if with_sq else None)
    world = data.draw(st.sampled_from([None, ranks, ranks + 2]))
    many = est.step_metrics_many(tokens, doc_sq, times, world)
    one = [est.step_metrics_columns(t, d, s, world) for t, d, s in zip(tokens, doc_sq, times)]
    assert len(many) == len(one)
    for m, o in zip(many, one):
        assert m.keys() == o.keys()
        for k in o:
            assert m[k] == pytest.approx(o[k], rel=1e-9)
