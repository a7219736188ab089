"""Paths given to the consumers (and the run files they read) that are not regular files: a FIFO
nobody writes or reads, /dev/zero. None of them is waited on or read without end; bad input is
one line and exit 2."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HANG_S = 60          # a hang detector, not a timing


def _telemetry(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "telemetry", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=HANG_S, env={**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"})


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "metrics", "t": 1700000000.0, "step": 1,
                                                   "values": {"train/loss": 1.0}}) + "\n")
    return run


def _returns(fn, *args):
    """fn(*args) on a thread; its result, or AssertionError when it is still blocked after HANG_S."""
    got = []
    t = threading.Thread(target=lambda: got.append(fn(*args)), daemon=True)
    t.start()
    t.join(HANG_S)
    assert not t.is_alive(), f"{fn.__name__} blocked"
    return got[0]


def test_goodput_json_to_a_fifo_nobody_reads_is_refused(tmp_path):
    run = _run_dir(tmp_path)
    os.mkfifo(tmp_path / "out.json")
    out = _telemetry("goodput", str(run), "--json", "out.json", cwd=tmp_path)      # old: waited for a reader
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
    assert "--json out.json: a FIFO that nobody reads" in out.stderr and "Traceback" not in out.stderr


def test_goodput_json_to_a_reader_and_to_a_file(tmp_path):
    """What --json is for still works: a pipe with a reader (/dev/stdout), and a file, whose
    older, longer content is replaced, not overwritten in part."""
    run = _run_dir(tmp_path)
    piped = _telemetry("goodput", str(run), "--json", "/dev/stdout", cwd=tmp_path)
    assert piped.returncode == 0, piped.stderr
    assert '"note": "no step records"' in piped.stdout, piped.stdout
    (tmp_path / "out.json").write_text("x" * 100_000)
    out = _telemetry("goodput", str(run), "--json", "out.json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "out.json").read_text())["note"] == "no step records"


@pytest.mark.parametrize("cmd", ["report", "replay", "goodput"])
def test_a_directory_without_a_run_is_bad_input(tmp_path, cmd):
    (tmp_path / "empty").mkdir()
    out = _telemetry(cmd, "empty", cwd=tmp_path)       # old: report and replay exited 1
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, (out.returncode, out.stderr)
    assert "no metrics.jsonl in empty" in out.stderr


@pytest.mark.parametrize("cmd", ["report", "replay", "goodput", "dashboard"])
@pytest.mark.parametrize("what", ["fifo", "/dev/zero"])
def test_a_run_dir_argument_that_is_a_fifo_or_a_device(tmp_path, cmd, what):
    if what == "fifo":
        os.mkfifo(tmp_path / "fifo")
    out = _telemetry(cmd, what, cwd=tmp_path)
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr


def test_the_dashboard_does_not_wait_on_a_fifo_at_drain_json(tmp_path):
    from telemetry.consumers.dashboard.live import _drained_at

    os.mkfifo(tmp_path / "drain.json")
    assert _returns(_drained_at, tmp_path) is None          # old: blocked until a writer came
    os.unlink(tmp_path / "drain.json")
    (tmp_path / "drain.json").write_text(json.dumps({"stop_reason": "drain request"}))
    assert _returns(_drained_at, tmp_path) == (tmp_path / "drain.json").stat().st_mtime


def test_an_offline_wandb_file_that_is_a_fifo_is_not_waited_on(tmp_path):
    from telemetry.consumers.wandb_offline import is_finished

    run = tmp_path / "offline-run-x"
    run.mkdir()
    os.mkfifo(run / "run-x.wandb")
    assert _returns(is_finished, run) is False                # old: blocked until a writer came
