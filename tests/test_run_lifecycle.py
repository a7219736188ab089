"""`telemetry run` ended by a signal, an outside drain or `kill -9`: the run is still drained and
recorded, and nothing of it is left running or on /tmp.

Real processes throughout: the command, its daemon, the script (and a child of the script that
keeps a client open, so that a drain lasts long enough to be interrupted: intake waits for that
client's bye for a few seconds). No terminal: the script runs in a process group of its own and
gets what `telemetry run` passes on. Timeouts are hang detectors only."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Logs 20 steps, then ends when STOP_FILE exists (at once when there is none). With a child, the
# child keeps a client open and sending (no bye) until the test ends it: a drain waits on it.
SCRIPT = """
import os, subprocess, sys, time
from telemetry import TelemetryClient

if sys.argv[1:] == ["child"]:
    tm = TelemetryClient(); tm.hello({})
    step, deadline = 0, time.monotonic() + 120
    while time.monotonic() < deadline and not os.path.exists(os.environ["CHILD_STOP"]):
        tm.log(step, {"worker/x": 1.0}); step += 1; time.sleep(0.05)
        if step == 5:
            open(os.environ["CHILD_STOP"] + ".sending", "w").close()
    sys.exit(0)
tm = TelemetryClient(); tm.hello({})
if os.environ.get("WITH_CHILD"):
    subprocess.Popen([sys.executable, __file__, "child"])
    deadline = time.monotonic() + 120      # its client sends before this one ends (then a drain waits on it)
    while not os.path.exists(os.environ["CHILD_STOP"] + ".sending") and time.monotonic() < deadline:
        time.sleep(0.05)
for step in range(20):
    tm.log(step, {"train/loss": 1.0 / (step + 1)}); time.sleep(0.02)
print("reached", flush=True)
stop = os.environ.get("STOP_FILE")
deadline = time.monotonic() + 120
while stop and not os.path.exists(stop) and time.monotonic() < deadline:
    time.sleep(0.05)
