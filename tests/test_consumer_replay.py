"""telemetry replay into W&B offline, from a real daemon's metrics.jsonl: every step once, and a
second replay adds only what is new (idempotent by step). The offline run files are read back."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from telemetry.client import TelemetryClient

pytest.importorskip("wandb")

BLOCK = 32768
HEADER = 7  # ":W&B" + magic 0xBEE1 + version


def read_history(wandb_file: Path) -> list[dict]:
    """History rows of an offline run's .wandb file (LevelDB log format of Record protos)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = wandb_file.read_bytes()
    assert data[:4] == b":W&B"
    pos, rows, buf = HEADER, [], b""
    while pos + 7 <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < 7:
            pos += left_in_block  # block trailer padding
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 2):  # full, first
            buf = chunk
        else:  # middle, last
            buf += chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            if rec.WhichOneof("record_type") == "history":
                rows.append({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in rec.history.item})
    return rows


def _offline_runs(log_dir: Path) -> list[Path]:
    return sorted((log_dir / "wandb").glob("offline-run-*/run-*.wandb"))


def _train(d, steps: range) -> None:
    c = TelemetryClient(d.ingest, rank=0)
    c.hello({"run_name": "replay-me", "config": {"lr": 0.1}})
    for s in steps:
        c.log(s, {"train/loss": 10.0 / s, "perf/step_time": 0.1, "perf/tokens": 64})
    c.event("checkpoint_saved", {"path": "/x"})
    c.close()
    d.wait_for(lambda rs: any(r.get("step") == steps[-1] for r in rs))
    d.drain()


def test_replay_offline_is_idempotent_by_step(make_daemon, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    from telemetry.consumers.replay import replay

    log_dir = tmp_path / "run" / "telemetry"
    _train(make_daemon(world_size=1, log_dir=log_dir), range(1, 21))

    first = replay(tmp_path / "run", mode="offline")
    assert first["steps"] == 20 and first["last_step"] == 20
    (run_file,) = _offline_runs(log_dir)
    assert run_file.name == f"run-{first['run_id']}.wandb"
    rows = read_history(run_file)
    step_rows = [r for r in rows if "train/loss" in r]
    assert [r["train/step"] for r in step_rows] == list(range(1, 21))
    assert step_rows[4]["train/loss"] == pytest.approx(2.0)
    assert any("perf/tokens_per_second" in r for r in step_rows)

    again = replay(tmp_path / "run", mode="offline")
    assert again["rows"] == 0 and "nothing new" in capsys.readouterr().out
    assert len(_offline_runs(log_dir)) == 1  # no W&B run opened for nothing

    # The run goes on (a restarted daemon appends to the same metrics.jsonl): only steps 21..30 go up.
    _train(make_daemon(world_size=1, log_dir=log_dir), range(21, 31))
    third = replay(log_dir, mode="offline")
    assert third["run_id"] == first["run_id"] and third["steps"] == 10
    new_file = [p for p in _offline_runs(log_dir) if p != run_file][0]
    new_steps = [r["train/step"] for r in read_history(new_file) if "train/loss" in r]
    assert new_steps == list(range(21, 31))


def test_plan_assigns_host_records_to_the_step_before(tmp_path):
    from telemetry.consumers.replay import plan

    recs = [{"kind": "gpu", "t": 0, "gpu": 1, "values": {"gpu/util_percent": 5}},
            {"kind": "metrics", "step": 1, "values": {"train/loss": 1.0}},
            {"kind": "gpu", "t": 1, "gpu": 1, "values": {"gpu/util_percent": 50}},
            {"kind": "metrics", "step": 1, "rank": 0, "values": {"train/loss": 1.0}},
            {"kind": "metrics", "step": 2, "values": {"train/loss": 0.5}}]
    rows, _, _, _ = plan(recs, after_step=-1)
    assert rows == [(1, {"train/loss": 1.0}), (1, {"gpu1/util_percent": 50}), (2, {"train/loss": 0.5})]
    assert plan(recs, after_step=1)[0] == [(2, {"train/loss": 0.5})]
