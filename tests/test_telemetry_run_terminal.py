"""`telemetry run` and signals: one the script would have had without us reaches it once.

At a terminal: the terminal sends SIGINT to its whole foreground process group, the launcher and
the script alike; a launcher that passed it on as well interrupted the script a second time,
inside its exit hooks (a second traceback, and the W&B run's exit code 130 where W&B records
255). Without one: `timeout`, `kill -TERM -PGID` or a scheduler signal the launcher's whole group;
the script had it directly and passed on by the launcher, twice (a preemption handler ran twice).
It now runs in a group of its own and still ends with the launcher (a group SIGKILL)."""
from __future__ import annotations

import hashlib
import os
import pty
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import time
import wandb
run = wandb.init(project="ctrl-c")
run.log({"x": 1.0})
try:
    print("script is logging", flush=True)
    time.sleep(600)
finally:                       # a script's own clean-up on Ctrl-C (a last checkpoint, say)
    time.sleep(1.0)
    print("clean-up done", flush=True)
"""


def _read_until(fd: int, needle: bytes, timeout_s: float) -> bytes:
    out, deadline = b"", time.monotonic() + timeout_s
    while needle not in out and time.monotonic() < deadline:
        if select.select([fd], [], [], 0.5)[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:           # the terminal's other end closed: the process is gone
                break
            if not chunk:
                break
            out += chunk
    return out


def _to_the_end(pid: int, fd: int, first=lambda fd: b"") -> tuple[str, int]:
    """What a process forked onto the pty `fd` writes to it to its end (after `first(fd)`, what
    is done at the terminal first), and its exit code; it is killed if the test fails before."""
    try:
        out = first(fd)
        out += _read_until(fd, b"\x00never", 180)
        _, status = os.waitpid(pid, 0)
    finally:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
        os.close(fd)
    return out.decode(errors="replace"), os.waitstatus_to_exitcode(status)


def test_ctrl_c_at_the_terminal_reaches_the_script_once(tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent(SCRIPT))
    runtime = Path("/tmp") / f"tmtty-{hashlib.sha1(str(tmp_path).encode()).hexdigest()[:12]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRY_", "WANDB_"))}
    env.update(WANDB_MODE="offline", WANDB_DIR=str(tmp_path), WANDB_SILENT="true", PYTHONPATH=str(ROOT),
               PYTHONUNBUFFERED="1", TELEMETRY_RUNTIME_DIR=str(runtime))
    pid, fd = pty.fork()        # the child leads a session whose controlling terminal is this pty
    if pid == 0:
        os.chdir(tmp_path)
        # SIGINT as a shell gives it (a test worker's ignored or blocked one would be inherited).
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        os.execve(sys.executable, [sys.executable, "-m", "telemetry", "run", "--as-wandb", "--", "train.py"], env)
    def ctrl_c(fd: int) -> bytes:
        out = _read_until(fd, b"script is logging", 180)
        assert b"script is logging" in out, out.decode(errors="replace")[-3000:]
        os.write(fd, b"\x03")                     # Ctrl-C: the terminal signals its foreground group
        return out

    text, code = _to_the_end(pid, fd, ctrl_c)
    assert code == 130, text[-3000:]      # the shell's code for SIGINT
    assert "clean-up done" in text, text[-3000:]                      # not interrupted a second time
    assert text.count("KeyboardInterrupt") == 1, text[-3000:]
    sys.path.insert(0, str(ROOT / "tests"))
    from wandb_offline import read_records, wait_finished

    (path,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    exits = [r.exit.exit_code for r in read_records(wait_finished(path)) if r.WhichOneof("record_type") == "exit"]
    assert exits == [255], (exits, text[-3000:])                      # W&B's code for a KeyboardInterrupt


COUNTING = """
import os, signal, sys, time
got = []
for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, lambda n, _f: got.append(signal.Signals(n).name))
os.write(1, f"ready {os.getpid()}\\n".encode())    # one write: two ranks' lines never interleave
deadline, first = time.monotonic() + float(sys.argv[1]), None
while time.monotonic() < deadline:
    if got and first is None:          # one more would come within this
        first = time.monotonic()
        deadline = first + 3.0
    time.sleep(0.05)