tm.close()
print("main done", flush=True)
"""


class Run:
    """`telemetry run -- s.py` in the background, its output in files."""

    def __init__(self, tmp_path: Path, *args: str, script: str = SCRIPT, **env: str) -> None:
        self.tmp_path = tmp_path
        (tmp_path / "s.py").write_text(textwrap.dedent(script))
        self.runtime = tmp_path / "rt"            # made by `telemetry run`: the run's alone
        self.child_stop = tmp_path / "child-stop"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRY_", "WANDB_"))}
        full_env.update({"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "WANDB_MODE": "disabled",
                         "TELEMETRY_RUNTIME_DIR": str(self.runtime), "CHILD_STOP": str(self.child_stop), **env})
        self.out_path, self.err_path = tmp_path / "out.txt", tmp_path / "err.txt"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "telemetry", "run", "--wandb", "disabled", *args,
                                          "--", "s.py"], cwd=tmp_path, env=full_env, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=err)

    @property
    def text(self) -> str:
        return self.out_path.read_text(errors="replace") + self.err_path.read_text(errors="replace")

    def wait_for(self, needle: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while needle not in self.text:
            assert time.monotonic() < deadline and self.proc.poll() is None, (needle, self.text[-3000:])
            time.sleep(0.05)

    def log_dir(self) -> Path:
        m = re.search(r"writing to (\S+);", self.text)
        assert m, self.text[-3000:]
        return Path(m.group(1))

    def daemon_pid(self) -> int:
        m = re.search(r"daemon pid (\d+),", self.text)
        assert m, self.text[-3000:]
        return int(m.group(1))

    def finish(self) -> int:
        return self.proc.wait(180)

    def close(self) -> None:
        self.child_stop.touch()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def run_of(tmp_path):
    runs: list[Run] = []

    def start(*args: str, script: str = SCRIPT, **env: str) -> Run:
        runs.append(Run(tmp_path, *args, script=script, **env))
        return runs[-1]

    yield start
    for r in runs:
        r.close()


def _gone(pid: int, timeout_s: float = 120) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def _events(log_dir: Path, name: str) -> list[dict]:
    rows = [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["data"] for r in rows if r.get("kind") == "event" and r.get("name") == name]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_the_drain_leaves_the_drain_to_finish(run_of, signum):
    # The Ctrl-C that ended the script, pressed again, or a scheduler's SIGTERM after the script
    # ended: the daemon was SIGKILLed mid-drain (no drain.json, no script_exit, the reserve left).
    run = run_of(WITH_CHILD="1")
    run.wait_for("main done")
    run.wait_for("telemetry.daemon: draining (drain request)")
    run.proc.send_signal(signum)
    assert run.finish() == 0, run.text[-3000:]
    log_dir = run.log_dir()
    final = json.loads((log_dir / "drain.json").read_text())
    assert final["stop_code"] == "drain_request" and final["drained"], final
    assert _events(log_dir, "script_exit") == [{"exit_code": 0, "exited_at": _events(log_dir, "script_exit")[0]["exited_at"]}]
    assert not (log_dir / ".telemetry-reserve").exists()
    assert (log_dir / "goodput.json").is_file()
    assert "while the daemon drains: the drain goes on" in run.text, run.text[-3000:]
    assert "trainer exit code  0" in run.text, run.text[-3000:]
    assert not run.runtime.exists(), sorted(p.name for p in run.runtime.iterdir())


def test_a_second_signal_during_the_drain_stops_the_wait_not_the_drain(run_of):
    run = run_of(WITH_CHILD="1")
    run.wait_for("main done")
    run.wait_for("telemetry.daemon: draining (drain request)")
    run.proc.send_signal(signal.SIGINT)
    run.wait_for("the drain goes on")
    run.proc.send_signal(signal.SIGINT)
    assert run.finish() == 0, run.text[-3000:]
    assert "not waiting for the drain" in run.text, run.text[-3000:]
    daemon = run.daemon_pid()
    run.child_stop.touch()
    assert _gone(daemon), "the daemon did not end its drain"
    log_dir = run.log_dir()
    final = json.loads((log_dir / "drain.json").read_text())
    assert final["stop_code"] == "drain_request" and final["drained"], final
    assert [e["exit_code"] for e in _events(log_dir, "script_exit")] == [0]
    assert not run.runtime.exists()         # the daemon removed it at its end


def test_sighup_is_passed_on_and_the_run_drained_with_its_exit(run_of, tmp_path):
    # The terminal closed: `telemetry run` died with it, the script by SIGHUP, and its W&B run
    # said exit 0.
    run = run_of(STOP_FILE=str(tmp_path / "never"))
    run.wait_for("reached")
    run.proc.send_signal(signal.SIGHUP)
    assert run.finish() == 128 + signal.SIGHUP, run.text[-3000:]
    log_dir = run.log_dir()
    assert [e["exit_code"] for e in _events(log_dir, "script_exit")] == [128 + signal.SIGHUP]
    assert json.loads((log_dir / "drain.json").read_text())["stop_code"] == "drain_request"
    assert "trainer exit code  129" in run.text, run.text[-3000:]
    assert not run.runtime.exists()


# On the daemon's PYTHONPATH: the daemon says it has started, then waits for the test's word
# before it goes on to start (and to say ready): the signal comes while it starts, every time.
HOLD_DAEMON = """
import os, time
if b"--log-dir" in open("/proc/self/cmdline", "rb").read():
    open(os.path.join(os.environ["HOLD_DIR"], "started"), "w").close()
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(os.environ["HOLD_DIR"], "go")) and time.monotonic() < deadline:
        time.sleep(0.02)
