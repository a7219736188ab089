"""An output a user names (`report --out DIR`, `goodput --json FILE`) is never written through
what another local user put there first: an outside attack had the other user make the directory
first, with index.html a symlink to a private file of the victim's, and the report overwrote that
file (and the other user could swap the report's files afterwards); goodput --json followed a
symlink the same way. Real processes, and a real second user (root acting as `nobody`)."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from other_user import OTHER_UID, can_act_as_other_user, run_as_other_user

ROOT = Path(__file__).resolve().parent.parent
HANG_S = 120

pytestmark = pytest.mark.skipif(not can_act_as_other_user(), reason="acting as another user needs root")


def _telemetry(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "telemetry", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=HANG_S, env={**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"})


@pytest.fixture
def shared(tmp_path):
    """(a run of ours, a private file of ours, a directory every user may write, sticky like /tmp)."""
    run = tmp_path / "run"
    run.mkdir(mode=0o700)                   # a private run: what the report writes is private too
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"kind": "metrics", "t": 1700000000.0 + s, "step": s, "values": {"train/loss": 2.0 - s / 10}}) + "\n"
        for s in range(1, 6)))
    victim = tmp_path / "victim.txt"
    victim.write_text("ORIGINAL\n")
    victim.chmod(0o600)
    where = Path(tempfile.mkdtemp(prefix="out-squat-", dir="/tmp"))
    where.chmod(0o1777)
    yield run, victim, where
    shutil.rmtree(where, ignore_errors=True)


def _one_refusal(p: subprocess.CompletedProcess, cmd: str, flag: str) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"telemetry {cmd}: {flag} ") and "Traceback" not in p.stderr, p.stderr
    return lines[0]


@pytest.mark.parametrize("made_by", ["them", "us, open to every user"])
def test_report_out_into_a_directory_another_user_can_write_is_refused(shared, made_by):
    run, victim, where = shared
    out = where / "alice-report"
    if made_by == "them":
        run_as_other_user(f"mkdir -m 777 {out}; ln -s {victim} {out}/index.html; ln -s {victim} {out}/loss.png")
    else:
        out.mkdir()
        out.chmod(0o777)
        run_as_other_user(f"ln -s {victim} {out}/index.html; ln -s {victim} {out}/loss.png")
    line = _one_refusal(_telemetry("report", str(run), "--out", str(out)), "report", "--out")
    assert ("owned by another user" if made_by == "them" else "writable by other users") in line, line
    assert victim.read_text() == "ORIGINAL\n"
    assert sorted(os.listdir(out)) == ["index.html", "loss.png"]
    assert all(os.path.islink(out / n) for n in os.listdir(out))


def test_report_out_that_is_another_users_symlink_is_refused(shared, tmp_path):
    run, victim, where = shared
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "index.html").write_text("my page\n")
    run_as_other_user(f"ln -s {mine} {where}/report")
    _one_refusal(_telemetry("report", str(run), "--out", str(where / "report")), "report", "--out")
    assert (mine / "index.html").read_text() == "my page\n" and sorted(os.listdir(mine)) == ["index.html"]


def test_report_out_made_fresh_is_private_and_a_link_of_ours_in_it_is_replaced(shared, tmp_path):
    """What --out is for still works: a directory the report makes (the run's mode: 0700 for a
    private run), and one of ours that no one else can write, where a name that is a symlink
    (ours: left by hand) is replaced by the report's file, never written through."""
    run, victim, where = shared
    fresh = where / "fresh" / "report"
    p = _telemetry("report", str(run), "--out", str(fresh))
    assert p.returncode == 0 and (fresh / "index.html").is_file(), p.stdout + p.stderr
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o700 and stat.S_IMODE((fresh / "index.html").stat().st_mode) == 0o600
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    (mine / "index.html").symlink_to(victim)
    p = _telemetry("report", str(run), "--out", str(mine))
    assert p.returncode == 0, p.stdout + p.stderr
    assert victim.read_text() == "ORIGINAL\n"
    assert not (mine / "index.html").is_symlink() and "<html" in (mine / "index.html").read_text()
    assert stat.S_IMODE(mine.stat().st_mode) == 0o755        # one of ours is used as it is


@pytest.mark.parametrize("planted", ["symlink in their directory", "symlink in a sticky directory",
                                     "FIFO in a sticky directory", "their file in a sticky directory"])
def test_goodput_json_never_writes_through_what_another_user_planted(shared, planted):
    run, victim, where = shared
    if planted == "symlink in their directory":
        target = where / "theirs" / "gp.json"
        run_as_other_user(f"mkdir -m 777 {target.parent}; ln -s {victim} {target}")
    elif planted == "symlink in a sticky directory":
        target = where / "gp.json"
        run_as_other_user(f"ln -s {victim} {target}")
    elif planted == "FIFO in a sticky directory":      # they would read the ledger
        target = where / "gp.json"
        run_as_other_user(f"mkfifo -m 666 {target}")
    else:
        target = where / "gp.json"
        run_as_other_user(f"echo theirs > {target}; chmod 666 {target}")
    p = _telemetry("goodput", str(run), "--json", str(target))
    line = _one_refusal(p, "goodput", "--json")
    assert "another user" in line, line
    assert victim.read_text() == "ORIGINAL\n"
    assert os.lstat(target).st_uid == OTHER_UID


def test_goodput_json_into_a_sticky_directory_is_a_new_file_of_ours(shared):
    """A name nobody took in /tmp (sticky: no one else can remove or swap an entry of ours) is
    still a place for --json, and so is our own file there, which is replaced, not written
    through (a hard link to it elsewhere keeps its content)."""
    run, victim, where = shared
    p = _telemetry("goodput", str(run), "--json", str(where / "gp.json"))
    assert p.returncode == 0, p.stderr
    st = os.lstat(where / "gp.json")
    assert stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and json.loads((where / "gp.json").read_text())
    os.unlink(where / "gp.json")
    os.link(victim, where / "gp.json")
    p = _telemetry("goodput", str(run), "--json", str(where / "gp.json"))
    assert p.returncode == 0, p.stderr
    assert victim.read_text() == "ORIGINAL\n" and json.loads((where / "gp.json").read_text())
