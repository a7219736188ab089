"""Private by default (issue 26): another local user reads none of a run's files and lists none
of its directories, and the daemon says at start which of its sockets every local user can reach.

Real daemon processes, real files. "Another user" is uid 65534 (nobody): a reader process drops
to it, which needs root (as in CI); those tests skip otherwise.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from daemon_util import ROOT, start_daemon
from telemetry.client import TelemetryClient

from other_user import OTHER_UID
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="reading as another user needs root")
OPEN_WARNING = "open to every local user"

# Run as nobody: which of the paths it can read (a file) or list (a directory). A shell, not
# Python: the test's interpreter may live where nobody cannot run it.
_READER = 'for p; do if [ -d "$p" ]; then ls "$p"; else head -c 1 "$p"; fi >/dev/null 2>&1 && echo "$p"; done; exit 0'


def _readable_by_another_user(paths: list[Path]) -> list[str]:
    out = subprocess.run(["/bin/sh", "-c", _READER, "sh", *map(str, paths)], user=OTHER_UID, group=OTHER_UID,
                         extra_groups=[], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def _tree(top: Path) -> list[Path]:
    """`top` and everything under it, symlinks left out (nobody follows them into a private dir)."""
    out = [top]
    for root, dirs, files in os.walk(top):
        out += [Path(root) / n for n in dirs + files if not os.path.islink(Path(root) / n)]
    return out


def _public_run_dir() -> Path:
    """A run dir as `launch/run.sh` makes it (mkdir -p: 0755, its telemetry/ too), with the
    0644 files an older daemon left there, on a path another user can walk: pytest's own
    tmp_path is under a 0700 directory, where the test would pass whatever the daemon did."""
    base = Path(tempfile.mkdtemp(prefix="tpf-", dir="/tmp"))
    base.chmod(0o755)
    log_dir = base / "run" / "telemetry"
    log_dir.mkdir(parents=True)
    for d in (base / "run", log_dir):
        d.chmod(0o755)
    for name in ("metrics.jsonl", "daemon.log"):
        (log_dir / name).write_text("")
        (log_dir / name).chmod(0o644)
    return base


def _some_records(d) -> None:
    tm = TelemetryClient(d.ingest, rank=0)
    tm.hello({"config": {"lr": 3e-4, "data": "/datasets/private-corpus"}})
    for step in range(1, 31):
        tm.log(step, {"train/loss": 1.0 / step, "perf/tokens": 512})
    tm.event("checkpoint_saved", {"path": "/ckpt/step-30"})
    tm.close()
    d.wait_for(lambda recs: any(r.get("step") == 30 for r in recs), timeout_s=60, kind="metrics")


@pytest.fixture
def inherited_wandb_service():
    """A W&B service started by this process (umask 022), named in the environment the daemon
    inherits (WANDB_SERVICE), as when a script that ran wandb itself starts the daemon."""
    import wandb

    # A service of its own: one that an earlier test of this process started (an in-process
    # wandb.init) would be torn down below, and its name left in the environment would send every
    # later wandb.init of this process, and every script it starts, to a dead socket.
    wandb.teardown()
    os.environ.pop("WANDB_SERVICE", None)
    wandb.setup()
    assert os.environ.get("WANDB_SERVICE"), "wandb.setup() named no service: the case is not made"
    yield
    wandb.teardown()
    os.environ.pop("WANDB_SERVICE", None)     # dead now: the next wandb.init starts its own


@needs_root
@pytest.mark.parametrize("wandb_service", ["own", "inherited"])
def test_another_user_reads_no_file_of_a_daemon_run(tmp_path, request, wandb_service):
    if wandb_service == "inherited":
        request.getfixturevalue("inherited_wandb_service")
    base = _public_run_dir()
    run_dir, log_dir = base / "run", base / "run" / "telemetry"
    try:
        d = start_daemon(tmp_path, log_dir=log_dir, wandb="offline",
                         config={"tensorboard": {"enabled": True}, "jsonl": {"rotate_mb": 0.002}})
        try:
            _some_records(d)
            final = d.drain(timeout_s=60)
        finally:
            d.cleanup()
        assert final["records_in"] > 0
        report = subprocess.run([sys.executable, "-m", "telemetry", "report", str(run_dir)], cwd=ROOT,
                                capture_output=True, text=True, timeout=300)
        assert report.returncode == 0, report.stdout + report.stderr
        paths = _tree(log_dir)
        names = {p.name for p in paths}
        # What the test covers: the daemon's files, the rotated pieces, W&B's, TensorBoard's, the report's.
        assert {"metrics.jsonl", "metrics.jsonl.1", "daemon.log", "sources.json", "drain.json",
                "wandb_run_id", "index.html"} <= names, sorted(names)
        assert any("wandb" in p.parts[len(log_dir.parts):-1] for p in paths), "no W&B files: the test proves less"
        assert any(p.name.startswith("events.out.tfevents") for p in paths), "no TensorBoard files"
        # The reader works and the path to the run is open to it: only the run's own modes keep it out.
        assert _readable_by_another_user([run_dir]) == [str(run_dir)]
        assert _readable_by_another_user(paths) == []
        loose = {str(p.relative_to(base)): oct(stat.S_IMODE(p.lstat().st_mode)) for p in paths
                 if stat.S_IMODE(p.lstat().st_mode) & 0o077}
        assert not loose, f"readable or writable beyond the owner: {loose}"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@needs_root
def test_group_readable_runs_are_an_explicit_choice(tmp_path):
    base = _public_run_dir()
    log_dir = base / "run" / "telemetry"
    try:
        d = start_daemon(tmp_path, log_dir=log_dir, config={"files": {"group_readable": True}})
        try:
            _some_records(d)
            d.drain(timeout_s=60)
        finally:
            d.cleanup()
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in _tree(log_dir)}
        assert modes["telemetry"] == 0o750
        assert modes["metrics.jsonl"] == modes["daemon.log"] == modes["drain.json"] == 0o640, modes
        assert _readable_by_another_user(_tree(log_dir)) == []     # the group, never others
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_bad_files_setting_is_one_line_and_exit_2(tmp_path):
    cfg = tmp_path / "daemon.yaml"
    cfg.write_text("files:\n  group_readable: sometimes\n")
    out = subprocess.run([sys.executable, "-m", "telemetry", "daemon", "--config", str(cfg), "--log-dir",
                          str(tmp_path / "t"), "--wandb", "disabled"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "files.group_readable" in out.stderr and "Traceback" not in out.stderr + out.stdout


def test_the_daemon_says_at_start_which_sockets_every_local_user_can_reach(tmp_path):
    (tmp_path / "tcp").mkdir()
    (tmp_path / "ipc").mkdir()
    d = start_daemon(tmp_path / "tcp", transport="tcp")
    try:
        said = [line for line in d.output().splitlines() if OPEN_WARNING in line]
        assert len(said) == 1, d.output()
        assert f"ingest {d.ingest}" in said[0] and f"pub {d.pub}" in said[0] and "send it records" in said[0]
        assert "ipc" in said[0] and "curve_loopback" in said[0]           # how to close them
    finally:
        assert d.stop() == 0
    assert OPEN_WARNING in (tmp_path / "tcp" / "telemetry" / "daemon.log").read_text()
    d = start_daemon(tmp_path / "ipc")                                   # the default: private
    try:
        assert OPEN_WARNING not in d.output(), d.output()
    finally:
        assert d.stop() == 0
