"""Aggregation semantics across ranks: reductions, straggler view, completion, timeouts, late records."""
import pytest

from telemetry.daemon.aggregator import Aggregator
from telemetry.daemon.config import AggregatorConfig, ConfigError
from telemetry.daemon.world import DEAD_AFTER_TIMEOUTS, World
from aggregator_util import add, finish


def agg(world_size=4, **kw):
    return Aggregator(AggregatorConfig(world_size=world_size, **kw))


def feed(a, step, per_rank_values, t_ns=0):
    done = []
    for rank, values in per_rank_values.items():
        out = add(a, rank, step, t_ns + rank, values)
        done += out or []
    return [finish(a, acc) for acc in done]


def test_reductions_mean_sum_max_and_straggler_view():
    a = agg(4)
    rows = {r: {"train/loss": 1.0 + r, "perf/tokens": 1000, "perf/samples": 4,
                "perf/step_time": [0.5, 0.7, 0.6, 0.55][r], "memory/max_allocated_gb": 10.0 + r} for r in range(4)}
    (rec,) = feed(a, 7, rows)
    v = rec["values"]
    assert rec["step"] == 7 and "rank" not in rec and "missing_ranks" not in rec
    assert v["train/loss"] == pytest.approx(2.5)          # gauge: mean
    assert v["perf/tokens"] == 4000 and v["perf/samples"] == 16   # counters: sum
    assert v["perf/step_time"] == 0.7                      # a synchronous step: its slowest rank
    assert v["memory/max_allocated_gb"] == 13.0
    assert v["perf/step_time_max"] == 0.7 and v["perf/step_time_min"] == 0.5
    assert v["perf/slowest_rank"] == 1
    assert rec["t"] == pytest.approx(3 / 1e9)              # the last rank's time


def test_step_waits_for_every_rank():
    a = agg(3)
    assert feed(a, 1, {0: {"x": 1.0}, 1: {"x": 2.0}}) == []
    assert list(a.pending) == [1]
    (rec,) = feed(a, 1, {2: {"x": 3.0}})
    assert rec["values"]["x"] == 2.0 and a.num_steps_out == 1


def test_ranks_with_different_keys():
    a = agg(2)
    (rec,) = feed(a, 0, {0: {"train/loss": 1.0, "dataset/a/loss": 5.0}, 1: {"train/loss": 3.0}})
    assert rec["values"] == {"train/loss": 2.0, "dataset/a/loss": 5.0}


def test_reduction_override_from_config():
    a = agg(2, reductions={"train/loss": "max", "custom/*": "sum"})
    (rec,) = feed(a, 0, {0: {"train/loss": 1.0, "custom/n": 2}, 1: {"train/loss": 3.0, "custom/n": 5}})
    assert rec["values"]["train/loss"] == 3.0 and rec["values"]["custom/n"] == 7
    with pytest.raises(ConfigError):
        AggregatorConfig(reductions={"x": "median"})


def test_timeout_emits_without_the_missing_rank(monkeypatch):
    a = agg(3, step_timeout_s=5.0)
    feed(a, 1, {0: {"x": 1.0}, 1: {"x": 3.0}})
    opened = a.pending[1].opened_mono
    assert a.expire(opened + 4.9) == []
    (acc,) = a.expire(opened + 5.0)
    rec = finish(a, acc)
    assert rec["missing_ranks"] == [2] and rec["values"]["x"] == 2.0
    assert a.num_steps_incomplete == 1


def test_a_later_complete_step_closes_older_ones():
    a = agg(2)
    feed(a, 1, {0: {"x": 1.0}})                  # rank 1's step 1 never comes
    recs = feed(a, 2, {0: {"x": 1.0}, 1: {"x": 1.0}})
    assert [r["step"] for r in recs] == [1, 2]
    assert recs[0]["missing_ranks"] == [1] and "missing_ranks" not in recs[1]


