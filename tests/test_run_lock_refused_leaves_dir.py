"""A daemon refused a run directory (run_lock.py) leaves the directory as it found it: it takes
the lock before it writes or chmods anything there (daemon.log, the write probe, the directory's
mode), so a team's group-shared directory is not closed to the team by a refused start. And a
run.lock that is not this user's own file is not taken for a daemon of ours, nor its text (a
pid anyone could have written) repeated as one. Real daemon processes."""
from __future__ import annotations

import fcntl
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from testkit.daemon_proc import daemon_command

from telemetry.shared import run_lock

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def rt():
    """A short private runtime directory under /tmp (socket paths stay < 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="tmrl-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _daemon(log_dir: Path, rt: Path) -> subprocess.CompletedProcess:
    cmd = daemon_command(log_dir, *(f"ipc://{rt}/{n}.sock" for n in ("ingest", "pub", "control")))
    return subprocess.run(cmd, cwd=ROOT, env={**os.environ, "WANDB_MODE": "disabled"}, capture_output=True,
                          text=True, timeout=120)     # a hang detector


def _shared_dir(tmp_path: Path) -> Path:
    """A team's run directory: setgid, group-writable (2770)."""
    d = tmp_path / "team-run"
    d.mkdir()
    d.chmod(0o2770)
    return d


def _held_lock(path: Path, text: bytes, mode: int = 0o600) -> int:
    """run.lock held (flock) by this test process, as a live run would hold it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, mode)
    os.fchmod(fd, mode)
    os.write(fd, text)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def test_a_refused_daemon_changes_nothing_in_a_group_shared_run_dir(tmp_path, rt):
    d = _shared_dir(tmp_path)
    fd = _held_lock(d / "run.lock", f"{os.getpid()}\n".encode())
    try:
        out = _daemon(d, rt)
    finally:
        os.close(fd)
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
    assert f"live telemetry daemon (pid {os.getpid()})" in out.stderr, out.stderr
    # Old code: daemon.log made and the directory chmod-ed 2700 before the lock was tried.
    assert sorted(p.name for p in d.iterdir()) == ["run.lock"]
    assert stat.S_IMODE(d.stat().st_mode) == 0o2770, oct(d.stat().st_mode)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_run_lock_of_another_user_is_refused_not_trusted(tmp_path, rt):
    from other_user import OTHER_UID

    d = _shared_dir(tmp_path)
    fd = _held_lock(d / "run.lock", b"31337\n", 0o644)
    os.fchown(fd, OTHER_UID, OTHER_UID)      # a group member made it (and holds it)
    try:
        out = _daemon(d, rt)
    finally:
        os.close(fd)
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"another user's file (uid {OTHER_UID})" in out.stderr and "31337" not in out.stderr, out.stderr
    assert sorted(p.name for p in d.iterdir()) == ["run.lock"]
    assert stat.S_IMODE(d.stat().st_mode) == 0o2770


def test_the_pid_in_a_run_lock_others_could_write_is_not_repeated(tmp_path):
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    fd = _held_lock(d / "run.lock", b"31337\n", 0o666)
    try:
        with pytest.raises(run_lock.RunDirInUse) as err:
            run_lock.hold(d)
    finally:
        os.close(fd)
    assert "31337" not in str(err.value) and "writable by others" in str(err.value), err.value
    assert stat.S_IMODE((d / "run.lock").stat().st_mode) == 0o666      # a refused hold changes nothing


def test_the_lock_once_taken_gives_the_directory_and_lock_file_the_run_modes(tmp_path):
    d = _shared_dir(tmp_path)
    (d / "run.lock").write_text("31337\n")
    (d / "run.lock").chmod(0o666)
    fd = run_lock.hold(d)
    try:
        assert os.pread(fd, 32, 0) == f"{os.getpid()}\n".encode()
    finally:
        os.close(fd)
    assert stat.S_IMODE((d / "run.lock").stat().st_mode) == 0o600
    assert stat.S_IMODE(d.stat().st_mode) == 0o2700        # setgid kept; private, as configured by default
