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


def _named(name: str) -> tuple:
    (dv,) = [d for d in DERIVATIONS if d.name == name]
    return (dv,)


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
        Derived(MfuConfig(), _named("throughput")).apply(_batch()[0], [v], 2)
        assert "perf/steps_per_second" not in v and "perf/tokens_per_second" not in v, bad


def _ranks(agg: Aggregator, times: dict[int, dict]) -> tuple:
    done = []
    for rank, values in times.items():
        done = add(agg, rank, 1, 7, {"perf/step_time": 1.0, **values})
    return agg.finish_batch(done)


def test_a_node_daemon_forwards_each_phases_slowest_rank_and_a_head_compares_nodes_by_it():
    """One slow rank of a node's 8 moves the node's mean by an eighth: the head's view compares
    the nodes' slowest ranks (perf/<phase>_time_max, which only a forwarding daemon writes)."""
    node_times = {r: {"perf/forward_compute_time": 0.2 + (0.3 if r == 5 else 0.0)} for r in range(8)}
    for forwards in (False, True):
        batch, recs = _ranks(Aggregator(AggregatorConfig(world_size=8)), node_times)
        d = Derived(MfuConfig())
        d.forwards = forwards
        d.apply(batch, [r["values"] for r in recs], 8)
        v = recs[0]["values"]
        assert v["perf/forward_compute_time"] == 0.2375 and v["perf/straggler_rank"] == 5
        assert v.get("perf/forward_compute_time_max") == (0.5 if forwards else None)
        assert {k for k in v if k.endswith("_time_max")} == {"perf/step_time_max"} | \
            ({"perf/forward_compute_time_max"} if forwards else set()), v
    # At the head each "rank" is a node: node 2's mean is within the others' noise, its maximum is not.
    nodes = {n: {"perf/forward_compute_time": 0.2375 if n == 2 else 0.24 - 0.001 * n,
                 "perf/forward_compute_time_max": 0.5 if n == 2 else 0.21} for n in range(4)}
    batch, recs = _ranks(Aggregator(AggregatorConfig(world_size=4)), nodes)
    head = Derived(MfuConfig())
    head.forwards = True                       # a group head: its nodes' maxima, reduced by max, are kept
    head.apply(batch, [r["values"] for r in recs], 4)
    v = recs[0]["values"]
    assert v["perf/straggler_rank"] == 2 and v["perf/straggler_median_s"] == 0.21
    assert abs(v["perf/straggler_excess_s"] - 0.29) < 1e-12
    assert v["perf/forward_compute_time_max"] == 0.5
