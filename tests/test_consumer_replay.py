"""telemetry replay into W&B offline, from a real daemon's metrics.jsonl: every step once, and a
second replay adds only what is new (idempotent by step). The offline run files are read back."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from telemetry.client import TelemetryClient

pytest.importorskip("wandb")

def read_history(wandb_file: Path) -> list[dict]:
    """History rows of an offline run's .wandb file, once W&B has written all of it."""
    from telemetry.consumers.wandb_offline import is_finished, records

    deadline = time.monotonic() + 120   # W&B's service writes the last records after finish() returns
    while not is_finished(wandb_file.parent) and time.monotonic() < deadline:
        time.sleep(0.2)
    rows = []
    for rec in records(wandb_file):
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

    # The run goes on (a restarted daemon appends to the same metrics.jsonl): a new replay writes
    # the whole run into one new directory and moves the old one aside, so that `wandb sync` of
    # the folder uploads each step once.
    _train(make_daemon(world_size=1, log_dir=log_dir), range(21, 31))
    third = replay(log_dir, mode="offline")
    assert third["run_id"] == first["run_id"] and third["steps"] == 30
    (new_file,) = _offline_runs(log_dir)
    assert new_file != run_file
    assert [r["train/step"] for r in read_history(new_file) if "train/loss" in r] == list(range(1, 31))
    assert third["superseded"] == [log_dir / "wandb-superseded" / run_file.parent.name]
    assert (log_dir / "wandb-superseded" / run_file.parent.name / run_file.name).exists()   # kept, not deleted


def test_replay_after_the_live_offline_sink_keeps_one_directory(make_daemon, tmp_path, monkeypatch):
    """The daemon's own W&B sink wrote an offline run; a replay must not add a second one beside it."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    from telemetry.consumers.replay import replay

    log_dir = tmp_path / "run" / "telemetry"
    _train(make_daemon(world_size=1, log_dir=log_dir, wandb="offline"), range(1, 16))
    (live_file,) = _offline_runs(log_dir)
    live_steps = [r["train/step"] for r in read_history(live_file) if "train/loss" in r]
    assert live_steps == list(range(1, 16))

    r = replay(tmp_path / "run", mode="offline")
    (only,) = _offline_runs(log_dir)    # one directory per run id: wandb sync uploads each step once
    assert only != live_file and only.name == f"run-{r['run_id']}.wandb" == live_file.name
    assert [x["train/step"] for x in read_history(only) if "train/loss" in x] == list(range(1, 16))
    assert (log_dir / "wandb-superseded" / live_file.parent.name).is_dir()


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


def test_replay_logs_a_drop_in_ranks_keys_at_their_w_and_b_keys(make_daemon, tmp_path, monkeypatch):
    """A drop-in rank's nested {"a": {"b": v}} travels as "a/b" and its flat "a/b" beside it as
    "a/b#2", their W&B paths in a "wandb/nested" event: the live sink logs them at their keys,
    and a replay did not (the keys "a/b" and "a/b#2" in W&B: a key W&B's own run never had)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    from telemetry.consumers.replay import replay
    from telemetry.consumers.wandb_offline import is_finished, records
    from telemetry.shared.wandb_keys import NESTED_EVENT

    log_dir = tmp_path / "run" / "telemetry"
    d = make_daemon(world_size=1, log_dir=log_dir)
    c = TelemetryClient(d.ingest, rank=0)
    c.event(NESTED_EVENT, {"paths": {"a/b": ["a", "b"], "a/b#2": ["a/b"]}})
    for s in (1, 2):
        c.log(s, {"a/b": 2.0 * s, "a/b#2": 1.0 * s, "train/loss": 0.5})
    c.close()
    d.wait_for(lambda rs: any(r.get("step") == 2 for r in rs))
    d.drain()

    replay(tmp_path / "run", mode="offline")
    (run_file,) = _offline_runs(log_dir)
    deadline = time.monotonic() + 120
    while not is_finished(run_file.parent) and time.monotonic() < deadline:
        time.sleep(0.2)
    rows = [{tuple(i.nested_key) or (i.key,): json.loads(i.value_json) for i in rec.history.item}
            for rec in records(run_file) if rec.WhichOneof("record_type") == "history"]
    steps = [r for r in rows if ("train/loss",) in r]
    assert [(r[("train/step",)], r[("a", "b")], r[("a/b",)]) for r in steps] == [(1, 2.0, 1.0), (2, 4.0, 2.0)], steps
    assert not [k for r in rows for k in r if k[0].endswith("#2")]


@pytest.mark.parametrize("case", ["no-key", "bad-key", "unreachable"])
def test_w_and_b_refusing_or_unreachable_is_one_line(tmp_path, case):
    """`telemetry replay RUN --wandb online`, its main use, raised W&B's UsageError (no API key),
    AuthenticationError (a key W&B refuses) or CommError (no network) as a traceback. Each is
    one line now: exit 2 for the key (the user's to fix), 1 for a W&B that cannot be reached."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    log_dir = tmp_path / "run" / "telemetry"
    log_dir.mkdir(parents=True)
    (log_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"kind": "metrics", "t": 1.7e9 + s, "step": s, "values": {"train/loss": 1.0 / s}}) + "\n"
        for s in range(1, 4)))
    home = tmp_path / "home"           # no ~/.netrc: no key but the one given here
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(home), WANDB_DIR=str(tmp_path / "wandb"), WANDB_CONFIG_DIR=str(home / "wandb-config"))
    env.update({"no-key": {}, "bad-key": {"WANDB_API_KEY": "abc"},
                "unreachable": {"WANDB_API_KEY": "a" * 40, "WANDB_BASE_URL": "http://127.0.0.1:9",
                                "WANDB_INIT_TIMEOUT": "3"}}[case])
    p = subprocess.run([sys.executable, "-m", "telemetry", "replay", str(tmp_path / "run"), "--wandb", "online",
                        "--run-id", "r1"], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert "Traceback" not in p.stderr, p.stderr
    ours = [ln for ln in p.stderr.splitlines() if ln.startswith("telemetry replay: ")]
    assert len(ours) == 1, p.stderr
    if case == "unreachable":
        assert p.returncode == 1 and "W&B failed: " in ours[0] and "127.0.0.1:9" in ours[0], (p.returncode, p.stderr)
    else:
        assert p.returncode == 2 and "W&B refused: " in ours[0] and "API key" in ours[0], (p.returncode, p.stderr)