"""


def test_a_signal_before_the_script_starts_drains_the_daemon_and_runs_nothing(tmp_path):
    # SIGTERM while the daemon starts: `telemetry run` died at once, leaving the daemon to
    # notice alone and the runtime directory behind.
    (tmp_path / "s.py").write_text("open('ran', 'w').close()\n")
    hold = tmp_path / "hold"
    hold.mkdir()
    (hold / "sitecustomize.py").write_text(HOLD_DAEMON)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRY_", "WANDB_"))}
    env.update({"PYTHONPATH": os.pathsep.join((str(hold), str(ROOT))), "HOLD_DIR": str(hold),
                "TELEMETRY_RUNTIME_DIR": str(tmp_path / "rt")})
    out_path = tmp_path / "out.txt"
    with open(out_path, "wb") as out:
        p = subprocess.Popen([sys.executable, "-m", "telemetry", "run", "--wandb", "disabled", "--run-dir", "r", "--",
                              "s.py"], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 120
        while not (hold / "started").exists():
            assert time.monotonic() < deadline and p.poll() is None
            time.sleep(0.02)
        p.send_signal(signal.SIGTERM)
        while "before the script started" not in out_path.read_text() and p.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        (hold / "go").touch()
        p.wait(180)
        out = out_path.read_text()
    finally:
        (hold / "go").touch()
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert not (tmp_path / "ran").exists()
    assert "SIGTERM before the script started" in out, out[-3000:]
    assert json.loads((tmp_path / "r" / "drain.json").read_text())["stop_code"] == "sigterm"
    assert not (tmp_path / "rt").exists()


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_kill_9_of_telemetry_run_ends_the_dashboard_and_the_daemon_removes_the_runtime_dir(run_of, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = run_of("--attach", "dashboard", STOP_FILE=str(tmp_path / "never"), TELEMETRY_DASHBOARD_PORT=str(port))
    run.wait_for("reached")
    assert not _port_free(port), "the dashboard does not serve"
    daemon = run.daemon_pid()
    run.proc.kill()
    run.proc.wait()
    assert _gone(daemon), "the daemon did not drain after its `telemetry run` was killed"
    deadline = time.monotonic() + 60
    while not _port_free(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _port_free(port), "the attached dashboard outlived `telemetry run`"
    assert not run.runtime.exists(), sorted(p.name for p in run.runtime.iterdir())
    final = json.loads((run.log_dir() / "drain.json").read_text())
    assert final["stop_code"] == "watched_process_exited", final


# An unmodified W&B script (`import wandb`: --as-wandb's), its pid said, until the test stops it.
WANDB_SCRIPT = """
import os, time
import wandb

wandb.init(project="p")
for step in range(5):
    wandb.log({"train/loss": 1.0 / (step + 1)})
print("reached", os.getpid(), flush=True)
time.sleep(600)
"""


def test_ctrl_c_of_an_as_wandb_script_is_its_sigint(run_of):
    """The script Ctrl-C'd (SIGINT to it: KeyboardInterrupt) ends by SIGINT, 130 as the same
    script gives without telemetry: `telemetry run`'s exit code, the run's script_exit and
    summary. Its W&B run's finish at exit imported modules whose dataclasses run exec(), and
    CPython then forgets the KeyboardInterrupt: it was 1, "FAILED (the script's exit code 1)"."""
    run = run_of("--as-wandb", script=WANDB_SCRIPT)
    run.wait_for("reached")
    script_pid = int(re.search(r"reached (\d+)", run.text).group(1))
    os.kill(script_pid, signal.SIGINT)
    assert run.finish() == 128 + signal.SIGINT, run.text[-3000:]
    log_dir = run.log_dir()
    assert [e["exit_code"] for e in _events(log_dir, "script_exit")] == [128 + signal.SIGINT]
    assert "trainer exit code  130" in run.text, run.text[-3000:]
    # The launch's claim of its run (wandb_run.id) is the run's own: the daemon removes it with
    # the rest, without a word (it said the directory was kept, for a file it did not know).
    assert "kept: it holds what this run did not make" not in run.text, run.text[-3000:]
    assert not run.runtime.exists(), sorted(p.name for p in run.runtime.iterdir())


def test_kill_9_of_telemetry_run_as_wandb_leaves_no_runtime_dir(run_of):
    """`telemetry run --as-wandb` SIGKILLed: its daemon drains and removes the runtime directory
    with the launch's claim of its run in it (it kept the directory for that file)."""
    run = run_of("--as-wandb", script=WANDB_SCRIPT)
    run.wait_for("reached")
    daemon = run.daemon_pid()
    run.proc.kill()
    run.proc.wait()
    assert _gone(daemon), "the daemon did not drain after its `telemetry run` was killed"
    assert not run.runtime.exists(), sorted(p.name for p in run.runtime.iterdir())
    final = json.loads((run.log_dir() / "drain.json").read_text())
    assert final["stop_code"] == "watched_process_exited", final


