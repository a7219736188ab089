"""The W&B sink opens the run a telemetry.wandb init names, with what arrived before it.

The sink in this process, fed records as the daemon hands them out; the offline run read back
with W&B's own protobuf schema (tests/wandb_offline.py)."""
from __future__ import annotations

import glob
import json

import pytest

from protocol import output
from telemetry.daemon.sinks import wandb_sink
from telemetry.daemon.sinks.base import Out
from telemetry.daemon.sinks.wandb_sink import WandbSink
from wandb_offline import (config, console, history_rows, read_records, run_info, stats_rows, user_history,
                           user_summary, wait_finished)

pytest.importorskip("wandb")


def out(rec: dict) -> Out:
    """The record as the daemon hands it to a sink: the declared Struct (protocol/output.py)."""
    line = json.dumps(rec).encode()
    return Out(rec["kind"], output.check(line), line)


def hello(rank: int, info: dict) -> Out:
    return out({"kind": "hello", "t": 1.0, "rank": rank, "info": {"host": "h", "pid": 1, "rank": rank, **info}})


def metrics(step: int, values: dict) -> Out:
    return out({"kind": "metrics", "t": 2.0, "step": step, "values": values})


def event(rank: int, name: str, data: dict) -> Out:
    return out({"kind": "event", "t": 2.5, "rank": rank, "name": name, "data": data})


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
    assert config(path) == {"_wandb": {}, "lr": 0.1}                 # the script's config alone, as in W&B
    # The user's run as W&B would have it: the row at its own step, nothing else in the history;
    # the host series in W&B's system metrics (waited, not lost).
    assert user_history(path) == {0: {"train/loss": 2.0}}
    assert {"cpu_percent": 10.0} in stats_rows(path)
    assert user_summary(path) == {"_step": 0, "train/loss": 2.0, "best": 1.5}


def test_the_users_run_takes_text_values_console_output_and_define_metric(tmp_path):
    """Text joins its step's row (also when it comes before the rows of earlier steps); the init rank's console output is the run's console log (another
    rank's is not); define_metric as the script made it (step_metric included)."""
    sink = WandbSink("offline", tmp_path, run_name="daemon-name")
    sink.start()
    init = {**INIT, "id": "abcd1234", "metrics": [{"name": "val/*", "step_metric": "epoch", "summary": "min"}]}
    sink.consume([hello(0, {"config": {}, "wandb": init, "world_size": 2}), hello(1, {"wandb": init, "world_size": 2}),
                  event(0, "wandb/values", {"step": 0, "values": {"note": "warm-up"}}),
                  # step 1's text before step 0's numbers (those wait for every rank): it waits for
                  # its step, else W&B, moved on to step 1, would drop step 0's row
                  event(0, "wandb/values", {"step": 1, "values": {"phase": "train"}}),
                  metrics(0, {"loss": 2.0}),
                  event(0, "wandb/console", {"stream": "stdout", "text": "step 0 done\n"}),
                  event(1, "wandb/console", {"stream": "stdout", "text": "rank 1 here\n"}),
                  event(0, "wandb/console", {"stream": "stderr", "text": "a warning\n"}),
                  metrics(1, {"loss": 1.0, "epoch": 0, "val/loss": 3.0})])
    assert sink.stats()["run"]["id"] == "abcd1234" and sink.stats()["run"]["name"] == "nano"
    path = finish(sink, tmp_path)
    assert run_info(path)["id"] == "abcd1234"
    assert user_history(path) == {0: {"note": "warm-up", "loss": 2.0},
                                  1: {"phase": "train", "loss": 1.0, "epoch": 0, "val/loss": 3.0}}
    assert console(path) == {"stdout": "step 0 done\n", "stderr": "a warning\n"}
    assert sink.stats()["console"] == 2 and sink.num_dropped == 0
    defs = [r.metric for r in read_records(path) if r.WhichOneof("record_type") == "metric"]
    assert any(m.glob_name == "val/*" and m.step_metric == "epoch" for m in defs), defs


