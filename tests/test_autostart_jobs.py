"""Two jobs of one user on one machine never share a daemon or a run; the ranks of one launch do.

Real processes: bare TelemetryClient scripts with TELEMETRY_AUTOSTART=1, each starting the daemon
of its job (telemetry/shared/job.py), and torchrun's ranks meeting at one. Each test has its own
user directory ($XDG_RUNTIME_DIR): the default endpoints' home, left to the jobs to choose in."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from daemon_util import step_values

ROOT = Path(__file__).resolve().parent.parent

BARE = """
import os, time
from telemetry import TelemetryClient
tag = os.environ["TAG"]
tm = TelemetryClient()
for step in range(int(os.environ["N"])):
    tm.log(step, {f"loss_{tag}": float(step)})
    time.sleep(0.02)
tm.close()
"""

# An integration's client (the HF callback's, Lightning's, Accelerate's): autostart on by default.
INTEGRATION = """
import os, time
from telemetry.integrations._client import LazyClient
tag = os.environ["TAG"]
lazy = LazyClient()
tm = lazy.get()
for step in range(int(os.environ["N"])):
    tm.log(step, {f"loss_{tag}": float(step)})
    time.sleep(0.02)
lazy.close()
"""

STARTED = re.compile(r"telemetry: run (\w+): telemetry daemon started \(pid \d+\), writing to (\S+);")


def _env(tmp_path: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TELEMETRY_", "WANDB_")) and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    xdg = _xdg(tmp_path)
    xdg.mkdir(mode=0o700, exist_ok=True)
    env.update({"XDG_RUNTIME_DIR": str(xdg), "TELEMETRY_AUTOSTART": "1", "PYTHONPATH": str(ROOT),
                "PYTHONUNBUFFERED": "1", **extra})
    return env


def _xdg(tmp_path: Path) -> Path:
    # A short path of the test's own: pytest's tmp_path plus `telemetry/job-<key>/control.sock`
    # can pass the 107-byte unix socket limit.
    return Path("/tmp") / f"tmxdg-{hashlib.sha1(str(tmp_path).encode()).hexdigest()[:12]}"


@pytest.fixture(autouse=True)
def _remove_xdg(tmp_path):
    yield
    shutil.rmtree(_xdg(tmp_path), ignore_errors=True)


def _wait_for_line(path: Path, pattern: re.Pattern, timeout_s: float = 120.0) -> re.Match:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = pattern.search(path.read_text())
        if m:
            return m
        time.sleep(0.05)
    raise AssertionError(f"no {pattern.pattern!r} in {path}: {path.read_text()}")


@pytest.mark.parametrize("client", ["bare", "integration"])
def test_two_jobs_of_one_user_each_keep_their_own_run(tmp_path, client):
    """Job B starts in another directory while job A's daemon runs, and outlives A. Before: B sent
    to A's daemon without a word, A's run held B's rows, nothing was written under B's directory,
    and A's end drained the run while B still sent. A bare client with TELEMETRY_AUTOSTART=1, and
    an integration's, which starts a daemon unless told not to."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(BARE if client == "bare" else INTEGRATION))
    extra = {} if client == "bare" else {"TELEMETRY_AUTOSTART": ""}
    procs, errs = {}, {}
    for tag, n in (("A", 30), ("B", 80)):
        (tmp_path / tag).mkdir()
        errs[tag] = tmp_path / f"{tag}.err"
        with open(errs[tag], "w") as err:
            procs[tag] = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path / tag, stderr=err,
                                          env=_env(tmp_path, TAG=tag, N=str(n), **extra))
        if tag == "A":
            _wait_for_line(errs["A"], STARTED)          # A's daemon serves: B comes after it
    for tag, p in procs.items():
        assert p.wait(timeout=300) == 0, errs[tag].read_text()
    for tag, n in (("A", 30), ("B", 80)):
        text = errs[tag].read_text()
        (started,) = STARTED.findall(text)
        log_dir = Path(started[1])
        assert log_dir.parent == tmp_path / tag / "telemetry", text
        steps = step_values(log_dir)
        assert steps == {s: {f"loss_{tag}": float(s)} for s in range(n)}, (tag, text)
        final = json.loads((log_dir / "drain.json").read_text())
        assert final["records_lost"] == 0 and sorted(final["per_rank"]) == ["0"], final
    # Each job's socket directory went with its daemon.
    assert not list((_xdg(tmp_path) / "telemetry").glob("job-*"))


RANKS = """
import os
import torch.distributed as dist
from telemetry import TelemetryClient

dist.init_process_group("gloo")
rank = dist.get_rank()
tm = TelemetryClient()
dist.barrier()
for step in range(5):
    tm.log(step, {"loss": 10.0 * rank + step})
tm.close()
dist.barrier()
"""


def test_the_ranks_of_one_launch_share_their_jobs_daemon(tmp_path):
    """torchrun's ranks are one job (their agent's): one daemon, one run, both ranks in it."""
    script = tmp_path / "ranks.py"
    script.write_text(textwrap.dedent(RANKS))
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(script)], cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    started = STARTED.findall(out.stderr)
    assert len(started) == 1, out.stderr[-3000:]
    log_dir = Path(started[0][1])
    steps = step_values(log_dir)
    assert {s: v["loss"] for s, v in steps.items()} == {s: 5.0 + s for s in range(5)}    # the mean of the ranks
    final = json.loads((log_dir / "drain.json").read_text())
    assert final["records_lost"] == 0 and sorted(final["per_rank"]) == ["0", "1"], final
