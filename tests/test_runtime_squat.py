"""Another local user makes `telemetry-<your uid>` in the temporary directory first (after a
reboot or a /tmp clean): `telemetry run`, a `telemetry.wandb` script's own daemon and the
consumers go on, in a private directory of the user's instead, and keep every row; nothing
prints a traceback. Real processes; the other user is uid 65534 (tests/other_user.py).

The temporary directory here is the test's own ($TMPDIR, which the runtime directory follows),
sticky and writable by all like /tmp: the real /tmp/telemetry-<uid> that other tests use is
never touched."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from daemon_util import step_values
from other_user import OTHER_UID, SYSTEM_PYTHON, can_act_as_other_user

ROOT = Path(__file__).resolve().parent.parent
HOST = os.uname().nodename
N_ROWS = 200

pytestmark = pytest.mark.skipif(not can_act_as_other_user(), reason="needs root to act as another user")

SCRIPT = """
import sys
import telemetry.wandb as wandb

wandb.init(project="p")
for i in range(int(sys.argv[1])):
    wandb.log({"train/loss": 3.0 - 0.01 * i}, step=i)
wandb.finish()
"""


@pytest.fixture
def squatted(tmp_path):
    """(the temporary directory, whose telemetry-<uid> another user made first; a home)."""
    tmp = Path(tempfile.mkdtemp(prefix="tsq-", dir="/tmp"))     # short: socket paths stay < 107 bytes
    try:
        tmp.chmod(0o1777)
        name = tmp / f"telemetry-{os.getuid()}"
        _mkdir_as_other_user(name)
        home = tmp / "h"
        home.mkdir(mode=0o700)
        yield tmp, home
        assert name.stat().st_uid == OTHER_UID and not list(name.iterdir())     # theirs, untouched
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _mkdir_as_other_user(path: Path) -> None:
    subprocess.run([SYSTEM_PYTHON, "-I", "-c", f"import os; os.mkdir({str(path)!r}, 0o700)"], user=OTHER_UID,
                   group=OTHER_UID, cwd="/", check=True, timeout=60)
    assert path.stat().st_uid == OTHER_UID


def _env(tmp: Path, home: Path | None, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TELEMETRY_", "XDG_")) and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "HOME")}
    env.update({"TMPDIR": str(tmp), "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
                **extra})
    if home is not None:
        env["HOME"] = str(home)
    return env


def _rows_kept(log_dir: Path) -> None:
    steps = step_values(log_dir)
    assert sorted(steps) == list(range(N_ROWS))
    assert all(steps[i]["train/loss"] == 3.0 - 0.01 * i for i in range(N_ROWS))
    final = json.loads((log_dir / "drain.json").read_text())
    assert final["records_lost"] == 0, final


@pytest.mark.parametrize("home_kind", ["home", "no home", "a home too long for a socket path"])
def test_telemetry_run_goes_on_and_keeps_every_row(squatted, tmp_path, home_kind):
    tmp, home = squatted
    if home_kind == "no home":
        home = None
    elif home_kind != "home":
        home = home / ("h" * 60)
        home.mkdir(mode=0o700)
    (tmp_path / "train.py").write_text(textwrap.dedent(SCRIPT))
    out = subprocess.run([sys.executable, "-m", "telemetry", "run", "--run-dir", str(tmp_path / "r"), "--quiet",
                          "--", "train.py", str(N_ROWS)], cwd=tmp_path,
                         env=_env(tmp, home), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    _rows_kept(tmp_path / "r")
    runtime = Path(re.search(r"TELEMETRY_RUNTIME_DIR=(\S+) telemetry tail", out.stderr).group(1))
    if home_kind == "home":     # the user's own fallback, found again by any later process
        assert runtime.parent == home / ".cache" / "telemetry" / HOST, out.stderr
    else:       # a directory of a name nobody could guess, handed to the run's processes
        assert runtime.parent == tmp and runtime.name.startswith("telemetry-run-"), out.stderr
    assert not runtime.exists()                       # removed with the run


def test_a_wandb_script_starts_its_daemon_and_keeps_every_row(squatted, tmp_path):
    tmp, home = squatted
    (tmp_path / "train.py").write_text(textwrap.dedent(SCRIPT))
    env = _env(tmp, home, WANDB_MODE="offline", WANDB_DIR=str(tmp_path), WANDB_SILENT="true")
    out = subprocess.run([sys.executable, "train.py", str(N_ROWS)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert "not kept" not in out.stderr, out.stderr
    started = re.findall(r"telemetry daemon started \(pid \d+\), writing to (\S+);", out.stderr)
    assert len(started) == 1, out.stderr
    log_dir = Path(started[0])
    _rows_kept(log_dir)
    ready = (log_dir / "daemon.out").read_text()
    assert f"ingest=ipc://{home / '.cache' / 'telemetry' / HOST}/" in ready, ready


def test_a_daemon_and_its_consumers_find_the_same_directory(squatted, tmp_path):
    """`telemetry daemon`, `telemetry status` and `telemetry drain` each choose the directory on
    their own, from the same environment."""
    tmp, home = squatted
    env = _env(tmp, home)
    daemon = subprocess.Popen([sys.executable, "-m", "telemetry", "daemon", "--log-dir", str(tmp_path / "d"),
                               "--wandb", "disabled"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120            # a hang detector
        line = ""
        while "telemetry daemon ready" not in line:
            line = daemon.stdout.readline()
            assert line or daemon.poll() is None, "the daemon ended before its ready line"
            assert time.monotonic() < deadline
        assert f"control=ipc://{home / '.cache' / 'telemetry' / HOST}/default/control.sock" in line, line
        status = subprocess.run([sys.executable, "-m", "telemetry", "status", "--json", "--timeout", "60"],
                                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["pid"] == daemon.pid
        drain = subprocess.run([sys.executable, "-m", "telemetry", "drain", "--timeout", "60"], cwd=tmp_path,
                               env=env, capture_output=True, text=True, timeout=120)
        assert drain.returncode == 0, drain.stderr
        assert daemon.wait(120) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


def test_a_client_on_tcp_keeps_its_stacks_file(squatted, tmp_path):
    """Its stacks file (what the daemon reads when a rank hangs) is in the user's directory too,
    not at a second fixed name in the temporary directory that another user can make first."""
    tmp, home = squatted
    _mkdir_as_other_user(tmp / f"telemetry-stacks-{os.getuid()}")
    code = ("import json, telemetry\n"
            "tm = telemetry.TelemetryClient('tcp://127.0.0.1:9', rank=0)\n"
            "print(json.dumps(tm._stacks_hello))\n"
            "tm.close(timeout_s=0.5)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(tmp, home), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    hello = json.loads(out.stdout.strip().splitlines()[-1])
    assert "stacks_unavailable" not in hello, hello
    assert Path(hello["stacks_file"]).parent == home / ".cache" / "telemetry" / HOST / "stacks", hello