# A second W&B run (another id: a daemon of its own), open when the script ends without its
# exit hooks: by os._exit, or by the SIGTERM the test sends it.
SECOND_RUN_SCRIPT = """
import os, time
import wandb

wandb.init(project="p", name="first")
wandb.log({"a": 1.0})
wandb.finish()
run = wandb.init(project="p", name="second")
for step in range(5):
    wandb.log({"b": float(step)})
print("second", run.id, os.getpid(), flush=True)
if os.environ.get("HOW") == "os_exit":
    os._exit(0)
time.sleep(600)
"""


@pytest.mark.parametrize("how", ["os_exit", "sigterm"])
def test_telemetry_run_returns_once_the_scripts_other_runs_are_drained(run_of, tmp_path, how):
    """The second run's daemon drains by itself once the script is gone (its exit hook never ran):
    `telemetry run` returned before that, the daemon still up and its drain.json not written."""
    run = run_of("--as-wandb", script=SECOND_RUN_SCRIPT, HOW=how)
    run.wait_for("second ")
    second_id, script_pid = re.search(r"second (\S+) (\d+)", run.text).groups()
    if how == "sigterm":
        os.kill(int(script_pid), signal.SIGTERM)
    assert run.finish() == (0 if how == "os_exit" else 128 + signal.SIGTERM), run.text[-3000:]
    second = tmp_path / "telemetry" / second_id
    final = json.loads((second / "drain.json").read_text())
    assert final["stop_code"] == "watched_process_exited", final
    # Its lock released, everything written: it is exiting (a moment, for init to reap it).
    assert _gone(final["pid"], timeout_s=10), "the second run's daemon is still up"
    assert "telemetry run: waiting up to" in run.text and f"run second drained: {second / 'drain.json'}" in run.text, \
        run.text[-3000:]
    assert "kept: it holds what this run did not make" not in run.text, run.text[-3000:]
    assert not run.runtime.exists(), sorted(p.name for p in run.runtime.iterdir())


