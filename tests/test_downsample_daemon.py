"""A daemon with a downsampled sink (TensorBoard, every 10 steps) and eval every 10 steps, as the
trainer logs it (eval metrics at the step they were computed, after its training metrics): the
windows stay 10 training steps (10, 20, 30, not 10, 19, 28) and the eval metrics reach the sink
at their own steps."""
from __future__ import annotations

import pytest

from telemetry.client import TelemetryClient

pytest.importorskip("tensorboard")


def test_eval_does_not_shift_the_windows_of_a_downsampled_sink(make_daemon):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    d = make_daemon(world_size=2, config={"tensorboard": {"enabled": True, "every_n_steps": 10}})
    clients = [TelemetryClient(d.ingest, rank=r) for r in (0, 1)]
    for s in range(1, 31):
        for c in clients:
            c.log(s, {"train/loss": float(s), "perf/tokens": 100, "perf/step_time": 0.1})
        if s % 10 == 0:
            # Eval runs after the training step, for a while: the step's training record is
            # out before the eval records come (as with the trainer).
            d.wait_for(lambda recs: any(r.get("step") == s and "rank" not in r for r in recs), kind="metrics")
            for c in clients:
                c.log(s, {"eval/web/loss": 100.0 + s})
    for c in clients:
        c.close()
    d.wait_for(lambda recs: sum(1 for r in recs if "eval/web/loss" in r.get("values", {})) == 3, kind="metrics")
    d.drain()
    acc = EventAccumulator(str(d.log_dir / "tensorboard"))
    acc.Reload()
    tokens = acc.Scalars("perf/tokens")
    assert [e.step for e in tokens] == [10, 20, 30]
    assert [e.value for e in tokens] == [2000.0] * 3          # 10 training steps of 2 ranks x 100
    loss = acc.Scalars("train/loss")
    assert [e.value for e in loss] == pytest.approx([5.5, 15.5, 25.5])
    ev = acc.Scalars("eval/web/loss")
    assert [(e.step, e.value) for e in ev] == [(10, 110.0), (20, 120.0), (30, 130.0)]


def test_a_cross_rank_override_is_not_a_window_rule(make_daemon):
    """`aggregator.reductions: {my/tokens_per_second: sum}` adds up the ranks (2 x 500 = 1,000/s);
    over a window of 4 steps the rate stays 1,000/s (it was summed to 4,000: the cross-rank
    overrides were the window's rules too). A window rule of its own is
    `aggregator.window_reductions`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    d = make_daemon(world_size=2, config={
        "aggregator": {"reductions": {"my/tokens_per_second": "sum", "my/count": "sum"},
                       "window_reductions": {"my/count": "sum"}},
        "tensorboard": {"enabled": True, "every_n_steps": 4}})
    clients = [TelemetryClient(d.ingest, rank=r) for r in (0, 1)]
    for s in range(1, 9):
        for c in clients:
            c.log(s, {"my/tokens_per_second": 500.0, "my/count": 3})
    for c in clients:
        c.close()
    d.drain()
    acc = EventAccumulator(str(d.log_dir / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("my/tokens_per_second")] == [(4, 1000.0), (8, 1000.0)]
    assert [(e.step, e.value) for e in acc.Scalars("my/count")] == [(4, 24.0), (8, 24.0)]   # 4 steps x 2 ranks x 3
