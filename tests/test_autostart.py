"""A daemon that starts itself (issue 30 item 2): scripts written as outside projects write them,
switched to the sidecar with one line and run with no daemon started by hand, keep their run.
Real processes: the script, the daemon it starts, torchrun for two ranks; each test has its own
runtime directory (the default endpoints' home) and run directory."""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from daemon_util import step_values as _steps
from testkit import faults

ROOT = Path(__file__).resolve().parent.parent

NANOGPT_STYLE = """
import os, sys, time
import telemetry.wandb as wandb          # the one line that changed (was: import wandb)

wandb_log = True
wandb_project = "owt"
wandb_run_name = "gpt2-" + str(int(time.time()))
config = {"learning_rate": 6e-4, "batch_size": 12, "n_layer": 12}
if wandb_log:
    wandb.init(project=wandb_project, name=wandb_run_name, config=config)
for iter_num in range(int(os.environ.get("ITERS", "20"))):
    loss = 4.0 - iter_num * 0.125
    if wandb_log:
        wandb.log({"iter": iter_num, "train/loss": loss, "lr": 6e-4, "mfu": 12.5}, step=iter_num)
if os.environ.get("HANG"):
    print("logged", flush=True)
    time.sleep(600)
if os.environ.get("CRASH"):
    raise RuntimeError("boom")
"""


def _env(tmp_path: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TELEMETRY_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "WANDB_RUN_ID")}
    # A short path of the test's own: pytest's tmp_path (/tmp/pytest-of-root/pytest-NNN/popen-gwN/
    # <test name>/) plus a run's `run-<id>/ingest.sock` passed the 107-byte unix socket limit.
    runtime = Path("/tmp") / f"tmrt-{hashlib.sha1(str(tmp_path).encode()).hexdigest()[:12]}"
    env.update({"TELEMETRY_RUNTIME_DIR": str(runtime), "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path),
                "WANDB_SILENT": "true", "PYTHONPATH": str(ROOT),
                "PYTHONUNBUFFERED": "1", **extra})
    return env


def _script(tmp_path: Path, text: str = NANOGPT_STYLE) -> Path:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text))
    return path


def _run_dirs(tmp_path: Path) -> list[Path]:
    return sorted(p for p in (tmp_path / "telemetry").iterdir() if p.is_dir()) if (tmp_path / "telemetry").is_dir() else []


