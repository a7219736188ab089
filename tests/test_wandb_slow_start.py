"""A W&B start slower than the daemon's drain, and one that fails: the daemon's W&B sink with
the real W&B (offline), its `wandb.init` held or refused by the test in the daemon's process.

On a loaded host W&B's start (its service process, `wandb.init`) takes tens of seconds: a
short script's run reached W&B with no rows, the drain having given up on a sink that was still
starting (counted, but lost to the user, whose own `wandb.init` would have been waited for).
A start W&B refused was tried again at every batch, each try as long as W&B's init timeout."""
from __future__ import annotations

import glob
import json
import os
import threading
import time
from pathlib import Path

import pytest

import telemetry.wandb as tw
from telemetry.client import TelemetryClient
from wandb_offline import read_records, user_history, wait_finished

pytest.importorskip("wandb")

# On the daemon's PYTHONPATH: its W&B, with `wandb.init` counted (a line in $HOLD_DIR/inits per
# call), then refused ($HOLD_FAIL) or held until the test makes $HOLD_DIR/go; with
# $HOLD_FINISH, `run.finish` is held instead ($HOLD_DIR/finishing, then the same wait).
HOLD_WANDB_INIT = """
import os, time
if b"--log-dir" in open("/proc/self/cmdline", "rb").read():
    import wandb
    _init, _finish = wandb.init, wandb.Run.finish

    def hold(name):
        with open(os.path.join(os.environ["HOLD_DIR"], name), "a") as f:
            f.write(name + "\\n")
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(os.environ["HOLD_DIR"], "go")) and time.monotonic() < deadline:
            time.sleep(0.02)

    def init(*args, **kwargs):
        if os.environ.get("HOLD_FAIL"):
            open(os.path.join(os.environ["HOLD_DIR"], "inits"), "a").write("inits\\n")
            raise RuntimeError("refused by the test")
        if not os.environ.get("HOLD_FINISH"):
            hold("inits")
        return _init(*args, **kwargs)

    def finish(self, *args, **kwargs):
        hold("finishing")
        return _finish(self, *args, **kwargs)

    wandb.init = init
    if os.environ.get("HOLD_FINISH"):
        wandb.Run.finish = finish
    if os.environ.get("HOLD_ALLOWANCE_S"):     # the drain's wait for W&B, shortened for a test
        from telemetry.daemon.sinks.wandb_sink import WandbSink
        WandbSink.phase_allowance_s = float(os.environ["HOLD_ALLOWANCE_S"])
"""
DRAIN_TIMEOUT_S = 2.0


@pytest.fixture(autouse=True)
def _no_run_left():
    yield
    tw.finish()


def held_daemon(make_daemon, tmp_path: Path, fail: bool = False, finish: bool = False,
                allowance_s: float | None = None):
    hold = tmp_path / "hold"
    hold.mkdir()
    (hold / "sitecustomize.py").write_text(HOLD_WANDB_INIT)
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(hold), os.environ.get("PYTHONPATH", "")) if p),
           "HOLD_DIR": str(hold)}
    if fail:
        env["HOLD_FAIL"] = "1"
    if finish:
        env["HOLD_FINISH"] = "1"
    if allowance_s is not None:
        env["HOLD_ALLOWANCE_S"] = str(allowance_s)
    d = make_daemon(wandb="offline", config={"drain_timeout_s": DRAIN_TIMEOUT_S}, env=env)
    return d, hold


def one_step_then_held(d, hold: Path) -> None:
    """A bare client's one step, then until the test says `go` the daemon's W&B sink is held
    inside wandb.init."""
    tm = TelemetryClient(d.ingest, rank=0)
    tm.log(0, {"train/loss": 1.0})
    tm.close()
    wait_for(hold / "inits")


def rows_then_held(make_daemon, tmp_path: Path, monkeypatch, n: int):
    """A telemetry.wandb run of `n` rows ({"loss": i}), finished, its daemon's W&B sink held
    inside wandb.init until the test says `go`: (the daemon, the hold directory)."""
    d, hold = held_daemon(make_daemon, tmp_path)
    monkeypatch.setenv("TELEMETRY_ENDPOINT", d.ingest)
    tw.init(project="p")
    for i in range(n):
        tw.log({"loss": float(i)})
    tw.finish()
    wait_for(hold / "inits")
    return d, hold


def release(hold: Path, p) -> None:
    """The held W&B call goes on, and the process `p` is not left behind."""
    (hold / "go").touch()
    if p.poll() is None:
        p.kill()
        p.wait()


