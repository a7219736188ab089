"""What the command line says to a person at a terminal, with real processes: drain's summary
(and its JSON for scripts), status with no daemon, a taken HTTP port, TensorBoard turned on
without its package, a stdout whose reader left or that cannot be written."""
from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from daemon_util import ROOT
from telemetry.client import TelemetryClient

HANG_S = 120


def _telemetry(*argv: str, env: dict | None = None, timeout: float = HANG_S) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "telemetry", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def _log_steps(d, num_steps: int) -> None:
    tm = TelemetryClient(d.ingest, rank=0)
    try:
        for s in range(1, num_steps + 1):
            tm.log(s, {"train/loss": 1.0 / s})
    finally:
        tm.close()
    d.wait_for(lambda recs: any(r.get("step") == num_steps for r in recs), kind="metrics")


def test_drain_prints_a_summary_and_json_only_when_asked(make_daemon):
    d = make_daemon()
    _log_steps(d, 20)
    p = _telemetry("drain", "--control", d.control)
    assert p.returncode == 0, p.stderr
    d.proc.wait(HANG_S)
    with pytest.raises(ValueError):
        json.loads(p.stdout)                       # words for a person, not one line of JSON
    text = p.stdout
    final = json.loads((d.log_dir / "drain.json").read_text())      # what it summarises
    assert f"records in {final['records_in']:,}" in text, text
    assert f"{final['sinks']['jsonl']['written']:,} written" in text, text
    assert "lost none" in text and final["records_lost"] == 0, text
    assert "drain request" in text and str(d.log_dir) in text, text
    assert all(f"sink {name}" in text for name in final["sinks"]), text
    assert all(len(ln.replace(str(d.log_dir), "")) < 120 for ln in text.splitlines()), text

    d2 = make_daemon()
    _log_steps(d2, 5)
    p = _telemetry("drain", "--json", "--control", d2.control)
    assert p.returncode == 0, p.stderr
    d2.proc.wait(HANG_S)
    got = json.loads(p.stdout)
    assert got["drained"] is True and got == json.loads((d2.log_dir / "drain.json").read_text())


def test_status_with_no_daemon_says_where_it_looked_and_how_to_look_elsewhere(tmp_path):
    """The default socket directory is chosen per user (userdir.py) and per run: a `telemetry
    run` has one of its own, which a bare `telemetry status` cannot know."""
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TELEMETRY_")}
    env.update(XDG_RUNTIME_DIR=str(xdg), TELEMETRY_RUN_NAME="mine")
    other = xdg / "telemetry" / "run-abc"
    other.mkdir(parents=True, mode=0o700)
    (other / "control.sock").touch()            # another run's socket there (never answers)
    lock = os.open(other / "daemon.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)            # ... and its daemon alive, as this process stands for
    dead = xdg / "telemetry" / "run-dead"       # a run whose daemon was SIGKILLed: its files, no daemon
    dead.mkdir(mode=0o700)
    (dead / "control.sock").touch()
    (dead / "daemon.lock").touch()
    try:
        p = subprocess.run([sys.executable, "-m", "telemetry", "status", "--timeout", "0.5"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=HANG_S)
    finally:
        os.close(lock)
    assert p.returncode == 1 and p.stdout == "" and "Traceback" not in p.stderr, p.stderr
    line, = p.stderr.strip().splitlines()
    assert f"ipc://{xdg}/telemetry/mine/control.sock" in line, line
    assert "$TELEMETRY_RUNTIME_DIR" in line and "--control" in line and "'mine'" in line, line
    assert f"TELEMETRY_RUNTIME_DIR={other}" in line, line     # where the other run's sockets are
    assert str(dead) not in line, line


@pytest.mark.parametrize("cmd", ["dashboard", "export-prometheus"])
def test_a_taken_port_is_said_with_the_way_to_a_free_one(tmp_path, cmd):
    """One line and exit 2, as the daemon's taken endpoint is: the --port given is the user's to
    change (both exited 1)."""
    sockets = Path(tempfile.mkdtemp(prefix="tcli-", dir="/tmp"))
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "metrics.jsonl").write_text("")
        args = [str(tmp_path / "run")] if cmd == "dashboard" else ["--pub", f"ipc://{sockets}/pub.sock"]
        p = _telemetry(cmd, *args, "--port", str(port))
    finally:
        taken.close()
        os.rmdir(sockets)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    line, = p.stderr.strip().splitlines()
    assert f"port {port}" in line and "taken" in line and "--port 0" in line, line


def test_tensorboard_turned_on_without_its_package_is_refused_at_start(tmp_path):
    """One line naming the extra that installs it, exit 2, before anything is bound: not a
    daemon that runs and drops every TensorBoard record."""
    import tomllib

    hide = tmp_path / "hide"
    hide.mkdir()
    # `tensorboard` cannot be found in this interpreter (importlib's "halted" marker).
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['tensorboard'] = None\n")
    (tmp_path / "d.yaml").write_text("tensorboard: {enabled: true}\n")
    sockets = Path(tempfile.mkdtemp(prefix="tcli-", dir="/tmp"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(hide), os.environ.get("PYTHONPATH")]))}
    eps = [a for n in ("ingest", "pub", "control") for a in (f"--{n}", f"ipc://{sockets}/{n}.sock")]
    proc = subprocess.Popen([sys.executable, "-m", "telemetry", "daemon", "--wandb", "disabled", "--log-dir",
                             str(tmp_path / "t"), "--config", str(tmp_path / "d.yaml"), *eps],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=HANG_S)    # the old daemon ran on: a hang, killed below
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for f in sockets.iterdir():
            f.unlink()
        sockets.rmdir()
    assert proc.returncode == 2 and "telemetry daemon ready" not in out, (proc.returncode, out, err)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "tensorboard" in project["optional-dependencies"]
    lines = [ln for ln in err.strip().splitlines() if " INFO " not in ln]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"pip install '{project['name']}[tensorboard]'" in lines[0], lines[0]