def _pid_gone(pid: int, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists():
            return True
        try:
            if Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[-1].split()[0] == b"Z":
                return True
        except OSError:
            return True
        time.sleep(0.1)
    return False


def test_a_wandb_script_with_no_daemon_keeps_its_run(tmp_path):
    """Before: the script trained, printed nothing, and every metric was discarded."""
    out = subprocess.run([sys.executable, str(_script(tmp_path))], cwd=tmp_path, env=_env(tmp_path),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    started = re.findall(r"run (\w+): telemetry daemon started \(pid (\d+)\), writing to (\S+);", out.stderr)
    assert len(started) == 1, out.stderr
    run_id, pid, log_dir = started[0][0], int(started[0][1]), Path(started[0][2])
    assert re.fullmatch(r"[a-z0-9]{8}", run_id) and log_dir == tmp_path / "telemetry" / run_id
    assert _run_dirs(tmp_path) == [log_dir]
    assert f"run {run_id}: " in out.stderr and f"written to {log_dir / 'metrics.jsonl'}" in out.stderr
    # Complete when the script returned: the daemon drained on its request and is gone.
    assert _pid_gone(pid, 5.0)
    final = json.loads((log_dir / "drain.json").read_text())
    assert final["stop_reason"] == "drain request" and final["records_lost"] == 0, final
    steps = _steps(log_dir)
    assert sorted(steps) == list(range(20))
    assert [steps[i]["train/loss"] for i in range(20)] == [4.0 - i * 0.125 for i in range(20)]


def test_a_script_that_raises_keeps_its_run_and_its_exit_code(tmp_path):
    out = subprocess.run([sys.executable, str(_script(tmp_path))], cwd=tmp_path,
                         env=_env(tmp_path, CRASH="1", ITERS="5"), capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and "RuntimeError: boom" in out.stderr
    (log_dir,) = _run_dirs(tmp_path)
    assert sorted(_steps(log_dir)) == list(range(5))
    assert json.loads((log_dir / "drain.json").read_text())["records_lost"] == 0


def test_a_script_killed_by_sigterm_is_drained_by_the_daemon_it_started(tmp_path):
    """SIGTERM ends Python without its exit hooks: the daemon, watching the script's pid, drains."""
    proc = subprocess.Popen([sys.executable, str(_script(tmp_path))], cwd=tmp_path,
                            env=_env(tmp_path, HANG="1", ITERS="10"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "logged"
        (log_dir,) = _run_dirs(tmp_path)
        # The records are on their way: wait for them. Steps 0-8: W&B commits a step's row when
        # the next step is logged (or at finish), so row 9 is still the script's when it dies.
        deadline = time.monotonic() + 120
        while len(_steps(log_dir)) < 9:
            assert time.monotonic() < deadline, _steps(log_dir)
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    pid = int(re.search(r"telemetry daemon started \(pid (\d+)\)", err).group(1))
    assert _pid_gone(pid, 60.0), err
    final = json.loads((log_dir / "drain.json").read_text())
    assert final["stop_reason"] == f"the process it was started for exited (pid {proc.pid})", final
    assert sorted(_steps(log_dir)) == list(range(9)) and final["records_lost"] == 0
    # Its W&B run did not end well, and says so: with the script's exit code as a shell reports
    # it (143) where the kernel keeps it for the watching daemon, else W&B's exit code of a
    # failure (before: 0).
    from daemon_util import kernel_keeps_exit_status
    from wandb_offline import read_records, wait_finished

    (path,) = [p for p in tmp_path.glob("wandb/offline-run-*/run-*.wandb")]     # under $WANDB_DIR, as W&B's
    exits = [r.exit.exit_code for r in read_records(wait_finished(path)) if r.WhichOneof("record_type") == "exit"]
    assert exits == [128 + signal.SIGTERM if kernel_keeps_exit_status() else 1]


def test_two_ranks_under_torchrun_one_daemon_and_rank_0_alone_logs(tmp_path):
    """nanoGPT's way under torchrun: every rank imports the drop-in, the master process alone
    calls init and logs; one daemon, no step waits for a rank that never logs. (Every rank
    logging, where the daemon learns the world from the ranks' hellos, is tested through
    `telemetry run --world-size`: a hello can come after rank 0's first step.)"""
    text = NANOGPT_STYLE.replace("wandb_log = True", "wandb_log = os.environ['RANK'] == '0'")
    text = text.replace("import os, sys, time\n", "import os, sys, time\nimport torch.distributed as dist\n"
                        "dist.init_process_group('gloo')\n")
    text = text.replace("for iter_num in range", "dist.barrier()\nfor iter_num in range")
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(_script(tmp_path, text))], cwd=tmp_path,
                         env=_env(tmp_path, ITERS="8"), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(re.findall(r"telemetry daemon started", out.stderr)) == 1, out.stderr[-3000:]
    (log_dir,) = _run_dirs(tmp_path)
    steps = _steps(log_dir)
    assert [steps[i]["train/loss"] for i in range(8)] == [4.0 - i * 0.125 for i in range(8)] and len(steps) == 8
    final = json.loads((log_dir / "drain.json").read_text())
    assert final["records_lost"] == 0 and final["steps_incomplete"] == 0, final
    assert sorted(final["per_rank"]) == ["0"], final


def test_when_no_daemon_can_start_one_warning_says_so_and_training_goes_on(tmp_path):
    (tmp_path / "a-file").write_text("")      # the run directory would be under a file: cannot be made
    out = subprocess.run([sys.executable, str(_script(tmp_path))], cwd=tmp_path,
                         env=_env(tmp_path, TELEMETRY_DIR=str(tmp_path / "a-file" / "runs"), ITERS="3"),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    warnings = [ln for ln in out.stderr.splitlines() if "not kept" in ln]
    assert len(warnings) == 1 and "no daemon could be started" in warnings[0], out.stderr
    assert "Traceback" not in out.stderr and not _run_dirs(tmp_path)


def test_a_bare_client_says_once_that_nobody_listens_or_starts_one_when_asked(tmp_path):
    code = ("import warnings; warnings.simplefilter('always'); from telemetry import TelemetryClient; "
            "tm = TelemetryClient(rank=0); tm.log(1, {'a': 1.0}); tm.close(); "
            "tm = TelemetryClient(rank=0); tm.close()")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(tmp_path), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("no daemon serves") == 1 and "TELEMETRY_AUTOSTART=1" in out.stderr, out.stderr
    assert not _run_dirs(tmp_path)
    out = subprocess.run([sys.executable, "-c", code.replace("'a': 1.0", "'a': 7.0")], cwd=tmp_path,
                         env=_env(tmp_path, TELEMETRY_AUTOSTART="1"), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "no daemon serves" not in out.stderr, out.stderr
    (log_dir,) = _run_dirs(tmp_path)
    assert _steps(log_dir) == {1: {"a": 7.0}}


@pytest.mark.parametrize("how", ["argument", "environment", "tcp"])
def test_an_endpoint_nobody_ever_served_is_said_at_exit_with_what_it_dropped(tmp_path, how):
    """An endpoint the caller names is not looked at when the client starts (a daemon may come
    later); when none ever took the connection, the records were dropped and only stats() said so."""
    ep = f"ipc://{tmp_path}/nobody/ingest.sock" if how != "tcp" else f"tcp://127.0.0.1:{faults.free_port()}"
    arg = repr(ep) if how != "environment" else "None"
    code = (f"from telemetry import TelemetryClient; tm = TelemetryClient({arg}, rank=0)\n"
            "for i in range(5): tm.log(i, {'a': 1.0})\n")
    env = _env(tmp_path, **({"TELEMETRY_ENDPOINT": ep} if how == "environment" else {}))
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    said = [ln for ln in out.stderr.splitlines() if "no daemon ever took" in ln]
    assert len(said) == 1 and ep in said[0] and "6 records were dropped" in said[0], out.stderr  # the hello too
    assert "no daemon serves" not in out.stderr


def test_a_daemon_started_by_hand_is_used_not_doubled(tmp_path):
    from daemon_util import start_daemon

    env = _env(tmp_path)
    saved = os.environ.copy()
    os.environ["TELEMETRY_RUNTIME_DIR"] = env["TELEMETRY_RUNTIME_DIR"]
    try:
        # Its endpoints are the defaults of this runtime directory: its own ipc sockets.
        rt = Path(env["TELEMETRY_RUNTIME_DIR"])
        rt.mkdir(mode=0o700)
        d = start_daemon(tmp_path / "by-hand", extra_args=("--ingest", f"ipc://{rt}/ingest.sock", "--pub",
                                                            f"ipc://{rt}/pub.sock", "--control", f"ipc://{rt}/control.sock"))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        out = subprocess.run([sys.executable, str(_script(tmp_path))], cwd=tmp_path, env={**env, "ITERS": "4"},
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0 and "daemon started" not in out.stderr, out.stderr
        assert not _run_dirs(tmp_path)
        d.wait_for(lambda recs: sum(1 for r in recs if r.get("kind") == "metrics" and "rank" not in r) >= 4)
    finally:
        d.stop()
        d.cleanup()


def test_the_ready_line_is_the_daemons():
    from telemetry.client import autostart
    from telemetry.daemon.core import READY_LINE

    assert autostart.READY_LINE == READY_LINE


@pytest.mark.parametrize("value", ["0", "-3"])
def test_watch_pid_must_be_a_process_id(tmp_path, value):
    out = subprocess.run([sys.executable, "-m", "telemetry", "daemon", "--log-dir", str(tmp_path / "t"),
                          "--watch-pid", value], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--watch-pid" in out.stderr, out.stderr


def test_a_run_id_that_is_no_directory_name_gets_one_of_its_own(tmp_path):
    """WANDB_RUN_ID (or wandb.init(id=...)) names the run's directory: ".." must not climb out.
    An id W&B refuses ("../x": a "/") is refused at init with W&B's UsageError, as W&B does
    (before: accepted, and the daemon's W&B run was never made, said only in its log)."""
    out = subprocess.run([sys.executable, str(_script(tmp_path))], cwd=tmp_path,
                         env=_env(tmp_path, WANDB_RUN_ID="../escaped", ITERS="2"), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 1 and "UsageError: Run ID cannot contain the characters" in out.stderr, out.stderr
    assert not (tmp_path / "escaped").exists() and not _run_dirs(tmp_path)
    out = subprocess.run([sys.executable, str(_script(tmp_path))], cwd=tmp_path,
                         env=_env(tmp_path, WANDB_RUN_ID="..", ITERS="2"), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    (log_dir,) = _run_dirs(tmp_path)
    assert re.fullmatch(r"[a-z0-9]{8}", log_dir.name) and log_dir.parent == tmp_path / "telemetry"
    out = subprocess.run([sys.executable, str(_script(tmp_path))], cwd=tmp_path,
                         env=_env(tmp_path, WANDB_RUN_ID="my-run_7", ITERS="2"), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and (tmp_path / "telemetry" / "my-run_7" / "metrics.jsonl").is_file(), out.stderr


def test_trials_started_at_once_each_get_a_daemon_and_a_run_of_their_own(tmp_path):
    """A sweep's trials on one node, each `wandb.init(id=...)` with its own id and no daemon
    started by hand: each starts its own daemon (its runtime directory is keyed by the run id),
    writes its own run directory and keeps exactly its rows (before: one daemon for the node,
    every trial's rows in the first trial's run, nothing said)."""
    script = _script(tmp_path, NANOGPT_STYLE.replace("config=config)", "config=config, id=os.environ['TRIAL'])")
                     .replace("loss = 4.0 - iter_num * 0.125", "loss = 100.0 * int(os.environ['TRIAL'][-1]) + iter_num"))
    procs = [subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=_env(tmp_path, TRIAL=f"trial-{i}", ITERS="6"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(4)]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, errs
    assert [len(re.findall(r"telemetry daemon started", e)) for e in errs] == [1] * 4, errs
    assert [p.name for p in _run_dirs(tmp_path)] == [f"trial-{i}" for i in range(4)]
    for i in range(4):
        log_dir = tmp_path / "telemetry" / f"trial-{i}"
        steps = _steps(log_dir)
        assert {s: v["train/loss"] for s, v in steps.items()} == {s: 100.0 * i + s for s in range(6)}
        final = json.loads((log_dir / "drain.json").read_text())
        assert final["records_lost"] == 0 and sorted(final["per_rank"]) == ["0"], final


def test_two_scripts_with_one_run_id_both_rank_0_keep_two_runs(tmp_path):
    """Two scripts started with one $WANDB_RUN_ID, neither launched as a rank: two processes that
    are rank 0 of one run. W&B keeps two runs; so does the sidecar, and the second is told (before:
    one run with every step twice, rows of both mixed, A's finish draining while B still sent, and
    B told nothing)."""
    script = _script(tmp_path, NANOGPT_STYLE.replace("loss = 4.0 - iter_num * 0.125",
                                                     "loss = float(os.environ['WHO']) + iter_num; time.sleep(0.02)"))
    errs = {who: tmp_path / f"{who}.err" for who in ("1", "2")}
    procs = {}
    for who, iters in (("1", "20"), ("2", "40")):
        with open(errs[who], "w") as err:
            procs[who] = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, stderr=err,
                                          env=_env(tmp_path, WANDB_RUN_ID="dup", WHO=f"{who}00", ITERS=iters))
        deadline = time.monotonic() + 120
        while "telemetry daemon started" not in errs[who].read_text() and procs[who].poll() is None:
            assert time.monotonic() < deadline, errs[who].read_text()
            time.sleep(0.05)       # the first one's daemon serves the run: the second comes after it
    for who, p in procs.items():
        assert p.wait(timeout=300) == 0, errs[who].read_text()
    first, second = errs["1"].read_text(), errs["2"].read_text()
    assert "already rank 0 of run dup" not in first, first
    said = [ln for ln in second.splitlines() if "already rank 0 of run dup" in ln]
    assert len(said) == 1 and f"(pid {procs['1'].pid})" in said[0] and "telemetry/dup.2/" in said[0], second
    assert [d.name for d in _run_dirs(tmp_path)] == ["dup", "dup.2"]
    for name, base, iters in (("dup", 100.0, 20), ("dup.2", 200.0, 40)):
        log_dir = tmp_path / "telemetry" / name
        assert {s: v["train/loss"] for s, v in _steps(log_dir).items()} == {s: base + s for s in range(iters)}
        final = json.loads((log_dir / "drain.json").read_text())
        assert final["records_lost"] == 0 and final["per_rank"]["0"]["sources"] == 1, final


EVERY_RANK_INITS = """
import os
import torch.distributed as dist
import telemetry.wandb as wandb

dist.init_process_group("gloo")
rank = dist.get_rank()
wandb.init(project="ddp", config={"lr": 0.1})
dist.barrier()
for i in range(4):
    wandb.log({"loss": 10.0 * rank + i})
dist.barrier()
wandb.finish()
"""


@pytest.mark.slow
@pytest.mark.parametrize("shared_id", [True, False])
def test_every_rank_inits_one_run_per_id(tmp_path, shared_id):
    """Every rank calls init under torchrun. Ranks that share a run id ($WANDB_RUN_ID) make one
    run: one daemon (the start lock of the id's runtime directory) that both ranks' records reach
    (their values averaged once it has both hellos: see telemetry/integrations/wandb_run.py).
    Ranks that each get an id of their own make a run each, as W&B does, each with its rank's
    values alone (before: one daemon for the node, one run of the averaged values)."""
    env = _env(tmp_path, **({"WANDB_RUN_ID": "ddp-shared"} if shared_id else {}))
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(_script(tmp_path, EVERY_RANK_INITS))], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    dirs = _run_dirs(tmp_path)
    assert len(re.findall(r"telemetry daemon started", out.stderr)) == len(dirs) == (1 if shared_id else 2), \
        out.stderr[-3000:]
    finals = [json.loads((d / "drain.json").read_text()) for d in dirs]
    assert all(f["records_lost"] == 0 for f in finals), finals
    if shared_id:
        assert [d.name for d in dirs] == ["ddp-shared"] and sorted(_steps(dirs[0])) == list(range(4))
        assert sorted(finals[0]["per_rank"]) == ["0", "1"], finals
    else:
        losses = sorted(tuple(v["loss"] for _, v in sorted(_steps(d).items())) for d in dirs)
        assert losses == [tuple(10.0 * r + i for i in range(4)) for r in (0, 1)]
        assert all(sorted(f["per_rank"]) == ["0"] and f["steps_incomplete"] == 0 for f in finals), finals


def _sigint_as_a_shell_gives_it() -> None:
    """The child's SIGINT as a shell starts a script: the default action, not blocked. A test
    worker's ignored or blocked SIGINT is inherited through exec, and Python then installs no
    KeyboardInterrupt: the script slept through the test's Ctrl-C (seen in CI's full runs)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_ctrl_c_ends_the_script_by_sigint_as_it_would_alone(tmp_path):
    """An interrupted script that started its own daemon dies by SIGINT (the shell's 130), as it
    would without telemetry, after its run is drained. The drain at exit used to import a module
    whose dataclass runs exec(): CPython then forgets the KeyboardInterrupt and exits 1."""
    proc = subprocess.Popen([sys.executable, str(_script(tmp_path))], cwd=tmp_path,
                            env=_env(tmp_path, HANG="1", ITERS="3"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_as_a_shell_gives_it)
    try:
        assert proc.stdout.readline().strip() == "logged"
        proc.send_signal(signal.SIGINT)
        proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert proc.returncode == -signal.SIGINT, err[-3000:]
    (log_dir,) = _run_dirs(tmp_path)
    assert json.loads((log_dir / "drain.json").read_text())["records_lost"] == 0, err[-3000:]
