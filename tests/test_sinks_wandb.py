"""W&B in offline mode really receives the steps: read the offline run's .wandb file back.

Read back with tests/wandb_offline.py: wandb 0.31 has no Python reader for .wandb files any
more, so it walks the file's LevelDB-style log framing and parses each record with wandb's own
protobuf class (wandb.proto.wandb_internal_pb2.Record).
"""
from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest

from telemetry.client import TelemetryClient
from telemetry.shared.wandb_ids import stable_run_id
from wandb_offline import config, history_rows, run_ids, wait_finished

pytest.importorskip("wandb")


def _run(make_daemon, log_dir, steps, hello_cfg):
    d = make_daemon(wandb="offline", world_size=2, log_dir=log_dir, run_name="wb-test")
    clients = [TelemetryClient(d.ingest, rank=r) for r in range(2)]
    for c in clients:
        c.hello({"world_size": 2, "config": hello_cfg, "model": {"name": "tiny"}})
    for s in steps:
        for r, c in enumerate(clients):
            c.log(s, {"train/loss": 1.0 + s + r, "perf/tokens": 10})
    for c in clients:
        c.close()
    d.wait_for(lambda recs: steps[-1] in {r.get("step") for r in recs}, kind="metrics")
    assert d.stop(timeout_s=60) == 0
    return d


def _wandb_file(log_dir, run_id):
    files = sorted(glob.glob(str(log_dir / "wandb" / f"offline-run-*-{run_id}" / f"run-{run_id}.wandb")))
    assert files, f"no offline run file for {run_id} under {log_dir}"
    return [wait_finished(f) for f in files]     # wandb's own process may still be writing them


def test_offline_run_holds_the_steps_config_and_a_stable_id(tmp_path, make_daemon):
    log_dir = tmp_path / "tel"
    _run(make_daemon, log_dir, list(range(5)), {"lr": 3e-4})
    run_id = (log_dir / "wandb_run_id").read_text().strip()
    assert run_id.startswith("tm-")
    (first,) = _wandb_file(log_dir, run_id)
    rows = [r for r in history_rows(first) if "train/loss" in r]
    assert [r["train/step"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["train/loss"] for r in rows] == pytest.approx([1.5 + s for s in range(5)])   # mean of 2 ranks
    assert all(r["perf/tokens"] == 20 for r in rows)
    cfg = config(first)
    assert cfg["config"] == {"lr": 3e-4} and cfg["model"] == {"name": "tiny"} and cfg["world_size"] == 2
    assert "pid" not in cfg and "src" not in cfg                      # per-process keys stay out
    assert run_ids(first) == [(run_id, False)]
    # A restarted daemon on the same log dir continues the same W&B run (same id, resume="allow").
    _run(make_daemon, log_dir, [5, 6], {"lr": 3e-4})
    files = _wandb_file(log_dir, run_id)
    assert len(files) == 2
    second = [f for f in files if f != first][0]
    assert [r["train/step"] for r in history_rows(second) if "train/loss" in r] == [5, 6]
    assert run_ids(second)[0][0] == run_id


def test_stable_run_id():
    assert stable_run_id("a") == stable_run_id("a") != stable_run_id("b")


def test_the_reader_takes_a_file_cut_anywhere_as_the_records_before_the_cut(tmp_path):
    """The tests read a .wandb file while wandb's core writes it: a file cut at any byte is the
    whole records before the cut, never a torn one parsed (a fresh-clone CI read one)."""
    import wandb

    from wandb_offline import read_records

    run = wandb.init(mode="offline", dir=str(tmp_path), project="p", id="cut", settings=wandb.Settings(silent=True))
    for s in range(40):
        run.log({"loss": 1.0 / (s + 1), "text": "x" * (s * 97)})
    run.finish()
    path = wait_finished(glob.glob(str(tmp_path / "wandb" / "offline-run-*-cut" / "run-cut.wandb"))[0])
    data = open(path, "rb").read()
    whole = [r.SerializeToString() for r in read_records(path)]
    cut = tmp_path / "cut.wandb"
    for end in range(7, len(data), 17):
        cut.write_bytes(data[:end])
        got = [r.SerializeToString() for r in read_records(cut)]
        assert got == whole[:len(got)], end



def test_status_of_an_offline_run_writes_nothing_to_the_runs_terminal(tmp_path):
    """`telemetry status` reads the W&B run's name, path and URL: asked for its URL, an offline
    W&B run logs "URL not available in offline run", and each status put such lines in the
    daemon's output, which `telemetry run` streams to the user's terminal. Offline, the URL is
    None (as W&B's) without asking."""
    import os
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "s.py").write_text("import sys, time\nfrom telemetry import TelemetryClient\n"
                                   "tm = TelemetryClient()\ntm.log(0, {'a': 1.0})\n"
                                   "print('logged', flush=True)\nsys.stdin.readline()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRY_", "WANDB_"))}
    env.update(PYTHONPATH=str(root), TELEMETRY_RUNTIME_DIR=str(tmp_path / "rt"))
    p = subprocess.Popen([sys.executable, "-m", "telemetry", "run", "--wandb", "offline", "--run-dir",
                          str(tmp_path / "r"), "--", "s.py"], cwd=tmp_path, env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        while "logged" not in p.stdout.readline():
            assert p.poll() is None
        status = [sys.executable, "-m", "telemetry", "status", "--json"]
        deadline = time.monotonic() + 120           # a hang detector: W&B's start
        while True:
            out = subprocess.run(status, env=env, capture_output=True, text=True, timeout=120)
            wandb_sink = json.loads(out.stdout)["sinks"]["wandb"] if out.returncode == 0 else {}
            if wandb_sink.get("opened"):
                break
            assert time.monotonic() < deadline, out.stdout[-3000:] + out.stderr[-3000:]
            time.sleep(0.5)
        for _ in range(2):
            subprocess.run(status, env=env, capture_output=True, text=True, timeout=120)
        assert wandb_sink["run"]["url"] is None and wandb_sink["run"]["id"]
        said, _ = p.communicate("\n", timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, said[-3000:]
    assert "URL not available" not in said, said[-3000:]