print("signals", ",".join(got) or "none", flush=True)
"""


def _launched(tmp_path, wait_s: float, nproc: int = 1) -> subprocess.Popen:
    """`telemetry run` of COUNTING without a terminal, leading a session and a process group of
    its own (as under `timeout`, a scheduler or nohup), once every rank said it is ready."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "count.py").write_text(COUNTING)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRY_", "WANDB_"))}
    runtime = Path("/tmp") / f"tmsig-{hashlib.sha1(str(tmp_path).encode()).hexdigest()[:12]}"
    env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", TELEMETRY_RUNTIME_DIR=str(runtime))
    p = subprocess.Popen([sys.executable, "-m", "telemetry", "run", "--quiet", "--wandb", "disabled",
                          "--nproc", str(nproc), "--run-dir", str(tmp_path / "r"), "--", "count.py", str(wait_s)],
                         cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, start_new_session=True)
    p.script_pids, said, deadline = [], b"", time.monotonic() + 240     # a hang detector
    while len(p.script_pids) < nproc and time.monotonic() < deadline:
        said += _read_until(p.stdout.fileno(), b"\n", 1.0)
        p.script_pids = [int(x.split()[1]) for x in said.split(b"\n") if x.startswith(b"ready ")]
        if p.poll() is not None and not select.select([p.stdout], [], [], 0)[0]:
            break
    if len(p.script_pids) < nproc:
        os.killpg(p.pid, signal.SIGKILL)
        raise AssertionError(f"the script never said ready ({p.poll()}): {said.decode(errors='replace')[-3000:]}")
    p.script_pid = p.script_pids[0]
    return p


def test_a_signal_to_the_launchers_group_reaches_the_script_once(tmp_path):
    """`timeout` sends SIGTERM to its child and to its whole process group: the script gets one."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        p = _launched(tmp_path / sig.name, 120)
        try:
            os.killpg(p.pid, sig)
            rest = p.stdout.read().decode(errors="replace")
            assert p.wait(120) == 0, rest
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        assert f"signals {sig.name}\n" in rest, rest


@pytest.mark.parametrize("nproc", [1, 2])
def test_the_script_ends_with_the_launcher_killed_by_a_group_sigkill(tmp_path, nproc):
    """In a group of its own, the script still ends when its launcher's group is SIGKILLed (and
    when the launcher alone is): nothing keeps training, unseen, after `timeout -k` or kill -9.
    Under torchrun (--nproc 2) its ranks are in sessions of their own: the agent is told to
    end them (a SIGKILLed agent would have left them running)."""
    for alone in (False, True):
        p = _launched(tmp_path / f"alone-{alone}", 600, nproc)
        if alone:
            p.kill()
        else:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(60)
        deadline = time.monotonic() + 90     # a hang detector (torch elastic's grace is 30 s)
        while not all(map(_gone, p.script_pids)) and time.monotonic() < deadline:
            time.sleep(0.1)
        outlived = [pid for pid in p.script_pids if not _gone(pid)]
        for pid in outlived:
            os.kill(pid, signal.SIGKILL)
        # The daemon watches the launcher's pid: it drains by itself (a drained run left behind).
        drained = tmp_path / f"alone-{alone}" / "r" / "drain.json"
        while not drained.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not outlived, f"the script outlived its launcher (alone={alone}, nproc={nproc})"


def test_with_a_terminal_the_script_stays_under_its_job_control(tmp_path):
    """A launcher with a controlling terminal, its stdin not that terminal (`< /dev/null`, a pipe,
    or a job in the background): the script stays in the launcher's process group, under the
    terminal's job control. In a group of its own, a read of the terminal stopped it alone (the
    shell showed the job running; `fg` never continued it) and Ctrl-Z stopped only the launcher
    (a reviewer's find)."""
    (tmp_path / "groups.py").write_text("import os\nprint('groups', os.getpgrp(), os.getpgid(os.getppid()), flush=True)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRY_", "WANDB_"))}
    env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", TELEMETRY_RUNTIME_DIR=str(tmp_path / "rt"))
    pid, fd = pty.fork()        # the child leads a session whose controlling terminal is this pty
    if pid == 0:
        os.chdir(tmp_path)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.execve(sys.executable, [sys.executable, "-m", "telemetry", "run", "--quiet", "--wandb", "disabled",
                                   "--run-dir", str(tmp_path / "r"), "--", "groups.py"], env)
    text, code = _to_the_end(pid, fd)
    assert code == 0, text[-3000:]
    line = next(x for x in text.splitlines() if x.startswith("groups"))
    own, parents = line.split()[1:3]
    assert own == parents, line          # the script's process group is its launcher's


def _gone(pid: int) -> bool:
    """The process has ended (a zombie not yet reaped counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True