# -- stdout that cannot be written: a reader that left, a full disk ---------------------------
def _a_small_run(tmp_path) -> Path:
    from test_cli_bad_input import small_run

    return small_run(tmp_path)


def _stdout_cases(tmp_path) -> list[list[str]]:
    run = _a_small_run(tmp_path)
    return [["metrics"], ["goodput", str(run)], ["report", str(run), "--out", str(tmp_path / "out")],
            ["keygen", "--dir", str(tmp_path / "keys"), "--name", "k", "--force"],
            # argparse's own output: it dropped a failed write and exited 0
            ["--help"], ["report", "--help"], ["--version"]]


def _prog(argv: list[str]) -> str:
    """How the command names itself: `telemetry report`, or `telemetry` for the top level."""
    from telemetry.cli import COMMANDS

    return " ".join(["telemetry", *[a for a in argv[:1] if a in COMMANDS]])


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "PYTHONUNBUFFERED"])
def test_a_reader_that_left_ends_the_command_quietly(tmp_path, buffered):
    """`telemetry metrics | head -c 5`: whether the print or Python's flush at exit met the closed
    pipe depended on when head left; either was a BrokenPipeError traceback (or "Exception
    ignored" and exit 120). The read end is closed before the command starts, so every write
    meets it: nothing on stderr, exit 141 as for a process that SIGPIPE ended."""
    from telemetry.cli import EXIT_READER_LEFT

    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    for argv in _stdout_cases(tmp_path):
        r, w = os.pipe()
        os.close(r)
        try:
            p = subprocess.run([sys.executable, "-m", "telemetry", *argv], cwd=ROOT, stdout=w, stderr=subprocess.PIPE,
                               text=True, timeout=HANG_S, env=env)
        finally:
            os.close(w)
        assert (p.returncode, p.stderr) == (EXIT_READER_LEFT, ""), (argv, p.returncode, p.stderr[-2000:])


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="/dev/full (Linux) is the disk that is always full")
@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "PYTHONUNBUFFERED"])
def test_a_stdout_that_cannot_be_written_is_one_line(tmp_path, buffered):
    """`telemetry goodput RUN > /dev/full` was an OSError traceback (ENOSPC), and
    `telemetry --help > /dev/full` exit 0; now one line naming the command and why, exit 1."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    for argv in _stdout_cases(tmp_path):
        with open("/dev/full", "w") as full:
            p = subprocess.run([sys.executable, "-m", "telemetry", *argv], cwd=ROOT, stdout=full,
                               stderr=subprocess.PIPE, text=True, timeout=HANG_S, env=env)
        assert p.returncode == 1, (argv, p.returncode, p.stderr[-2000:])
        assert p.stderr.splitlines() == [f"{_prog(argv)}: cannot write stdout: No space left on device"], \
            (argv, p.stderr[-2000:])


# -- "-" is stdout -------------------------------------------------------------------------------
def test_an_output_file_of_dash_is_stdout(tmp_path):
    """`telemetry goodput RUN --json -` wrote a file named "-" in the working directory; now the
    JSON alone on stdout (a script parses it), the same as --json FILE writes. An output that
    is a directory (report --out) refuses "-" in one line: tests/test_cli_bad_input.py sweeps it."""
    run = _a_small_run(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    p = subprocess.run([sys.executable, "-m", "telemetry", "goodput", str(run), "--json", "-"], cwd=work,
                       capture_output=True, text=True, timeout=HANG_S, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0 and p.stderr == "", (p.returncode, p.stderr[-2000:])
    assert list(work.iterdir()) == [], list(work.iterdir())
    to_file = _telemetry("goodput", str(run), "--json", str(tmp_path / "g.json"))
    assert to_file.returncode == 0, to_file.stderr[-2000:]
    assert json.loads(p.stdout) == json.loads((tmp_path / "g.json").read_text())