def test_an_init_of_wrong_types_opens_the_daemons_run(tmp_path):
    sink = WandbSink("offline", tmp_path, run_name="daemon-name", project="daemon-project")
    sink.start()
    sink.consume([hello(0, {"config": {"lr": 0.1}, "wandb": {"project": 123, "tags": "x"}}),   # wrong types
                  metrics(0, {"train/loss": 2.0})])
    path = finish(sink, tmp_path)
    info = run_info(path)
    assert (info["project"], info["name"]) == ("daemon-project", "")     # no name given: none, as W&B offline


def test_waiting_is_bounded_and_counted(tmp_path, monkeypatch):
    monkeypatch.setattr(wandb_sink, "MAX_WAITING", 3)
    sink = WandbSink("offline", tmp_path, run_name="r")
    sink.start()
    sink.consume([system(float(i)) for i in range(5)])
    assert sink.stats()["dropped_before_open"] == 2
    path = finish(sink, tmp_path)                                    # close opens the run for them
    assert sorted(r["system/cpu_percent"] for r in history_rows(path) if "system/cpu_percent" in r) == [0.0, 1.0, 2.0]


def test_the_goodput_ledger_is_in_the_daemons_run_summary_and_the_users_system_metrics(tmp_path):
    """The daemon's records carry the goodput ledger so far (goodput/*): the daemon's run (our
    trainer) has its last values in the summary; the user's run keeps W&B's own history and
    summary, and has them in its system metrics with the other telemetry series."""
    from wandb_offline import summary

    gp = {"goodput/fraction": 0.75, "goodput/productive_s": 30.0, "goodput/startup_s": 10.0, "goodput/wall_s": 40.0}
    daemon_rec = out({"kind": "daemon", "t": 3.0, "values": gp})
    ours = tmp_path / "ours"
    sink = WandbSink("offline", ours, run_name="daemon-name", project="daemon-project")
    sink.start()
    sink.consume([hello(0, {"world_size": 1}), metrics(1, {"train/loss": 2.0}), daemon_rec])
    s = summary(finish(sink, ours))
    assert {k: s.get(k) for k in gp} == gp, s
    theirs = tmp_path / "theirs"
    sink = WandbSink("offline", theirs, run_name="daemon-name", project="daemon-project")
    sink.start()
    sink.consume([hello(0, {"framework": "wandb", "config": {}, "wandb": INIT, "world_size": 1}),
                  metrics(0, {"train/loss": 2.0}), daemon_rec])
    path = finish(sink, theirs)
    assert not any(k.startswith("goodput/") for k in summary(path))
    assert any(row.get("goodput/fraction") == 0.75 for row in stats_rows(path)), stats_rows(path)


def test_the_daemons_run_defines_the_summaries_the_catalogue_declares(tmp_path):
    """The daemon's own run: every metric against train/step, and a define_metric with its
    summary for each declaration that gives one (the daemon config's `metrics:`: core.py passes
    catalogue.wandb_summaries)."""
    from telemetry.shared import catalogue

    declared = catalogue.declared({"train/loss": {"wandb_summary": "min,last"}, "my/score": {"wandb_summary": "max"}})
    assert declared[0].across_ranks == "mean" and declared[0].unit == ""       # the built-in entry's, kept
    sink = WandbSink("offline", tmp_path, run_name="daemon-name", summaries=catalogue.wandb_summaries(declared))
    sink.start()
    sink.consume([metrics(s, {"train/loss": loss, "my/score": score})
                  for s, (loss, score) in enumerate([(3.0, 1.0), (1.0, 5.0), (2.0, 2.0)])])
    path = finish(sink, tmp_path)
    defs = {(m.name or m.glob_name): m for r in read_records(path) if r.WhichOneof("record_type") == "metric"
            for m in [r.metric]}
    loss, mine = defs["train/loss"], defs["my/score"]
    assert loss.step_metric == "train/step" and loss.summary.min and loss.summary.last and not loss.summary.max
    assert mine.step_metric == "train/step" and mine.summary.max and not mine.summary.min
    assert defs["*"].step_metric == "train/step" and sink.num_dropped == 0
    summary = user_summary(path)
    assert summary["train/loss"] == {"min": 1.0, "last": 2.0} and summary["my/score"] == {"max": 5.0}, summary
