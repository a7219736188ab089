"""`telemetry run [--nproc N] -- SCRIPT [ARGS]` (issue 30 item 1): any script under the sidecar,
with its own exit code. Real processes: the command, its daemon, the script (torchrun for two
ranks); scripts written as outside projects write them (telemetry.wandb, a TelemetryClient)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from daemon_util import step_values as _steps

from telemetry.shared.userdir import user_dir

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import os, signal, sys
import telemetry.wandb as wandb

wandb.init(project="p", config={"lr": 1e-3})
rank = int(os.environ.get("RANK", "0"))
for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 10):
    wandb.log({"train/loss": 3.0 - 0.125 * i + rank}, step=i)
wandb.finish()
if os.environ.get("FAIL_RANK") == str(rank):
    if os.environ.get("WORLD_SIZE", "1") != "1":
        # The other rank ends first, cleanly: torchrun then sees this failure alone (had it to
        # end the other rank, that rank's code could come first: same second, lower rank).
        import time
        marker = os.path.join(os.environ["PIDS_DIR"], "other")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if os.path.exists(marker):
                pid = open(marker).read().strip()
                if pid and not os.path.exists(f"/proc/{pid}"):
                    break
            time.sleep(0.05)
    if os.environ.get("HOW") == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(5)
elif os.environ.get("PIDS_DIR"):
    # This rank's pid (its rows are sent: wandb.finish above); the failing rank waits for it to end.
    with open(os.path.join(os.environ["PIDS_DIR"], "other"), "w") as f:
        f.write(str(os.getpid()))
"""


