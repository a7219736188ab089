"""Per-sink downsampling keeps the reductions: a window's loss is its mean, not a sample."""
import pytest

from protocol.output import EventRecord, MetricsRecord
from telemetry.daemon.downsample import Downsampler
from telemetry.daemon.sinks.base import Out


def step(s, loss, tokens=100, t=None):
    rec = MetricsRecord(t if t is not None else float(s), s,
                        {"train/loss": loss, "perf/tokens": tokens, "perf/step_time_max": 0.1 * s, "train/epoch": s / 10})
    return Out("metrics", rec, b"{}")


def test_every_n_steps_reduces_the_window():
    d = Downsampler(every_n_steps=4)
    out = d.feed([step(s, float(s)) for s in range(1, 10)])
    assert [o.record["step"] for o in out] == [4, 8]
    v = out[0].record["values"]
    assert v["train/loss"] == pytest.approx(2.5)          # mean of 1..4
    assert v["perf/tokens"] == 400                        # counts add up
    assert v["perf/step_time_max"] == pytest.approx(0.4)  # maxima stay maxima
    assert v["train/epoch"] == pytest.approx(0.4)         # last
    assert out[0].record["window_steps"] == 4
    (tail,) = d.flush()                                   # the partial last window is not lost
    assert tail.record["step"] == 9 and tail.record["values"]["train/loss"] == 9.0
    assert d.flush() == []


def test_other_records_pass_through():
    d = Downsampler(every_n_steps=100)
    ev = Out("event", EventRecord(0, 0, "x", {}), b"{}")
    per_rank = Out("metrics", MetricsRecord(0, 1, {"x": 1}, rank=3), b"{}")
    assert d.feed([ev, step(1, 1.0), per_rank]) == [ev, per_rank]


def test_max_per_second_with_a_clock():
    now = [100.0]
    d = Downsampler(max_per_second=2.0, clock=lambda: now[0])     # at most one record per 0.5 s
    out = d.feed([step(1, 1.0)])
    assert [o.record["step"] for o in out] == [1]
    now[0] += 0.1
    assert d.feed([step(2, 2.0), step(3, 4.0)]) == []             # held back, accumulating
    assert d.poll() == []
    now[0] += 0.4
    (o,) = d.poll()                                               # its time has come, no new step needed
    assert o.record["step"] == 3 and o.record["values"]["train/loss"] == pytest.approx(3.0)
    assert o.record["values"]["perf/tokens"] == 200


def test_every_n_and_rate_together():
    now = [0.0]
    d = Downsampler(every_n_steps=2, max_per_second=1.0, clock=lambda: now[0])
    assert [o.record["step"] for o in d.feed([step(s, 1.0) for s in range(1, 5)])] == [2]
    now[0] = 1.0                                                          # steps 3, 4 were held back by the rate
    (o,) = d.feed([step(5, 1.0)])
    assert o.record["step"] == 5 and o.record["window_steps"] == 3
    assert d.feed([step(6, 1.0)]) == [] and d.poll() == []                # 1 step < every_n_steps


def evals(s, loss):
    """The record the daemon sends when the trainer logs eval metrics at step s after its
    training metrics: the step logged again, eval metrics only."""
    rec = MetricsRecord(float(s), s, {"eval/web/loss": loss, "eval/web/accuracy": 0.5})
    return Out("metrics", rec, b"{}")


def test_eval_records_are_not_training_steps_and_pass_through_at_their_step():
    d = Downsampler(every_n_steps=10)
    batch = []
    for s in range(1, 31):
        batch.append(step(s, float(s)))
        if s % 10 == 0:
            batch.append(evals(s, 100.0 + s))
    out = d.feed(batch)
    windows = [o.record for o in out if "train/loss" in o.record["values"]]
    passed = [o.record for o in out if "eval/web/loss" in o.record["values"]]
    assert [w["step"] for w in windows] == [10, 20, 30]                 # not 10, 19, 28
    assert [w["window_steps"] for w in windows] == [10, 10, 10]
    assert all(w["values"]["perf/tokens"] == 1000 for w in windows)      # ten training steps each
    assert all("eval/web/loss" not in w["values"] for w in windows)
    assert [(p["step"], p["values"]["eval/web/loss"]) for p in passed] == [(10, 110.0), (20, 120.0), (30, 130.0)]
    assert d.flush() == []


def test_a_record_with_training_and_eval_metrics_is_split():
    d = Downsampler(every_n_steps=2)
    mixed = step(2, 2.0)
    mixed.record["values"]["eval/web/loss"] = 7.0
    out = d.feed([step(1, 1.0), mixed])
    assert [(o.record["step"], sorted(o.record["values"])) for o in out] == [
        (2, ["eval/web/loss"]),
        (2, ["perf/step_time_max", "perf/tokens", "train/epoch", "train/loss"])]
    assert out[1].record["window_steps"] == 2 and out[1].record["values"]["perf/tokens"] == 200
