"""A W&B run file that could not be written whole is said, never reported as complete.

W&B's writer (its core process) only logs a write that fails; the W&B sink reads the end of
the run's file after the finish (telemetry/daemon/sinks/wandb_runfile.py). The failures here are
real: a small tmpfs where the test may mount one, else a file size limit (RLIMIT_FSIZE, which
W&B's core inherits: its writes past it fail with EFBIG), each in a process of its own.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from telemetry.consumers.drain import problem_lines

pytest.importorskip("wandb")

ROOT = Path(__file__).resolve().parent.parent

# The sink in a process of its own (a file size limit must not reach the test's process): the
# user's run (a drop-in script's init) or the daemon's own, rows of 20 values, closed, its stats
# printed.
CHILD = r"""
import json, sys
from protocol import output
from telemetry.daemon.sinks.base import Out
from telemetry.daemon.sinks.wandb_sink import WandbSink

def out(rec):
    line = json.dumps(rec).encode()
    return Out(rec["kind"], output.check(line), line)

log_dir, steps, users = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "user"
sink = WandbSink("offline", log_dir, run_name="full")
sink.start()
if users:
    sink.consume([out({"kind": "hello", "t": 1.0, "rank": 0, "info": {"host": "h", "pid": 1, "rank": 0,
                  "framework": "wandb", "wandb": {"project": "p", "metrics": []}}})])
for s in range(0, steps, 100):
    sink.consume([out({"kind": "metrics", "t": 2.0, "step": i, "values": {f"m{j}": float(i * j) for j in range(20)}})
                  for i in range(s, min(s + 100, steps))])
sink.close()
print(json.dumps(sink.stats()))
"""


def _limit_file_size(num_bytes: int):
    def apply() -> None:
        # Past the limit a write fails with EFBIG, rather than the signal ending the writer.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (num_bytes, num_bytes))
    return apply


def _sink_stats(log_dir: Path, steps: int, preexec=None, run: str = "user") -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_SILENT": "true"}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(log_dir), str(steps), run], capture_output=True, text=True,
                          timeout=180, env=env, cwd=str(log_dir), preexec_fn=preexec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _said(stats: dict) -> list[str]:
    return [line for line in problem_lines({"sinks": {"wandb": stats}}) if "W&B run's file" in line]


def _assert_said(stats: dict, steps: int, *errors: str) -> None:
    """Said, with the cause in one of the words of `errors`."""
    failed = stats.get("write_failed")
    assert failed is not None, "a run file W&B could not write whole was reported as complete"
    said = [e for e in errors if e in failed["error"]]
    assert said, failed
    error = said[0]
    assert failed["last_step_logged"] == steps - 1
    assert failed["last_step_kept"] is None or failed["last_step_kept"] < steps - 1
    assert failed["records_not_kept"] == "unknown"
    assert Path(failed["file"]).name.endswith(".wandb")
    (line,) = _said(stats)
    assert error in line and f"of the {steps - 1:,} logged" in line and "records not kept: unknown" in line


def test_a_whole_run_file_is_not_said_to_be_cut(tmp_path):
    stats = _sink_stats(tmp_path, 300)
    assert stats.get("write_failed") is None
    assert _said(stats) == []


@pytest.mark.parametrize("run", ["user", "daemon"])
def test_a_run_file_cut_by_a_file_size_limit_is_said(tmp_path, run):
    stats = _sink_stats(tmp_path, 2000, preexec=_limit_file_size(256 * 1024), run=run)
    _assert_said(stats, 2000, "file too large")


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 300 KB tmpfs, where this test may mount one (root, in a mount namespace that allows it)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    try:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(mnt)], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def test_a_run_file_cut_by_a_full_disk_is_said(small_tmpfs):
    stats = _sink_stats(small_tmpfs, 2000)
    # W&B's core logs the error it met, in its log on the same full disk, if that line still
    # fits there; otherwise the sink says the disk's room itself.
    _assert_said(stats, 2000, "no space left on device", "its file system has 0 bytes free")


def test_a_file_that_cannot_be_written_leaves_no_temporary_behind(tmp_path):
    """files.write_file (drain.json, goodput_ranks.json, sources.json) on a full disk: the old
    file stays, and no empty .tmp is left in the run directory."""
    code = ("import sys\nfrom pathlib import Path\nfrom telemetry.shared import files\n"
            "p = Path(sys.argv[1]) / 'goodput_ranks.json'\nfiles.write_file(p, b'old')\n"
            "try:\n    files.write_file(p, b'x' * 100000)\nexcept OSError as exc:\n    print(exc.errno)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=_limit_file_size(4096))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(__import__("errno").EFBIG)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["goodput_ranks.json"]
    assert (tmp_path / "goodput_ranks.json").read_bytes() == b"old"