def test_dead_rank_is_no_longer_waited_for_and_comes_back():
    a = agg(2, step_timeout_s=1.0)
    now = 0.0
    for step in range(DEAD_AFTER_TIMEOUTS):
        feed(a, step, {0: {"x": 1.0}})
        now = a.pending[step].opened_mono + 1.0
        for acc in a.expire(now):
            assert finish(a, acc)["missing_ranks"] == [1]
    assert a.world.gone == {1}
    # Now a step completes on rank 0 alone, still saying rank 1 is missing.
    (rec,) = feed(a, 10, {0: {"x": 1.0}})
    assert rec["missing_ranks"] == [1]
    # Rank 1 reports again: it is waited for again.
    assert feed(a, 11, {1: {"x": 1.0}}) == []
    assert a.world.gone == set()
    (rec,) = feed(a, 11, {0: {"x": 3.0}})
    assert "missing_ranks" not in rec and rec["values"]["x"] == 2.0


def test_late_record_is_not_a_second_step_record():
    a = agg(2, step_timeout_s=1.0)
    feed(a, 5, {0: {"x": 1.0}})
    (acc,) = a.expire(a.pending[5].opened_mono + 1.0)
    finish(a, acc)
    assert add(a, 1, 5, 0, {"x": 9.0}) is None     # the caller writes it as the rank's own record
    assert a.num_records_late == 1 and not a.pending


def test_same_rank_logging_a_step_again_opens_it_again():
    # e.g. the trainer logs train metrics, then eval metrics for the same step
    a = agg(2)
    feed(a, 3, {0: {"train/loss": 1.0}, 1: {"train/loss": 2.0}})
    (rec,) = feed(a, 3, {0: {"eval/loss": 4.0}, 1: {"eval/loss": 6.0}})
    assert rec["step"] == 3 and rec["values"] == {"eval/loss": 5.0}
    assert a.num_records_late == 0


def test_world_size_from_hellos_and_ranks_seen():
    a = Aggregator(AggregatorConfig())
    a.world.note_size(2)
    assert feed(a, 0, {0: {"x": 1.0}}) == []
    assert len(feed(a, 0, {1: {"x": 1.0}})) == 1
    assert a.world.size() == 2


def test_none_and_bool_values_reduce_without_losing_the_step():
    from telemetry.daemon.aggregator import Aggregator
    from telemetry.daemon.config import AggregatorConfig

    a = Aggregator(AggregatorConfig(world_size=2))
    add(a, 0, 1, 0, {"train/loss": 1.0, "eval/acc": None, "is_best": True, "perf/tokens": 5})
    (acc,) = add(a, 1, 1, 0, {"train/loss": 3.0, "eval/acc": 0.5, "is_best": False, "perf/tokens": 7})
    values = finish(a, acc)["values"]
    assert values["train/loss"] == 2.0 and values["perf/tokens"] == 12
    assert values["eval/acc"] == 0.5          # the rank without a value does not count
    assert values["is_best"] == 0.5           # the fraction of ranks


def test_per_phase_straggler_view():
    # issue 19: equal step times (synchronous DP), rank 2 slow in forward, the others wait in backward
    a = agg(4)
    fwd = [0.02, 0.02, 0.17, 0.03]
    rows = {r: {"perf/step_time": 0.3, "perf/data_loading_time": 0.001, "perf/forward_time": fwd[r],
                "perf/backward_time": 0.27 - fwd[r], "perf/optimizer_time": 0.01} for r in range(4)}
    (rec,) = feed(a, 3, rows)
    v = rec["values"]
    assert v["perf/straggler_rank"] == 2 and v["perf/straggler_phase_index"] == 1      # forward
    assert v["perf/straggler_median_s"] == pytest.approx(0.02)
    assert v["perf/straggler_excess_s"] == pytest.approx(0.15)
    # a rank that did not log a phase: the others' figures
    rows[3].pop("perf/forward_time")
    (rec,) = feed(a, 4, rows)
    assert rec["values"]["perf/straggler_rank"] == 2 and rec["values"]["perf/straggler_excess_s"] == pytest.approx(0.15)
    # one rank alone: no straggler view
    (rec,) = feed(agg(1), 0, {0: rows[0]})
    assert "perf/straggler_rank" not in rec["values"]