def test_an_outside_drain_under_way_when_the_script_ends_is_not_waited_on(run_of, tmp_path):
    # `telemetry drain` of the run's daemon while the script runs; the script ends while that
    # drain is under way (the child's client holds it open). The drain request `telemetry run`
    # then sends is never answered: it waited out its 60 s.
    stop = tmp_path / "stop"
    run = run_of(WITH_CHILD="1", STOP_FILE=str(stop))
    run.wait_for("reached")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TELEMETRY_")}
    env.update({"PYTHONPATH": str(ROOT), "TELEMETRY_RUNTIME_DIR": str(run.runtime)})
    drain = subprocess.Popen([sys.executable, "-m", "telemetry", "drain", "--timeout", "120"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        run.wait_for("telemetry.daemon: draining (drain request)")
        stop.touch()
        run.wait_for("main done")
        run.child_stop.touch()       # the outside drain can end now
        assert run.finish() == 0, run.text[-3000:]
    finally:
        drain.wait(180)
    assert "no answer to the drain request" not in run.text, run.text[-3000:]
    assert "had drained already (drain request)" in run.text, run.text[-3000:]
    assert "trainer exit code  0" in run.text, run.text[-3000:]
    assert not run.runtime.exists()


def test_the_daemon_configs_wandb_mode_is_kept_and_a_bad_one_refused_before_anything(tmp_path):
    (tmp_path / "s.py").write_text("print('ran')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRY_", "WANDB_"))}
    env.update({"PYTHONPATH": str(ROOT), "TELEMETRY_RUNTIME_DIR": str(tmp_path / "rt")})
    (tmp_path / "bad.yaml").write_text("wandb: {mode: sometimes}\n")
    p = subprocess.run([sys.executable, "-m", "telemetry", "run", "--daemon-config", "bad.yaml", "--", "s.py"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr[-3000:]
    assert p.stderr.count("\n") == 1 and "wandb.mode 'sometimes'" in p.stderr, p.stderr
    assert "ran" not in p.stdout and not (tmp_path / "telemetry").exists() and not (tmp_path / "rt").exists()

    (tmp_path / "off.yaml").write_text("wandb: {mode: disabled}\n")
    p = subprocess.run([sys.executable, "-m", "telemetry", "run", "--run-dir", "r", "--daemon-config", "off.yaml",
                        "--", "s.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    # W&B off: no W&B sink, no offline run (without the file's mode, offline was the default).
    assert "wandb" not in json.loads((tmp_path / "r" / "drain.json").read_text())["sinks"]
    assert not (tmp_path / "r" / "wandb").exists()


def test_the_daemon_removes_only_what_the_run_made_in_its_runtime_directory(tmp_path, caplog):
    """--remove-runtime-dir takes the directory from the environment: given a directory of the
    user's by mistake, the daemon removes its own names alone and keeps the directory."""
    import logging

    from telemetry.daemon.shutdown import remove_runtime_dir

    def made(d):
        d.mkdir()
        for name in ("ingest.sock", "pub.sock", "control.sock", "control.sock.token", "daemon.lock",
                     "stacks-rank0-pid12.txt"):
            (d / name).write_text("x")
        (d / "ingest.sock.clients").mkdir()
        (d / "ingest.sock.clients" / "00000000000000ab").write_text("page")
        return d

    run = made(tmp_path / "run")
    remove_runtime_dir(run)
    assert not run.exists()

    home = made(tmp_path / "home")
    (home / "thesis.tex").write_text("years of work")
    with caplog.at_level(logging.WARNING, logger="telemetry.daemon"):
        remove_runtime_dir(home)
    assert sorted(p.name for p in home.iterdir()) == ["thesis.tex"]
    assert "kept: it holds what this run did not make (thesis.tex)" in caplog.text


def test_wandbs_shared_mode_in_the_environment_is_online(tmp_path):
    # $WANDB_MODE=shared (W&B's online run written by several processes) became offline.
    # No API key and W&B's server at a closed local port: nothing leaves the machine, and the
    # online run cannot be made, which the run says.
    (tmp_path / "s.py").write_text("import os\nprint('mode', os.environ['WANDB_MODE'])\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRY_", "WANDB_"))}
    env.update({"PYTHONPATH": str(ROOT), "TELEMETRY_RUNTIME_DIR": str(tmp_path / "rt"), "HOME": str(tmp_path),
                "WANDB_MODE": "shared", "WANDB_BASE_URL": "http://127.0.0.1:9", "WANDB_SILENT": "true"})
    p = subprocess.run([sys.executable, "-m", "telemetry", "run", "--run-dir", "r", "--", "s.py"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "mode online" in p.stdout, p.stdout
    assert json.loads((tmp_path / "r" / "drain.json").read_text())["sinks"]["wandb"]["mode"] == "online"
