"""The W&B sink fed what a rank can send that W&B cannot take: a flattened key whose path is
5,000 levels deep (a `wandb/nested` event), a summary nested 5,000 deep. Such a record costs
itself at worst (counted), never its neighbours in the batch: the sink behind its real runner,
a real offline W&B run read back (tests/wandb_offline.py)."""
from __future__ import annotations

import glob

import pytest

from protocol.output import EventRecord
from telemetry.daemon.sinks.base import Out, SinkRunner
from telemetry.daemon.sinks.wandb_sink import MAX_NESTED_DEPTH, WandbSink
from test_sinks_wandb_init import event, metrics
from wandb_offline import history_rows, wait_finished

pytest.importorskip("wandb")

NUM_STEPS = 510


def _run(tmp_path, batch: list[Out]) -> tuple[dict, list[dict]]:
    sink = WandbSink("offline", tmp_path, run_name="hostile")
    runner = SinkRunner(sink)
    runner.start()
    runner.put(batch)
    assert runner.close(60)
    (path,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    return runner.stats(), history_rows(wait_finished(path))


def test_a_deep_nested_path_leaves_its_key_flat_and_every_record_logged(tmp_path):
    paths = {"deep/key": ["p"] * 5000, "opt/lr": ["opt", "lr"], "edge/key": ["e"] * MAX_NESTED_DEPTH}
    batch = [metrics(0, {"train/loss": 1.0}), event(0, "wandb/nested", {"paths": paths})]
    batch += [metrics(s, {"train/loss": 1.0 / s, "deep/key": float(s), "opt/lr": 0.1, "edge/key": 2.0})
              for s in range(1, NUM_STEPS)]
    stats, rows = _run(tmp_path, batch)
    assert stats["dropped"] == 0 and stats["errors"] == 0 and stats["nested_refused"] == 1, stats
    assert len(rows) == NUM_STEPS and stats["written"] == len(batch)
    last = rows[-1]
    assert last["deep/key"] == NUM_STEPS - 1                  # flat, as the rank logged it
    # Nested again (W&B keeps them by their paths), up to MAX_NESTED_DEPTH levels.
    assert last["opt/lr"] == 0.1 and last["/".join(paths["edge/key"])] == 2.0 and "edge/key" not in last


def test_a_record_w_and_b_cannot_take_is_dropped_alone_and_counted(tmp_path):
    deep: dict = {"x": 1}
    for _ in range(5000):
        deep = {"x": deep}
    batch = [metrics(s, {"train/loss": 1.0 / (s + 1)}) for s in range(5)]
    batch.append(Out("event", EventRecord(2.5, 0, "wandb/summary", deep), b""))
    batch += [metrics(s, {"train/loss": 1.0 / (s + 1)}) for s in range(5, NUM_STEPS)]
    stats, rows = _run(tmp_path, batch)
    assert stats["dropped"] == 1 and stats["dropped_by_reason"] == {"too_deep": 1} and stats["errors"] == 0, stats
    assert len(rows) == NUM_STEPS
