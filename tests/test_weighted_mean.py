"""Per-dataset loss and accuracy across ranks are weighted by the tokens each rank saw of that
dataset (`weighted_mean:tokens`), so the aggregated figure is the one a single process over all
their tokens reports, not a mean of rank means; with either inner loops (C and Python)."""
from __future__ import annotations

import math

import pytest

from telemetry.daemon import hotpath
from telemetry.daemon import loops as python_loops
from telemetry.daemon.aggregator import Aggregator
from telemetry.daemon.config import AggregatorConfig
from telemetry.daemon.reductions import RANK_RULES, Reducer, parse
from aggregator_util import add, finish_many

LOOPS = [pytest.param(python_loops, id="python"),
         pytest.param(hotpath.native, id="c",
                      marks=pytest.mark.skipif(hotpath.native is None, reason="the C loops are not built here"))]


def _step(impl, rows: dict[int, dict]) -> dict:
    agg = Aggregator(AggregatorConfig(world_size=len(rows)), loops=impl)
    done = []
    for rank, values in rows.items():
        done += add(agg, rank, 1, rank, values) or []
    (rec,) = finish_many(agg, done)
    return rec["values"]


@pytest.mark.parametrize("impl", LOOPS)
def test_two_ranks_with_different_token_counts_give_the_token_weighted_figure(impl):
    # rank 0: 300 tokens of "web" at mean loss 2.0 (600 in all); rank 1: 100 tokens at 4.0 (400)
    rows = {0: {"dataset/web/loss": 2.0, "dataset/web/accuracy": 0.5, "dataset/web/tokens": 300.0,
                "train/loss": 2.5},
            1: {"dataset/web/loss": 4.0, "dataset/web/accuracy": 0.1, "dataset/web/tokens": 100.0,
                "train/loss": 3.5}}
    v = _step(impl, rows)
    assert v["dataset/web/loss"] == pytest.approx((600 + 400) / 400)          # 2.5, not the 3.0 of rank means
    assert v["dataset/web/accuracy"] == pytest.approx((0.5 * 300 + 0.1 * 100) / 400)
    assert v["dataset/web/tokens"] == 400.0
    assert v["train/loss"] == 3.0              # no train/tokens beside it: the plain mean


@pytest.mark.parametrize("impl", LOOPS)
def test_a_rank_that_saw_no_token_of_a_dataset_does_not_count(impl):
    rows = {0: {"dataset/code/loss": 1.5, "dataset/code/tokens": 50.0},
            1: {"dataset/code/loss": math.nan, "dataset/code/tokens": 0.0},      # what the trainer sends then
            2: {"dataset/code/loss": 2.5, "dataset/code/tokens": 150.0}}
    v = _step(impl, rows)
    assert v["dataset/code/loss"] == pytest.approx((1.5 * 50 + 2.5 * 150) / 200)


@pytest.mark.parametrize("impl", LOOPS)
def test_without_its_count_a_value_falls_back_to_the_plain_mean(impl):
    rows = {0: {"eval/web/loss": 2.0, "x/tokens": 1.0}, 1: {"eval/web/loss": 4.0}}
    assert _step(impl, rows)["eval/web/loss"] == 3.0
    rows = {0: {"dataset/a/loss": 2.0, "dataset/a/tokens": 10.0}, 1: {"dataset/a/loss": 4.0}}   # one count missing
    assert _step(impl, rows)["dataset/a/loss"] == 3.0


def test_weighted_mean_is_a_rule_like_the_others():
    r = Reducer(RANK_RULES, {"custom/*": "weighted_mean:n"})
    column = [(1.0, 3.0)]
    out = r.reduce_columns({"custom/score": column, "custom/n": [(1, 3)]})
    assert out["custom/score"] == [pytest.approx((1.0 + 9.0) / 4)]
    assert r.rule("dataset/web/loss").count == "tokens"
    with pytest.raises(ValueError):
        parse("weighted_mean:")
    with pytest.raises(ValueError):
        parse("median")


def test_a_weighted_mean_rule_in_the_daemon_config_is_accepted_and_a_bad_one_named(tmp_path):
    import pytest

    from telemetry.daemon.config import ConfigError, load

    cfg = load(None, {"aggregator.reductions": {"eval/*": "weighted_mean:samples"}})
    assert cfg.aggregator.reductions == {"eval/*": "weighted_mean:samples"}
    with pytest.raises(ConfigError, match=r"aggregator.reductions\['x'\].*weighted_mean:<count>"):
        load(None, {"aggregator.reductions": {"x": "median"}})
