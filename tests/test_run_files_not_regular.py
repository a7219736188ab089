"""What lies at a run file's name is not trusted to be a file: a FIFO, a device or a symlink there
(planted by another user in a shared log directory, or left by accident) never makes a telemetry
process block forever, read without end or write through the link.

Before: the daemon hung before "ready" on a FIFO at metrics.jsonl or daemon.log (open for
writing waits for a reader), appended through a symlink at metrics.jsonl to wherever it
pointed, and read sources.json whole (a FIFO: forever; a link to /dev/zero: until the OOM
killer); report, replay and the dashboard hung on a FIFO at metrics.jsonl and read a link to
/dev/zero without end. Real processes, real FIFOs, 120 s hang detectors.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from daemon_util import ROOT, start_daemon

HANG_S = 120


def _plant(path: Path, kind: str, target: Path) -> None:
    if kind == "fifo":
        os.mkfifo(path, 0o600)
    elif kind == "dev_zero":
        path.symlink_to("/dev/zero")
    else:                                  # a symlink to a file of someone's
        path.symlink_to(target)


def _telemetry(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-m", "telemetry", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=HANG_S, env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"telemetry {' '.join(args)} hung for {HANG_S} s: {exc.stderr!r:.2000}")


def _daemon(log_dir: Path, *extra: str) -> list[str]:
    rt = Path(tempfile.mkdtemp(prefix="trf-", dir="/tmp"))
    return ["daemon", "--wandb", "disabled", "--log-dir", str(log_dir), "--ingest", f"ipc://{rt}/i.sock",
            "--pub", f"ipc://{rt}/p.sock", "--control", f"ipc://{rt}/c.sock", *extra]


@pytest.mark.parametrize("name", ["metrics.jsonl", "daemon.log"])
@pytest.mark.parametrize("kind", ["fifo", "symlink", "dev_zero"])
def test_the_daemon_refuses_a_run_file_that_is_not_a_regular_file(tmp_path, name, kind):
    log_dir = tmp_path / "telemetry"
    log_dir.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("their file\n")
    _plant(log_dir / name, kind, victim)
    out = _telemetry(_daemon(log_dir))
    text = out.stdout + out.stderr
    assert out.returncode == 2 and "Traceback" not in text and "telemetry daemon ready" not in text, text
    assert str(log_dir) in text and ("not a regular file" in text or "symlink" in text), text
    assert victim.read_text() == "their file\n"                # nothing written through the link


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_a_sources_file_that_is_not_a_regular_file_is_not_read(tmp_path, kind):
    """sources.json is read at start (the predecessor's loss accounting): a FIFO there is not
    waited on, /dev/zero is not read; the daemon says so, starts, and drains as usual."""
    log_dir = tmp_path / "telemetry"
    log_dir.mkdir()
    _plant(log_dir / "sources.json", kind, tmp_path)
    # start_daemon reads the output on a thread: a select() on the pipe beside a buffered
    # readline() missed a ready line that came in the same chunk as the one before it.
    d = start_daemon(tmp_path, log_dir=log_dir, ready_timeout_s=HANG_S)
    try:
        drain = _telemetry(["drain", "--control", d.control])
        assert drain.returncode == 0, drain.stderr
        d.proc.wait(HANG_S)              # the drain's own exit
        d.stop()                         # (exited: no signal) the output read to its end
    finally:
        d.cleanup()
    text = d.output()
    assert d.proc.returncode == 0 and "Traceback" not in text, text
    assert "cannot read" in text and "sources.json" in text and "not a regular file" in text, text
    assert (log_dir / "sources.json").is_file() and not (log_dir / "sources.json").is_symlink()   # replaced


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_report_and_replay_skip_a_metrics_file_that_is_not_a_regular_file(tmp_path, kind):
    run = tmp_path / "run"
    log_dir = run / "telemetry"
    log_dir.mkdir(parents=True)
    (log_dir / "metrics.jsonl.1").write_text(
        '{"kind": "metrics", "t": 1700000000.0, "step": 1, "values": {"train/loss": 2.0}}\n')
    _plant(log_dir / "metrics.jsonl", kind, tmp_path)
    rep = _telemetry(["report", str(run), "--out", str(tmp_path / "report")])
    assert rep.returncode == 0 and "Traceback" not in rep.stderr, rep.stdout + rep.stderr
    assert "1 file(s) that are not regular files" in rep.stdout and "1 records from 2 file(s)" in rep.stdout, rep.stdout
    env = {"WANDB_DIR": str(tmp_path / "wandb"), "WANDB_SILENT": "true"}
    rp = _telemetry(["replay", str(run), "--wandb", "offline"], env=env)
    assert rp.returncode == 0 and "Traceback" not in rp.stderr, rp.stdout + rp.stderr


def test_the_dashboards_reader_does_not_wait_on_a_fifo(tmp_path):
    """The dashboard's history and live follower (readjsonl.Follower) in-process: a FIFO at
    metrics.jsonl is counted once and looked at again later, never opened for a read that waits."""
    import threading

    from telemetry.consumers.readjsonl import Follower, ReadStats

    log_dir = tmp_path / "telemetry"
    log_dir.mkdir()
    (log_dir / "metrics.jsonl.1").write_text(
        '{"kind": "metrics", "t": 1700000000.0, "step": 1, "values": {"train/loss": 2.0}}\n')
    os.mkfifo(log_dir / "metrics.jsonl")
    stats = ReadStats()
    f = Follower(log_dir, stats)
    got: list = []
    t = threading.Thread(target=lambda: got.extend([f.poll(), f.poll()]), daemon=True)
    t.start()
    t.join(HANG_S)
    assert not t.is_alive(), "Follower.poll() blocked on a FIFO"
    assert [r["step"] for r in got[0]] == [1] and got[1] == [] and stats.num_not_regular == 1, (got, stats)
    # Once a real file takes its place, it is read.
    os.unlink(log_dir / "metrics.jsonl")
    (log_dir / "metrics.jsonl").write_text(
        '{"kind": "metrics", "t": 1700000001.0, "step": 2, "values": {"train/loss": 1.0}}\n')
    assert [r["step"] for r in f.poll()] == [2]
    f.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
@pytest.mark.parametrize("where", ["theirs", "under_theirs", "under_their_sticky", "their_files"])
def test_a_log_dir_another_user_owns_or_can_swap_is_refused(tmp_path, where):
    """Not in the issue's list: the daemon wrote its run into a log directory another user owns
    (0777, theirs) or made one under a directory every user may write (no sticky bit). Its owner
    could delete or rename metrics.jsonl, or put a symlink at wandb/ or at the directory's name.
    Refused before ready, exit 2, nothing written. An outside attack found two more: a directory
    of every user's with the sticky bit but another user's (its owner may rename what is in it
    whatever the sticky bit), and files of another user's planted in a log directory of ours
    while it was open to them (hard-linked where they keep reading): neither is used either."""
    from other_user import OTHER_UID

    base = Path(tempfile.mkdtemp(prefix="trf-", dir="/tmp"))
    theirs = base / "theirs"
    theirs.mkdir()
    theirs.chmod(0o1777 if where == "under_their_sticky" else 0o777)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    planted = []
    if where == "their_files":
        theirs.chmod(0o755)
        os.chown(theirs, 0, 0)                  # ours, but once open to all: their files in it
        theirs.chmod(0o777)
        for name in ("daemon.log", "metrics.jsonl"):
            (theirs / name).touch()
            (theirs / name).chmod(0o666)
            os.chown(theirs / name, OTHER_UID, OTHER_UID)
            planted.append(theirs / name)
    log_dir = theirs if where in ("theirs", "their_files") else theirs / "run" / "telemetry"
    out = _telemetry(_daemon(log_dir))
    text = out.stdout + out.stderr
    assert out.returncode == 2 and "Traceback" not in text and "telemetry daemon ready" not in text, text
    assert ("writable by every user" if where == "under_theirs" else "owned by another user") in text, text
    if planted:
        assert all(p.stat().st_size == 0 for p in planted), [(p, p.read_bytes()[:200]) for p in planted]
    else:
        assert not list(theirs.rglob("*.jsonl")) and not list(theirs.rglob("daemon.log")), list(theirs.rglob("*"))


@pytest.mark.parametrize("name", ["wandb_run_id", "wandb_replay.json"])
def test_replay_does_not_wait_on_a_fifo_at_its_id_or_state_file(tmp_path, name):
    """Not in the issue's list: replay read the W&B run id the daemon kept, and its own state
    mark, whole and blocking (a FIFO there hung it; the daemon's W&B sink read the id the same
    way). Now: not a regular file, not read; the replay goes on and writes a real state file."""
    run = tmp_path / "run"
    log_dir = run / "telemetry"
    log_dir.mkdir(parents=True)
    (log_dir / "metrics.jsonl").write_text(
        '{"kind": "metrics", "t": 1700000000.0, "step": 1, "values": {"train/loss": 2.0}}\n')
    os.mkfifo(log_dir / name)
    env = {"WANDB_DIR": str(tmp_path / "wandb"), "WANDB_SILENT": "true"}
    rp = _telemetry(["replay", str(run), "--wandb", "offline"], env=env)
    assert rp.returncode == 0 and "Traceback" not in rp.stderr and "1 rows" in rp.stdout, rp.stdout + rp.stderr
    state = log_dir / "wandb_replay.json"
    assert state.is_file() and not state.is_symlink() and (state.stat().st_mode & 0o007) == 0   # as the run: 0640 here


@pytest.mark.parametrize("where", ["symlink_in_our_run", "their_run"])
def test_report_never_writes_through_a_symlink_at_its_default_place(tmp_path, where):
    """An outside attack: `telemetry report` on another user's run followed their symlink at
    report/ (or at report/index.html) and overwrote the reader's own files. Its default place is
    refused when it is a symlink or the run is another user's (exit 2, one line, --out named);
    nothing of the reader's is touched."""
    if where == "their_run" and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    run = tmp_path / "run"
    log_dir = run / "telemetry"
    log_dir.mkdir(parents=True)
    (log_dir / "metrics.jsonl").write_text(
        '{"kind": "metrics", "t": 1700000000.0, "step": 1, "values": {"train/loss": 2.0}}\n')
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    (mine / "index.html").write_text("my own file\n")
    if where == "symlink_in_our_run":
        (log_dir / "report").symlink_to(mine)
    else:                           # their report/, its index.html a link to the reader's file
        from other_user import OTHER_UID

        (log_dir / "report").mkdir()
        (log_dir / "report" / "index.html").symlink_to(mine / "index.html")
        for p in (run, log_dir, log_dir / "metrics.jsonl", log_dir / "report"):
            os.chown(p, OTHER_UID, OTHER_UID)
        os.lchown(log_dir / "report" / "index.html", OTHER_UID, OTHER_UID)
    out = _telemetry(["report", str(run)])
    text = out.stdout + out.stderr
    assert out.returncode == 2 and "Traceback" not in text and "--out" in text, text
    assert ("symlink" if where == "symlink_in_our_run" else "another user's run") in text, text
    assert (mine / "index.html").read_text() == "my own file\n" and sorted(os.listdir(mine)) == ["index.html"]
    assert (mine.stat().st_mode & 0o777) == 0o755
    out = _telemetry(["report", str(run), "--out", str(tmp_path / "out")])    # where the reader says
    assert out.returncode == 0 and (tmp_path / "out" / "index.html").is_file(), out.stdout + out.stderr


@pytest.mark.parametrize("cmd", ["goodput", "replay", "dashboard", "report", "report-rotated-piece"])
def test_an_unreadable_metrics_file_is_bad_input_named_in_one_line(tmp_path, cmd):
    """A metrics file the user may not read (mode 000, another user's run): goodput, replay and
    the dashboard raised PermissionError (a traceback), report said it in one line with exit 1.
    Each now names the file in one line and exits 2, as for a path that holds no run; a rotated
    piece (metrics.jsonl.1) the same."""
    from other_user import with_reads_refused

    log_dir = tmp_path / "run" / "telemetry"
    log_dir.mkdir(parents=True)
    line = '{"kind": "metrics", "t": 1700000000.0, "step": 1, "values": {"train/loss": 2.0}}\n'
    (log_dir / "metrics.jsonl").write_text(line)
    unreadable = log_dir / "metrics.jsonl"
    if cmd == "report-rotated-piece":
        cmd, unreadable = "report", log_dir / "metrics.jsonl.1"
        unreadable.write_text(line)
    unreadable.chmod(0)
    args = {"goodput": [], "replay": ["--wandb", "offline"], "dashboard": ["--port", "0"],
            "report": ["--out", str(tmp_path / "report")]}[cmd]
    argv = with_reads_refused([sys.executable, "-m", "telemetry", cmd, str(tmp_path / "run"), *args], str(unreadable))
    if argv is None:
        pytest.skip("a file's mode does not stop this user's reads (root without capsh)")
    env = {**os.environ, "WANDB_DIR": str(tmp_path / "wandb"), "WANDB_SILENT": "true"}
    try:
        p = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=HANG_S, env=env)
    except subprocess.TimeoutExpired as exc:     # the dashboard served it
        pytest.fail(f"telemetry {cmd} did not refuse it in {HANG_S} s: {exc.stderr!r:.2000}")
    assert p.stderr.splitlines() == [f"telemetry {cmd}: {unreadable}: cannot read it (Permission denied)"], p.stderr
    assert p.returncode == 2 and p.stdout == "", (p.returncode, p.stdout)
