"""A live run directory is one daemon's (telemetry/shared/run_lock.py): a second daemon or a
second `telemetry run` into it is refused, one line and exit 2, before it writes anything there;
once the first has ended, a new run into it continues the directory as before. Real processes."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from daemon_util import start_daemon, step_values
from testkit.daemon_proc import daemon_command

import telemetry

ROOT = Path(__file__).resolve().parent.parent

# A telemetry.wandb script; with a GATE file named, it waits for the file before it ends (a run
# that stays live while the test starts another into its directory).
SCRIPT = """
import os, sys, time
import telemetry.wandb as wandb

wandb.init(project="p")
base = float(sys.argv[1])
for i in range(int(sys.argv[2])):
    wandb.log({"train/loss": base + i}, step=i)
gate = os.environ.get("GATE")
if gate:
    open(gate + ".waiting", "w").close()
    deadline = time.monotonic() + 300
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)
wandb.finish()
"""


def _env(tmp_path: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TELEMETRY_") and k not in ("RANK", "WORLD_SIZE")}
    env.update({"WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **extra})
    return env


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s      # a hang detector
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


@pytest.fixture
def short_dir():
    """Short private directories under /tmp (socket paths stay < 107 bytes), removed after."""
    made: list[str] = []

    def make(prefix: str = "tmlk-") -> str:
        made.append(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
        return made[-1]

    yield make
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


def test_a_second_daemon_on_a_live_log_dir_is_refused_and_writes_nothing_there(tmp_path, short_dir):
    log_dir = tmp_path / "run"
    first = start_daemon(tmp_path, log_dir=log_dir, run_name="first")
    try:
        tm = telemetry.TelemetryClient(first.ingest, rank=0)
        for step in range(5):
            tm.log(step, {"train/loss": 1.0 + step})
        tm.close()
        rt = Path(short_dir())
        cmd = daemon_command(log_dir, *(f"ipc://{rt}/{n}.sock" for n in ("ingest", "pub", "control")),
                             extra_args=("--run-name", "second"))
        second = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "WANDB_MODE": "disabled"}, capture_output=True,
                                text=True, timeout=60)      # old: it served (a hang)
        assert second.returncode == 2, second.stderr
        assert second.stdout == "" and len(second.stderr.splitlines()) == 1, second.stderr
        assert f"pid {first.proc.pid}" in second.stderr and "live telemetry daemon" in second.stderr, second.stderr
        assert not list(rt.iterdir())                     # it bound nothing either
        final = first.drain()
    finally:
        first.cleanup()
    assert final["run_name"] == "first" and final["records_lost"] == 0, final
    assert final["run"]["incarnations"] == 1, final["run"]          # nobody "continued" it meanwhile
    log = (log_dir / "daemon.log").read_text()
    assert log.count("telemetry.daemon: ready: ") == 1, log             # one daemon served the directory
    assert step_values(log_dir) == {s: {"train/loss": 1.0 + s} for s in range(5)}


def test_a_second_telemetry_run_into_a_live_run_dir_is_refused(tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent(SCRIPT))
    run_dir = tmp_path / "runs" / "x"
    gate = tmp_path / "gate"
    first = subprocess.Popen([sys.executable, "-m", "telemetry", "run", "--run-dir", str(run_dir), "--quiet", "--",
                              "train.py", "0", "6"], cwd=tmp_path, env=_env(tmp_path, GATE=str(gate)),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(Path(str(gate) + ".waiting"), first)
        out_before = (run_dir / "daemon.out").read_bytes()
        second = subprocess.run([sys.executable, "-m", "telemetry", "run", "--run-dir", str(run_dir), "--", "train.py",
                                 "100", "6"], cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True,
                                timeout=300)
        assert second.returncode == 2, second.stderr[-3000:]
        assert len(second.stderr.splitlines()) == 1 and "Traceback" not in second.stderr, second.stderr
        assert second.stderr.startswith(f"telemetry run: --run-dir {run_dir} is the run directory of a live "
                                        f"telemetry daemon"), second.stderr
        # Nothing of the second there: the first daemon's own lines may have grown it meanwhile
        # (its periodic progress), never a second daemon's start or the refusal.
        out_after = (run_dir / "daemon.out").read_bytes()
        added = out_after[len(out_before):]
        assert out_after.startswith(out_before), out_after[-3000:]
        assert not any(t in added for t in (b"daemon ready", b"live telemetry daemon", b"Traceback")), added[-3000:]
        gate.touch()
        _, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, err[-3000:]
    # One run in the file: its six steps, once each, with its own values.
    assert step_values(run_dir) == {s: {"train/loss": float(s)} for s in range(6)}
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if '"kind":"metrics"' in line and '"rank"' not in line]
    assert sorted(steps) == list(range(6)), steps


def test_a_run_into_the_directory_after_the_first_ended_continues_it(tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent(SCRIPT))
    run_dir = tmp_path / "runs" / "x"
    for base in ("0", "100"):
        out = subprocess.run([sys.executable, "-m", "telemetry", "run", "--run-dir", str(run_dir), "--quiet", "--",
                              "train.py", base, "3"], cwd=tmp_path, env=_env(tmp_path), capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
    final = json.loads((run_dir / "drain.json").read_text())
    assert final["run"]["incarnations"] == 2 and final["records_lost"] == 0, final["run"]


def test_a_scripts_own_daemon_refused_by_a_live_run_dir_is_said_not_taken_for_started(tmp_path, short_dir):
    """Two drop-in scripts with one run id and one $TELEMETRY_DIR, but each its own runtime
    directory: the second's daemon is refused. The script must not take the first daemon's ready
    line in the shared daemon.out for its own (its rows would go to a socket nobody serves)."""
    (tmp_path / "train.py").write_text(textwrap.dedent(SCRIPT))
    gate = tmp_path / "gate"

    def env(rt: str, **extra: str) -> dict:
        return _env(tmp_path, WANDB_MODE="offline", WANDB_DIR=str(tmp_path), WANDB_SILENT="true",
                    WANDB_RUN_ID="samerun", TELEMETRY_DIR=str(tmp_path / "runs"),
                    TELEMETRY_RUNTIME_DIR=short_dir(f"tmlk{rt}-"), **extra)

    first = subprocess.Popen([sys.executable, "train.py", "0", "4"], cwd=tmp_path, env=env("a", GATE=str(gate)),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(Path(str(gate) + ".waiting"), first)
        second = subprocess.run([sys.executable, "train.py", "100", "4"], cwd=tmp_path, env=env("b"),
                                capture_output=True, text=True, timeout=300)
        assert second.returncode == 0 and "Traceback" not in second.stderr, second.stderr[-3000:]
        assert "no daemon could be started" in second.stderr and "live telemetry daemon" in second.stderr, \
            second.stderr[-3000:]
        assert "telemetry daemon started" not in second.stderr, second.stderr[-3000:]
        gate.touch()
        _, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, err[-3000:]
    assert step_values(tmp_path / "runs" / "samerun") == {s: {"train/loss": float(s)} for s in range(4)}
