"""The W&B sink opens the run a telemetry.wandb init names, with what arrived before it.

The sink in this process, fed records as the daemon hands them out; the offline run read back
with W&B's own protobuf schema (tests/wandb_offline.py)."""
from __future__ import annotations

import glob
import json

import pytest

from telemetry.daemon.sinks import wandb_sink
from telemetry.daemon.sinks.base import Out
from telemetry.daemon.sinks.wandb_sink import WandbSink
from wandb_offline import config, history_rows, run_info, summary, wait_finished

pytest.importorskip("wandb")


def out(rec: dict) -> Out:
    return Out(rec["kind"], rec, json.dumps(rec).encode())


def hello(rank: int, info: dict) -> Out:
    return out({"kind": "hello", "t": 1.0, "rank": rank, "info": {"host": "h", "pid": 1, "rank": rank, **info}})


def metrics(step: int, values: dict) -> Out:
    return out({"kind": "metrics", "t": 2.0, "step": step, "values": values})


def system(v: float) -> Out:
    return out({"kind": "system", "t": 1.5, "host": "h", "values": {"system/cpu_percent": v}})


def finish(sink: WandbSink, tmp_path) -> str:
    sink.close()
    (path,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    return wait_finished(path)


INIT = {"project": "proj", "name": "nano", "group": "ddp", "tags": ["a", "b"], "metrics": []}


def test_run_opened_with_the_init_and_the_records_that_waited(tmp_path):
    sink = WandbSink("offline", tmp_path, run_name="daemon-name", project="daemon-project")
    sink.start()
    sink.consume([system(10.0), hello(1, {"world_size": 2})])     # the pollers and a plain hello first
    assert sink.run is None
    sink.consume([hello(0, {"framework": "wandb", "config": {"lr": 0.1}, "wandb": INIT, "world_size": 1}),
                  metrics(0, {"train/loss": 2.0}),
                  out({"kind": "event", "t": 3.0, "rank": 0, "name": "wandb/summary", "data": {"best": 1.5}})])
    path = finish(sink, tmp_path)
    info = run_info(path)
    assert (info["project"], info["name"], info["group"], sorted(info["tags"])) == ("proj", "nano", "ddp", ["a", "b"])
    cfg = config(path)
    assert cfg["lr"] == 0.1 and cfg["telemetry"]["world_size"] == 2 and "wandb" not in cfg
    rows = history_rows(path)
    assert any(r.get("system/cpu_percent") == 10.0 for r in rows)   # waited, not lost
    assert any(r.get("train/loss") == 2.0 and r["train/step"] == 0 for r in rows)
    assert summary(path)["best"] == 1.5


def test_an_init_of_wrong_types_opens_the_daemons_run(tmp_path):
    sink = WandbSink("offline", tmp_path, run_name="daemon-name", project="daemon-project")
    sink.start()
    sink.consume([hello(0, {"config": {"lr": 0.1}, "wandb": {"project": 123, "tags": "x"}}),   # wrong types
                  metrics(0, {"train/loss": 2.0})])
    path = finish(sink, tmp_path)
    info = run_info(path)
    assert (info["project"], info["name"]) == ("daemon-project", "daemon-name")


def test_waiting_is_bounded_and_counted(tmp_path, monkeypatch):
    monkeypatch.setattr(wandb_sink, "MAX_WAITING", 3)
    sink = WandbSink("offline", tmp_path, run_name="r")
    sink.start()
    sink.consume([system(float(i)) for i in range(5)])
    assert sink.stats()["dropped_before_open"] == 2
    path = finish(sink, tmp_path)                                    # close opens the run for them
    assert sorted(r["system/cpu_percent"] for r in history_rows(path) if "system/cpu_percent" in r) == [0.0, 1.0, 2.0]