def _env(tmp_path: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TELEMETRY_") and k not in ("RANK", "WORLD_SIZE")}
    env.update({"WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **extra})
    return env


def _run(tmp_path: Path, *args: str, timeout: int = 600, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "train.py").write_text(textwrap.dedent(SCRIPT))
    return subprocess.run([sys.executable, "-m", "telemetry", "run", *args], cwd=tmp_path, env=_env(tmp_path, **env),
                          capture_output=True, text=True, timeout=timeout)


def _run_dir(tmp_path: Path, out: subprocess.CompletedProcess) -> Path:
    m = re.search(r"telemetry run: run (\w+): daemon pid \d+, writing to (\S+);", out.stderr)
    assert m, out.stderr[-3000:]
    return Path(m.group(2))


def test_one_process_keeps_its_run_and_its_exit_code(tmp_path):
    out = _run(tmp_path, "--", "train.py", "12", FAIL_RANK="0")
    assert out.returncode == 5, out.stderr[-3000:]
    log_dir = _run_dir(tmp_path, out)
    assert log_dir.parent == tmp_path / "telemetry" and re.fullmatch(r"[a-z0-9]{8}", log_dir.name)
    steps = _steps(log_dir)
    assert [steps[i]["train/loss"] for i in range(12)] == [3.0 - 0.125 * i for i in range(12)]
    final = json.loads((log_dir / "drain.json").read_text())
    assert final["stop_reason"] == "drain request" and final["records_lost"] == 0, final
    assert "trainer exit code  5" in out.stdout and "steps logged       12" in out.stdout, out.stdout
    assert "[telemetry] telemetry daemon ready" in out.stderr      # the daemon's log, streamed
    assert not list(user_dir().glob(f"run-{log_dir.name}"))   # its sockets gone


@pytest.mark.parametrize("how, code", [("exit", 5), ("kill", 137)])
def test_two_ranks_under_torchrun_and_the_failing_ranks_code(tmp_path, how, code):
    # Every rank logs: --world-size says so (by default the ranks' hellos do, and rank 0's own
    # promises only itself, as W&B scripts log on rank 0 alone).
    (tmp_path / "pids").mkdir()
    out = _run(tmp_path, "--nproc", "2", "--world-size", "2", "--run-dir", str(tmp_path / "r"), "--quiet", "--",
               "train.py", "6", FAIL_RANK="1", HOW=how, PIDS_DIR=str(tmp_path / "pids"))
    assert out.returncode == code, out.stderr[-3000:]
    steps = _steps(tmp_path / "r")
    # Both ranks in every step: the mean of rank 0's loss and rank 1's (one more).
    assert [steps[i]["train/loss"] for i in range(6)] == [3.5 - 0.125 * i for i in range(6)]
    assert "[telemetry]" not in out.stderr                           # --quiet
    final = json.loads((tmp_path / "r" / "drain.json").read_text())
    assert sorted(final["per_rank"]) == ["0", "1"] and final["records_lost"] == 0, final


LATE_RANK = """
import os, sys, time
import telemetry.wandb as wandb

rank = int(os.environ["RANK"])
marker = os.path.join(os.environ["PIDS_DIR"], "rank0")
if rank == 1:              # starts after rank 0's whole run: its process gone
    deadline = time.monotonic() + 120
    while not os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = open(marker).read().strip()
    while pid and os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
wandb.init(project="p")
for i in range(3):
    wandb.log({"train/loss": float(i + 10 * rank)}, step=i)
wandb.finish()
if rank == 0:
    with open(marker, "w") as f:
        f.write(str(os.getpid()))
"""


def test_a_rank_that_inits_after_another_ended_joins_the_launchs_run(tmp_path):
    """Under `--nproc 2` a rank may start its run after another rank's process has ended (a
    loaded box): it is the same run, the launch's (it got a run and a daemon of its own when the
    launch's claim asked for a live claimant)."""
    (tmp_path / "pids").mkdir()
    (tmp_path / "late.py").write_text(LATE_RANK)
    out = subprocess.run([sys.executable, "-m", "telemetry", "run", "--nproc", "2", "--quiet", "--run-dir",
                          str(tmp_path / "r"), "--", "late.py"], cwd=tmp_path,
                         env=_env(tmp_path, PIDS_DIR=str(tmp_path / "pids")), capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [p.parent.name for p in tmp_path.rglob("drain.json")] == ["r"], out.stderr[-3000:]
    final = json.loads((tmp_path / "r" / "drain.json").read_text())
    assert sorted(final["per_rank"]) == ["0", "1"] and final["records_lost"] == 0, final


def test_a_module_with_its_arguments(tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text(textwrap.dedent(SCRIPT))
    out = _run(tmp_path, "--run-dir", str(tmp_path / "r"), "--", "-m", "mypkg.train", "3")
    assert out.returncode == 0, out.stderr[-3000:]
    assert sorted(_steps(tmp_path / "r")) == [0, 1, 2]


@pytest.mark.parametrize("args, words", [
    ([], ["give the script"]),
    (["--"], ["give the script"]),
    (["--", "nope.py"], ["nope.py: no such script"]),
    (["--", "-m"], ["-m needs a module"]),
    (["--nproc", "0", "--", "train.py"], ["--nproc must be 1..1024"]),
    (["--nproc", "abc", "--", "train.py"], ["--nproc"]),
    (["--world-size", "0", "--", "train.py"], ["--world-size must be 1..65536"]),
    (["--run-dir", "a-file/x", "--", "train.py"], ["--run-dir", "cannot make it"]),
    (["--daemon-config", "nope.yaml", "--", "train.py"], ["--daemon-config nope.yaml: not found"]),
    # The run's daemon would listen there while the script sends to the run's own sockets: every
    # record lost, and the summary said none was.
    (["--daemon-config", "ingest.yaml", "--", "train.py"], ["sets ingest: tcp://127.0.0.1:47999", "remove it"]),
    (["--daemon-config", "two.yaml", "--", "train.py"], ["sets pub: tcp://127.0.0.1:47998, control: "
                                                         "tcp://127.0.0.1:47997", "remove them"]),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, words):
    (tmp_path / "a-file").write_text("")
    (tmp_path / "ingest.yaml").write_text("ingest: tcp://127.0.0.1:47999\n")
    (tmp_path / "two.yaml").write_text("pub: tcp://127.0.0.1:47998\ncontrol: tcp://127.0.0.1:47997\n")
    out = _run(tmp_path, *args, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr
    for w in words:
        assert w in out.stderr, out.stderr
    assert not (tmp_path / "telemetry").exists()                    # nothing started


def test_help_names_the_forms():
    out = subprocess.run([sys.executable, "-m", "telemetry", "run", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "--nproc" in out.stdout and "-m MODULE" in out.stdout, out.stdout


PLAIN_WANDB = """
import sys
import wandb                        # unchanged: W&B's own import

run = wandb.init(project="p", config={"lr": 0.1})
for i in range(5):
    wandb.log({"loss": 1.0 / (i + 1), "nested": {"acc": i / 10}})
wandb.termlog("done")
wandb.finish()
print("WANDB_MODULE " + wandb.__file__, file=sys.stderr)
"""

def test_as_wandb_an_unmodified_import_wandb_logs_through_the_sidecar(tmp_path):
    (tmp_path / "plain.py").write_text(textwrap.dedent(PLAIN_WANDB))
    out = subprocess.run([sys.executable, "-m", "telemetry", "run", "--as-wandb", "--quiet", "--run-dir",
                          str(tmp_path / "r"), "--", "plain.py"], cwd=tmp_path, env=_env(tmp_path),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    module = re.search(r"WANDB_MODULE (\S+)", out.stderr).group(1)
    assert module.endswith("telemetry/integrations/as_wandb/wandb/__init__.py"), module
    assert "wandb: done" in out.stderr
    steps = _steps(tmp_path / "r")
    assert [steps[i]["loss"] for i in range(5)] == [1.0 / (i + 1) for i in range(5)]
    assert [steps[i]["nested/acc"] for i in range(5)] == [i / 10 for i in range(5)]


def _as_wandb_run(tmp_path_factory, script: str, nproc: int, env: dict) -> tuple[str, Path]:
    """`telemetry run --as-wandb --quiet --nproc N --run-dir WORK/r -- script` (W&B's offline
    run in the daemon: --wandb offline), as tests/test_wandb_parity.py runs the same script with
    the same environment: the one run serves both (shared_run); its stdout and run directory.
    (sidecar_run asserts its exit code, 0.)"""
    from test_wandb_parity import SCRIPTS, shared_run, sidecar_run

    _, out, work = shared_run(tmp_path_factory, sidecar_run, SCRIPTS / script, nproc, env)
    return out, work / "r"


@pytest.mark.slow
def test_as_wandb_transformers_report_to_wandb_logs_through_the_sidecar(tmp_path_factory):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    pytest.importorskip("wandb")     # the daemon's W&B sink, offline
    out, run_dir = _as_wandb_run(tmp_path_factory, "hf_report_to_wandb.py", 1, {"STEPS": "8"})
    losses = json.loads(re.search(r"RESULT (.*)", out).group(1))
    steps = _steps(run_dir)
    # The Trainer's own losses, exactly, at W&B's steps (its global step, one row per logging step).
    assert {int(s): v for s, v in losses.items()} == {int(v["train/global_step"]): v["train/loss"]
                                                      for v in steps.values() if "train/loss" in v}
    assert len(losses) == 8


@pytest.mark.slow
@pytest.mark.parametrize("script, env, nproc, key", [
    # Lightning's own WandbLogger (offline: WANDB_MODE=dryrun), 2 devices; it logs on rank 0.
    ("lightning_ddp.py", {"LOGGER": "wandb"}, "1", "loss"),
    # Accelerate's log_with="wandb" on 2 processes (torchrun); it logs on the main process.
    ("accelerate_ddp.py", {"TRACKER": "wandb"}, "2", "train/loss"),
])
@pytest.mark.slow
def test_as_wandb_lightning_and_accelerate_own_wandb_loggers(tmp_path_factory, script, env, nproc, key):
    pytest.importorskip("lightning" if "lightning" in script else "accelerate")
    pytest.importorskip("wandb")     # the daemon's W&B sink, offline
    _, run_dir = _as_wandb_run(tmp_path_factory, script, int(nproc), {"STEPS": "6", **env})
    recs = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if r.get("kind") == "metrics" and "rank" not in r and key in r["values"]]
    assert len(steps) == 6, steps
    # Logged on one rank, as W&B's loggers do: its hello promised only itself, so no step waited
    # for another rank and none was written incomplete.
    assert not any(r.get("missing_ranks") for r in steps), steps
    assert json.loads((run_dir / "drain.json").read_text())["records_lost"] == 0


SHORTCUT = """
import sys
import telemetry.wandb
sys.modules["wandb"] = telemetry.wandb          # the shortcut a user tries instead of --as-wandb
import wandb
from wandb.sdk.lib.config_util import ConfigError   # what transformers' WandbCallback imports
from wandb.wandb_run import Run                     # what Lightning's WandbLogger imports
assert wandb.__version__ and issubclass(ConfigError, Exception)
run = wandb.init(project="p", config={"lr": 1})
assert isinstance(run, Run)
try:                                                # W&B's ConfigError, as a script catches it
    wandb.config.update({"lr": 2})
except ConfigError as exc:
    assert isinstance(exc, wandb.Error), type(exc).__mro__
else:
    raise AssertionError("a changed config value raised nothing")
for i in range(3):
    wandb.log({"loss": 1.0 / (i + 1)})
wandb.finish()
"""


def test_the_sys_modules_shortcut_finds_what_integrations_import(tmp_path):
    """`sys.modules["wandb"] = telemetry.wandb` was a ModuleNotFoundError ('wandb.sdk') as soon as
    an integration imported from inside W&B."""
    (tmp_path / "short.py").write_text(textwrap.dedent(SHORTCUT))
    out = subprocess.run([sys.executable, "-m", "telemetry", "run", "--quiet", "--run-dir", str(tmp_path / "r"),
                          "--", "short.py"], cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    steps = _steps(tmp_path / "r")
    assert [steps[i]["loss"] for i in range(3)] == [1.0, 0.5, 1.0 / 3]


TAILED = """
import time
import telemetry.wandb as wandb
wandb.init(project="p")
deadline = time.monotonic() + 120    # until the live view has shown a record: it is subscribed (a hang detector)
while not open("RUN/tail.log").read().strip() and time.monotonic() < deadline:
    time.sleep(0.1)
for i in range(20):
    wandb.log({"loss": 1.0 / (i + 1)})
    time.sleep(0.02)
wandb.finish()
"""


def test_attach_tail_writes_the_live_view_beside_the_run(tmp_path):
    """--attach tail outside tmux: `telemetry tail --plain` on the run's PUB socket, into
    RUN_DIR/tail.log, stopped with the run."""
    (tmp_path / "tailed.py").write_text(textwrap.dedent(TAILED).replace("RUN", str(tmp_path / "r")))
    env = {k: v for k, v in _env(tmp_path).items() if k != "TMUX"}
    out = subprocess.run([sys.executable, "-m", "telemetry", "run", "--quiet", "--attach", "tail", "--run-dir",
                          str(tmp_path / "r"), "--", "tailed.py"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"live view: tail -f {tmp_path / 'r' / 'tail.log'}" in out.stdout
    log = (tmp_path / "r" / "tail.log").read_text()
    assert "loss=" in log and "Traceback" not in log, log[-3000:]


def test_a_runtime_dir_it_made_is_removed_with_the_parent_it_made_and_nothing_else(tmp_path):
    """$TELEMETRY_RUNTIME_DIR under a missing parent: `telemetry run` makes both (0700) and removes
    both at its end (the parent was left behind, empty); a parent that was there stays."""
    made_parent = tmp_path / "made" / "run-x"
    out = _run(tmp_path, "--", "train.py", "3", TELEMETRY_RUNTIME_DIR=str(made_parent))
    assert out.returncode == 0, out.stderr[-3000:]
    assert not made_parent.exists() and not made_parent.parent.exists()
    there = tmp_path / "there"
    there.mkdir()
    out = _run(tmp_path, "--", "train.py", "3", TELEMETRY_RUNTIME_DIR=str(there / "run-y"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert there.is_dir() and not (there / "run-y").exists()


def test_what_the_daemon_says_as_it_drains_is_on_the_terminal(tmp_path):
    """A script whose client ends without a bye (os._exit): the daemon's drain says so (records
    counted lost with the client); that line reaches the terminal before the run's summary (the
    log's stream stopped when the script ended, and lines of the drain were in daemon.log only:
    an outside tester's find)."""
    (tmp_path / "osexit.py").write_text(textwrap.dedent("""
        import os
        import telemetry
        tm = telemetry.TelemetryClient()
        for s in range(20):
            tm.log(s, {"train/loss": 1.0 / (s + 1)})
        os._exit(0)
    """))
    out = subprocess.run([sys.executable, "-m", "telemetry", "run", "--", "osexit.py"], cwd=tmp_path,
                         env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    log = (_run_dir(tmp_path, out) / "daemon.log").read_text()
    said = [ln for ln in log.splitlines() if "without a bye" in ln]
    assert said, log[-3000:]
    assert "without a bye" in out.stderr, out.stderr[-3000:]
    # Each of the daemon's lines once, this launch's alone.
    assert out.stderr.count("telemetry daemon ready") == 1, out.stderr[-3000:]


def test_a_daemon_killed_during_the_run_is_followed_by_a_successor_that_counts_exactly(tmp_path):
    """The daemon SIGKILLed while the script logs: `telemetry run` starts a successor on the same
    run directory and sockets, the client reconnects by itself, and every step is written or
    counted lost (written + lost == sent, across the two daemons), every record of the client
    too; the launcher says so. Before: the rest of the run went into nothing, counted by no one,
    and the launcher waited a minute on a drain nobody answered (an outside tester's find)."""
    import signal
    import time

    steps = 500
    (tmp_path / "steady.py").write_text(textwrap.dedent(f"""
        import json, time
        import telemetry
        tm = telemetry.TelemetryClient()
        for s in range({steps}):
            tm.log(s, {{"train/loss": 1.0 / (s + 1)}})
            time.sleep(0.01)
        tm.close()
        print(json.dumps(tm.stats()))
    """))
    p = subprocess.Popen([sys.executable, "-m", "telemetry", "run", "--run-dir", str(tmp_path / "run"), "--",
                          "steady.py"], cwd=tmp_path, env=_env(tmp_path), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        err = ""
        deadline = time.monotonic() + 120          # hang detector
        while "daemon pid" not in err:
            assert time.monotonic() < deadline and p.poll() is None, err
            err += p.stderr.readline()
        pid = int(re.search(r"daemon pid (\d+)", err).group(1))
        log_dir = tmp_path / "run"
        while not (log_dir / "metrics.jsonl").exists() or b'"step":20,' not in (log_dir / "metrics.jsonl").read_bytes():
            assert time.monotonic() < deadline, err
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
        out, rest = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    err += rest
    assert p.returncode == 0, err[-3000:]
    assert f"the daemon (pid {pid}) killed by signal 9 during the run; starting a successor" in err, err[-3000:]
    assert "the successor, pid" in err
    final = json.loads((log_dir / "drain.json").read_text())
    run = final["run"]
    written = len(_steps(log_dir))
    assert run["incarnations"] == 2 and final["sources_open_at_drain"] == 0, final
    # Some steps may be lost with the killed daemon, or none (it had written what it took, and
    # the client held the rest for the successor): either way every step is accounted.
    assert written + run["records_lost"] == steps, (written, run)
    sent = json.loads(next(ln for ln in out.splitlines() if ln.startswith('{"sent"')))
    assert run["records_in"] + run["records_lost"] == sent["seq"], (run, sent)


def test_under_umask_000_the_default_run_directory_is_made_and_used(tmp_path):
    """Under umask 000 the default run directory's parent (./telemetry) was made 0777, which the
    run's own check refuses (anyone could swap the run's directory): the script never ran (exit
    2) and the open directory stayed behind; daemon.out was 0666 (an outside tester's find). Now
    a parent is made as `mkdir -p` would, less write for every user, and daemon.out has the run
    files' mode."""
    import stat

    (tmp_path / "ok.py").write_text("print('ran')\n")
    out = subprocess.run([sys.executable, "-m", "telemetry", "run", "--", "ok.py"], cwd=tmp_path,
                         env=_env(tmp_path), capture_output=True, text=True, timeout=300, umask=0)
    assert out.returncode == 0 and "ran" in out.stdout, out.stderr[-3000:]
    log_dir = _run_dir(tmp_path, out)
    assert not stat.S_IMODE((tmp_path / "telemetry").stat().st_mode) & stat.S_IWOTH
    assert stat.S_IMODE((log_dir / "daemon.out").stat().st_mode) == 0o600


def test_a_daemon_drained_during_the_run_is_not_followed_and_not_asked_again(tmp_path):
    """The user drains the daemon while the script runs (`telemetry drain`): no successor is
    started (it stopped as asked), and the launcher does not send its own drain request to the
    gone daemon (it waited a minute for an answer nobody could give: a reviewer's find)."""
    (tmp_path / "drains.py").write_text(textwrap.dedent("""
        import subprocess, sys, time
        import telemetry
        tm = telemetry.TelemetryClient()
        for s in range(5):
            tm.log(s, {"train/loss": 1.0})
        tm.close()
        r = subprocess.run([sys.executable, "-m", "telemetry", "drain"], capture_output=True, text=True)
        print("drain rc", r.returncode, flush=True)
        time.sleep(2)          # the launcher's keeper looks at its daemon meanwhile
    """))
    out = subprocess.run([sys.executable, "-m", "telemetry", "run", "--", "drains.py"], cwd=tmp_path,
                         env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "drain rc 0" in out.stdout, out.stdout[-2000:] + out.stderr[-3000:]
    assert "successor" not in out.stderr and "no answer to the drain request" not in out.stderr, out.stderr[-3000:]


def test_a_symlink_at_daemon_out_is_refused_in_one_line(tmp_path):
    """A run directory whose daemon.out is a symlink (planted, or left by a tool): refused with
    one line and exit code 2, nothing written through it (it was a traceback: a reviewer's find)."""
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    (run / "daemon.out").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "ok.py").write_text("print('ran')\n")
    out = subprocess.run([sys.executable, "-m", "telemetry", "run", "--run-dir", str(run), "--", "ok.py"],
                         cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "daemon.out" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not (tmp_path / "elsewhere").exists()


SINK_REFUSED = """
import time
from telemetry import TelemetryClient

tm = TelemetryClient()
tm.hello({"framework": "wandb", "wandb": {"project": "a/b", "name": "refused"}, "world_size": 1})
for step in range(3):
    tm.log(step, {"loss": 1.0 / (step + 1)})
time.sleep(float(__import__("sys").argv[1]))   # long enough for the launcher to ask the daemon
tm.close()
"""


@pytest.mark.parametrize("quiet", [False, True])
def test_a_w_and_b_run_the_sink_could_not_make_is_said_quiet_or_not(tmp_path, quiet):
    """The daemon's W&B sink fails at start (W&B refuses the init it is given: here a project
    name with "/"): `telemetry run` says so on stderr while the script runs, and its summary
    names it, with --quiet too (before: an ERROR line among the streamed log, nothing at all
    with --quiet; the summary's "sink drops" alone; exit 0 and no W&B run)."""
    (tmp_path / "refused.py").write_text(textwrap.dedent(SINK_REFUSED))
    out = subprocess.run([sys.executable, "-m", "telemetry", "run", "--wandb", "offline", *(["--quiet"] if quiet else []),
                          "--run-dir", str(tmp_path / "r"), "--", "refused.py", "6"], cwd=tmp_path,
                         env=_env(tmp_path, WANDB_SILENT="true"), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    said = [ln for ln in out.stderr.splitlines() if ln.startswith("telemetry run: the W&B run was not made")]
    assert len(said) == 1 and "Invalid project name 'a/b'" in said[0], out.stderr[-3000:]
    assert f"kept in {tmp_path / 'r'}" in said[0]
    summary = [ln for ln in out.stdout.splitlines() if ln.strip().startswith("W&B run")]
    assert len(summary) == 1 and "NOT MADE: UsageError" in summary[0], out.stdout
    assert _steps(tmp_path / "r")[2]["loss"] == 1.0 / 3           # the run itself is kept