def wait_for(path: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never came"
        time.sleep(0.02)


def test_a_wandb_start_slower_than_the_drain_keeps_every_row(tmp_path, make_daemon, monkeypatch):
    d, hold = rows_then_held(make_daemon, tmp_path, monkeypatch, 5)
    rc: list[int] = []
    stopper = threading.Thread(target=lambda: rc.append(d.stop(timeout_s=180)))
    stopper.start()
    time.sleep(DRAIN_TIMEOUT_S + 3)      # past the drain's deadline: the start is still held
    (hold / "go").touch()
    stopper.join(200)
    assert rc == [0], d.output()[-3000:]
    (run_file,) = [wait_finished(f) for f in glob.glob(str(d.log_dir / "wandb" / "offline-run-*" / "run-*.wandb"))]
    assert user_history(run_file) == {i: {"loss": i} for i in range(5)}
    final = json.loads((d.log_dir / "drain.json").read_text())
    assert final["drained"] and final["sinks"]["wandb"]["dropped"] == 0, final["sinks"]["wandb"]
    assert "the drain waits for it" in d.output()


def test_a_wandb_finish_slower_than_the_drain_still_writes_the_runs_exit(tmp_path, make_daemon, monkeypatch):
    # The daemon exited while W&B's finish was under way: the run had no exit record (W&B shows
    # it crashed, or running).
    d, hold = held_daemon(make_daemon, tmp_path, finish=True)
    monkeypatch.setenv("TELEMETRY_ENDPOINT", d.ingest)
    tw.init(project="p")
    for i in range(3):
        tw.log({"loss": float(i)})
    tw.finish(exit_code=3)
    rc: list[int] = []
    stopper = threading.Thread(target=lambda: rc.append(d.stop(timeout_s=180)))
    stopper.start()
    wait_for(hold / "finishing")
    time.sleep(DRAIN_TIMEOUT_S + 3)      # past the drain's deadline: the finish is still held
    (hold / "go").touch()
    stopper.join(200)
    assert rc == [0], d.output()[-3000:]
    (run_file,) = [wait_finished(f, timeout_s=60)
                   for f in glob.glob(str(d.log_dir / "wandb" / "offline-run-*" / "run-*.wandb"))]
    assert [r.exit.exit_code for r in read_records(run_file) if r.WhichOneof("record_type") == "exit"] == [3]
    assert user_history(run_file) == {i: {"loss": i} for i in range(3)}
    assert "sink wandb is still finishing: the drain waits for it" in d.output()


def test_a_refused_wandb_start_is_tried_once_and_what_it_lost_is_counted(tmp_path, make_daemon):
    d, hold = held_daemon(make_daemon, tmp_path, fail=True)
    tm = TelemetryClient(d.ingest, rank=0)
    n = 40
    for step in range(n):
        tm.log(step, {"train/loss": 1.0 / (step + 1)})
        time.sleep(0.05)                 # steps in many of the sink's batches: each once tried W&B again
    tm.close()
    assert d.stop(timeout_s=120) == 0, d.output()[-3000:]
    assert (hold / "inits").read_text().splitlines() == ["inits"]
    final = json.loads((d.log_dir / "drain.json").read_text())
    w = final["sinks"]["wandb"]
    assert w["written"] == 0 and w["dropped"] == w["in"] > n, w
    assert w["dropped_by_reason"]["no_run"] == w["dropped"], w
    assert "refused by the test" in w["open_error"] and not w["opened"]


def test_telemetry_run_waits_for_a_slow_wandb_start_and_the_script_run_has_its_rows(tmp_path):
    # The user's path: `telemetry run --as-wandb` of a short script, W&B's start in the daemon
    # slower than the drain's deadline.
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    hold = tmp_path / "hold"
    hold.mkdir()
    (hold / "sitecustomize.py").write_text(HOLD_WANDB_INIT)
    (tmp_path / "d.yaml").write_text(f"drain_timeout_s: {DRAIN_TIMEOUT_S}\n")
    (tmp_path / "s.py").write_text("import wandb\nwandb.init(project='p')\n"
                                   "for i in range(5):\n    wandb.log({'loss': float(i)})\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRY_", "WANDB_"))}
    env.update({"PYTHONPATH": os.pathsep.join((str(hold), str(root))), "HOLD_DIR": str(hold),
                "TELEMETRY_RUNTIME_DIR": str(tmp_path / "rt"), "WANDB_SILENT": "true"})
    p = subprocess.Popen([sys.executable, "-m", "telemetry", "run", "--as-wandb", "--wandb", "offline",
                          "--daemon-config", "d.yaml", "--run-dir", "r", "--", "s.py"], cwd=tmp_path, env=env,
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(hold / "inits")
        deadline = time.monotonic() + 120
        while not (tmp_path / "r" / "daemon.out").exists() or \
                "the drain waits for it" not in (tmp_path / "r" / "daemon.out").read_text():
            assert time.monotonic() < deadline and p.poll() is None
            time.sleep(0.05)
        time.sleep(DRAIN_TIMEOUT_S + 1)        # past the drain's own deadline
        (hold / "go").touch()
        out, _ = p.communicate(timeout=240)
    finally:
        release(hold, p)
    assert p.returncode == 0, out[-3000:]
    (run_file,) = [wait_finished(f) for f in glob.glob(str(tmp_path / "r" / "wandb" / "offline-run-*" / "run-*.wandb"))]
    assert user_history(run_file) == {i: {"loss": i} for i in range(5)}
    assert "still starting: the drain waits for it" in out
    assert json.loads((tmp_path / "r" / "drain.json").read_text())["drained"]


def test_telemetry_run_waits_as_long_as_the_daemons_drain_may_take(tmp_path):
    # It killed the daemon after 60 s whatever its drain_timeout_s said.
    from telemetry.daemon.sinks.wandb_sink import PHASE_ALLOWANCE_S
    from telemetry.tools import run

    (tmp_path / "d.yaml").write_text("drain_timeout_s: 300\n")
    mode, drain_timeout_s, why = run._daemon_config(str(tmp_path / "d.yaml"))
    assert (mode, drain_timeout_s, why) == (None, 300.0, "")
    assert run._drain_wait_s(drain_timeout_s, "offline") > 300 + PHASE_ALLOWANCE_S
    assert 300 < run._drain_wait_s(drain_timeout_s, "disabled") < 300 + PHASE_ALLOWANCE_S
    assert run._daemon_config(None)[1] > 0


def test_telemetry_drain_waits_as_long_as_the_daemon_says_its_drain_may_take(tmp_path, make_daemon):
    # `telemetry drain` gave up after 15 s ("no answer from a telemetry daemon"), and exited 1,
    # while the daemon was draining fine, waiting for W&B's start.
    import subprocess
    import sys

    from telemetry.daemon.sinks.wandb_sink import PHASE_ALLOWANCE_S

    d, hold = held_daemon(make_daemon, tmp_path)
    limits = d.status()["limits"]
    assert limits["drain_may_take_s"] == limits["drain_timeout_s"] + PHASE_ALLOWANCE_S
    one_step_then_held(d, hold)
    drain = subprocess.Popen([sys.executable, "-m", "telemetry", "drain", "--json", "--control", d.control],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(18)                   # longer than the old fixed 15 s
        (hold / "go").touch()
        out, err = drain.communicate(timeout=200)
    finally:
        (hold / "go").touch()
        if drain.poll() is None:
            drain.kill()
    assert drain.returncode == 0, err
    final = json.loads(out)
    assert final["sinks"]["wandb"]["written"] >= 1 and final["sinks"]["wandb"]["dropped"] == 0
    d.proc.wait(60)


def test_telemetry_drain_of_no_daemon_says_so_at_once(tmp_path):
    import subprocess
    import sys

    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "telemetry", "drain", "--control", f"ipc://{tmp_path}/none.sock"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "no answer" in p.stderr, p.stderr
    assert time.monotonic() - t0 < 60       # the probe's few seconds, not the drain's long wait


def test_a_wandb_start_longer_than_the_drain_allows_is_said_as_a_run_not_made(tmp_path, make_daemon, capsys):
    # Past the allowance the run was lost with nothing said: no open_error, no reason, and
    # `telemetry run`'s summary had no "W&B run NOT MADE" line.
    d, hold = held_daemon(make_daemon, tmp_path, allowance_s=2.0)
    tm = TelemetryClient(d.ingest, rank=0)
    for step in range(5):
        tm.log(step, {"train/loss": 1.0})
    tm.close()
    wait_for(hold / "inits")
    assert d.stop(timeout_s=120) == 0, d.output()[-3000:]       # the start is still held
    (hold / "go").touch()
    final = json.loads((d.log_dir / "drain.json").read_text())
    w = final["sinks"]["wandb"]
    assert not w["opened"] and "start had not ended" in w["open_error"], w
    assert w["in"] == w["written"] + w["dropped"], w
    assert "still starting after the drain waited" in d.output()
    from telemetry.consumers import summary

    capsys.readouterr()
    assert summary.main([str(d.log_dir), "--drain-json", str(d.log_dir / "drain.json")]) == 0
    assert "W&B run            NOT MADE: W&B's start had not ended" in capsys.readouterr().out


def test_a_backlog_given_up_at_the_drain_still_ends_the_run_with_the_scripts_exit_code(tmp_path, make_daemon,
                                                                                        monkeypatch):
    # The script's exit code (and the ranks' finish) were records behind the backlog W&B gave
    # up on: a script that exited 0 had its W&B run end with exit 1.
    from telemetry.shared import control

    d, hold = rows_then_held(make_daemon, tmp_path, monkeypatch, 20_000)
    answer: list[dict] = []
    drain = threading.Thread(target=lambda: answer.append(control.request(d.control, "drain", timeout_s=180,
                                                                          exit_code=0)))
    drain.start()
    time.sleep(DRAIN_TIMEOUT_S + 1)
    (hold / "go").touch()               # W&B starts with far more rows than it logs in what is left
    drain.join(200)
    d.proc.wait(60)
    w = answer[0]["sinks"]["wandb"]
    assert w["dropped"] > 0, w           # the backlog was given up on
    (run_file,) = [wait_finished(f, timeout_s=60)
                   for f in glob.glob(str(d.log_dir / "wandb" / "offline-run-*" / "run-*.wandb"))]
    assert [r.exit.exit_code for r in read_records(run_file) if r.WhichOneof("record_type") == "exit"] == [0]


def test_status_and_a_second_drain_are_answered_during_a_long_drain(tmp_path, make_daemon):
    # The daemon's loop did not serve its control socket while it drained: `telemetry status`
    # and a second `telemetry drain` went unanswered, for up to a minute now that the drain
    # waits for W&B's start.
    import subprocess
    import sys

    from telemetry.shared import control

    d, hold = held_daemon(make_daemon, tmp_path)
    one_step_then_held(d, hold)
    first: list[dict] = []
    drain = threading.Thread(target=lambda: first.append(control.request(d.control, "drain", timeout_s=180)))
    drain.start()
    time.sleep(DRAIN_TIMEOUT_S + 1.5)               # the drain now waits for W&B's start
    try:
        st = control.request(d.control, "status", timeout_s=30)
        assert st["ok"] and st["pid"] == d.proc.pid
        now = time.time()          # the goodput ledger has closed its books: an exclusion is refused, said
        ex = control.request(d.control, "exclude", timeout_s=30, extra={"start": now - 10, "end": now})
        assert not ex["ok"] and "the run has ended" in ex["error"], ex
        second = subprocess.Popen([sys.executable, "-m", "telemetry", "drain", "--json", "--timeout", "120",
                                   "--control", d.control], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1)
    finally:
        (hold / "go").touch()
    out, err = second.communicate(timeout=200)
    drain.join(200)
    assert second.returncode == 0, err
    assert "a drain was already under way" in err, err
    final = json.loads(out)
    assert final["records_in"] == first[0]["records_in"] >= 1 and final["drain_under_way"]
    assert "drain_under_way" not in first[0]


def test_a_wait_longer_than_libzmq_takes_is_its_longest(tmp_path, make_daemon):
    # A drain_timeout_s of a year made `telemetry run`'s drain request fail ("value too large
    # to convert to int"): no script_exit event, a SIGTERM instead.
    from telemetry.shared import control

    d = make_daemon()
    assert control.request(d.control, "status", timeout_s=3.0e7)["ok"]


def test_telemetry_drain_stops_waiting_when_the_daemon_dies(tmp_path, make_daemon):
    import signal
    import subprocess
    import sys

    d, hold = held_daemon(make_daemon, tmp_path)
    one_step_then_held(d, hold)
    drain = subprocess.Popen([sys.executable, "-m", "telemetry", "drain", "--control", d.control],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while "draining (drain request)" not in d.output():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        d.proc.send_signal(signal.SIGKILL)
        out, err = drain.communicate(timeout=120)
    finally:
        (hold / "go").touch()
        if drain.poll() is None:
            drain.kill()
    assert drain.returncode == 1 and "exited without answering" in err, err
