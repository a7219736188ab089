"""Derived metrics as one list of functions (telemetry/daemon/derived.py): run in order, and a
failing one costs only its own names."""
from __future__ import annotations

from aggregator_util import add
from telemetry.daemon.aggregator import Aggregator
from telemetry.daemon.config import AggregatorConfig, MfuConfig
from telemetry.daemon.derived import DERIVATIONS, Derivation, Derived


def _batch():
    agg = Aggregator(AggregatorConfig(world_size=2))
    add(agg, 0, 1, 1, {"perf/tokens": 100, "perf/step_time": 0.5})
    done = add(agg, 1, 1, 2, {"perf/tokens": 300, "perf/step_time": 1.0})
    return agg.finish_batch(done)


def test_the_derivations_run_in_order_and_a_failing_one_costs_only_its_names():
    def broken(batch, values, d):
        values[0]["half/written"] = 1.0
        raise ZeroDivisionError("a bug in a new metric")

    batch, recs = _batch()
    steps = [r["values"] for r in recs]
    failed = Derived(MfuConfig(), (DERIVATIONS[0], Derivation("broken", ("half/written",), broken),
                                   *DERIVATIONS[1:])).apply(batch, steps, 2)
    assert [(what, type(exc)) for what, exc in failed] == [("broken (half/written)", ZeroDivisionError)]
    v = steps[0]
    # Before it and after it: the step time view, then throughput from the slowest rank's step.
    assert v["perf/step_time_max"] == 1.0 and v["perf/slowest_rank"] == 1
    assert v["perf/steps_per_second"] == 1.0 and v["perf/tokens_per_second"] == 400.0


def test_throughput_takes_only_a_positive_finite_step_time():
    for bad in (0, -1.0, float("inf"), float("nan"), True, "1"):
        v = {"perf/step_time": bad, "perf/tokens": 10}
        Derived(MfuConfig(), DERIVATIONS[2:3]).apply(_batch()[0], [v], 2)
        assert "perf/steps_per_second" not in v and "perf/tokens_per_second" not in v, bad