def test_the_world_alone_strangers_hints_and_ranks_that_come_and_go():
    """world.py without the aggregator: a node's slice of a configured world; a stranger never
    waited for; a hello's size only where nothing is configured; a rank gone after
    DEAD_AFTER_TIMEOUTS timed-out steps in a row, back once it reports; the ranks seen are the
    world only while nothing is announced."""
    w = World(4, first_rank=4)                  # node 1 of 4-rank nodes: ranks 4..7
    assert w.expected == {4, 5, 6, 7} and w.size() == 4
    w.announce(99)                              # configured: a hello changes nothing
    assert w.admit(99) is False
    assert 99 in w.strangers and 99 not in w.steady and 99 not in w.expected and w.num_expected == 4
    assert all(w.admit(r) for r in (4, 5, 6, 7))
    w.note_size(8)                              # configured: a hello changes nothing
    assert w.size() == 4
    for r in (4, 5, 6, 7):
        w.reported(r)
    for n in range(DEAD_AFTER_TIMEOUTS):
        assert 7 not in w.gone
        w.timed_out({4, 5, 6})
    assert w.gone == {7} and w.expected == {4, 5, 6} and 7 not in w.steady
    w.reported(7)
    assert w.gone == set() and w.num_expected == 4 and 7 in w.steady
    h = World(0)                                # nothing announced: the ranks seen
    assert h.admit(3) and h.admit(5)
    h.reported(3)
    h.reported(5)
    assert h.size() == 2 and h.expected == {3, 5}
    h.announce(5)                               # the first hello: rank 3, seen, announced by none, leaves
    assert h.expected == {5} and h.admit(3) is False and 3 in h.strangers
    h.note_size(4)                              # a hello's WORLD_SIZE: 0..3, rank 3 among them
    assert h.size() == 4 and h.expected == {0, 1, 2, 3, 5} and h.admit(3) and not h.strangers
    assert h.admit(9) is False and 9 not in h.expected
    h.announce(9)                               # its hello came after its first record
    assert h.admit(9)
    h.reported(9)
    assert 9 in h.expected and 9 in h.steady


def test_a_large_worlds_ranks_reporting_first_keep_it_exact_without_a_walk_each(monkeypatch):
    """A head of 8,192 nodes: each node's first step (and a stranger's) leaves known, expected and
    steady what the full recount gives, without that O(world) recount per rank (8,192 of them
    were ~3 s of the head's CPU at every start); a rank back from gone still takes the full one."""
    w = World(8192)
    walks = []
    real = World._recount
    monkeypatch.setattr(World, "_recount", lambda self: (walks.append(1), real(self))[1])
    for r in range(8192):
        assert w.admit(r)
        w.reported(r)
    assert w.admit(9000) is False                       # a stranger
    assert walks == []
    fresh = World(8192)
    fresh.seen, fresh.strangers = set(range(8192)), {9000}
    real(fresh)
    assert (w.known, w.expected, w.num_expected, w.steady) == (fresh.known, fresh.expected, fresh.num_expected,
                                                               fresh.steady)
    for size, hint in ((0, 0), (0, 4096)):              # nodes that each said hello, with no world size; with one
        u = World(size)
        if hint:
            u.note_size(hint)
        for r in range(8192):
            u.announce(r)
        before = len(walks)
        for r in range(8192):
            assert u.admit(r)
            u.reported(r)
        assert len(walks) == before
        ref = World(size)
        ref.size_hint, ref.seen, ref.announced = hint, set(range(8192)), set(range(8192))
        real(ref)
        assert (u.known, u.expected, u.num_expected, u.steady) == (ref.known, ref.expected, ref.num_expected, ref.steady)
    for _ in range(DEAD_AFTER_TIMEOUTS):
        w.timed_out(set(range(1, 8192)))                # rank 0 missed them: gone
    assert 0 not in w.expected and 0 not in w.steady
    w.reported(0)
    assert 0 in w.expected and 0 in w.steady and 0 < len(walks) < 12
