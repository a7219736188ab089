"""`run.dir` of a telemetry.wandb run is always a path whose files reach the W&B run, as real W&B's.

The daemon's W&B run (and its directory) exists only once W&B has started in the daemon, which
takes tens of seconds on a loaded host. `run.dir` read before that was None for the rest of the
run (the first answer, "no run yet", was kept), and a script's
`open(os.path.join(wandb.run.dir, "model.txt"), "w")` raised TypeError; a start W&B refused
kept `run.name` waiting its full RUN_INFO_WAIT_S. Real daemons, W&B offline, the daemon's
`wandb.init` held or refused as in tests/test_wandb_slow_start.py."""
from __future__ import annotations

import glob
import os
import time
from pathlib import Path

import pytest

import telemetry.wandb as tw
from telemetry.integrations import wandb_run
from telemetry.shared.wandb_ids import fallback_files_dir
from test_wandb_slow_start import held_daemon, release, wait_for
from wandb_offline import read_records, wait_finished

pytest.importorskip("wandb")


@pytest.fixture(autouse=True)
def _no_run_left():
    yield
    tw.finish()


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """The script's working directory (W&B's root without a `dir`), and no $WANDB_DIR."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("WANDB_DIR", raising=False)
    return work


def to(monkeypatch, d) -> None:
    monkeypatch.setenv("TELEMETRY_ENDPOINT", d.ingest)
    monkeypatch.setenv("TELEMETRY_CONTROL", d.control)


def test_run_dir_during_a_slow_start_is_a_path_whose_files_reach_the_run(tmp_path, make_daemon, monkeypatch,
                                                                        workdir):
    d, hold = held_daemon(make_daemon, tmp_path)
    to(monkeypatch, d)
    # The script's wait for the daemon's run, shorter than W&B's held start (which lasts until `go`).
    monkeypatch.setattr(wandb_run, "RUN_INFO_WAIT_S", 0.5)
    monkeypatch.setattr(wandb_run, "RUN_INFO_RETRY_S", 0.0, raising=False)
    run = tw.init(project="p")
    wait_for(hold / "inits")                     # the daemon's sink is inside wandb.init
    early = run.dir
    assert early == fallback_files_dir(str(workdir), run.id) and os.path.isdir(early)
    with open(os.path.join(early, "model.txt"), "w") as f:       # the classic W&B script
        f.write("weights")
    os.makedirs(os.path.join(early, "ckpt"))
    Path(early, "ckpt", "step1.txt").write_text("step 1")
    (hold / "go").touch()
    deadline = time.monotonic() + 120
    while run.dir == early:                      # asked again (not kept): the daemon's, once it has it
        assert time.monotonic() < deadline, "run.dir never became the daemon's W&B run's"
        time.sleep(0.1)
    later = run.dir
    assert later.startswith(str(d.log_dir / "wandb" / "offline-run-")) and later.endswith(os.sep + "files")
    tw.log({"loss": 1.0})
    tw.finish()
    assert d.stop(timeout_s=120) == 0, d.output()[-3000:]
    (run_file,) = [wait_finished(f) for f in glob.glob(str(d.log_dir / "wandb" / "offline-run-*" / "run-*.wandb"))]
    # The files are the run's: in its files directory and in its records, as W&B saves them.
    assert Path(later, "model.txt").read_text() == "weights"
    assert Path(later, "ckpt", "step1.txt").read_text() == "step 1"
    saved = {f.path for r in read_records(run_file) if r.WhichOneof("record_type") == "files" for f in r.files.files}
    assert {"model.txt", os.path.join("ckpt", "step1.txt")} <= saved, saved
    assert "files_unsaved" not in d.output()


def test_a_refused_wandb_start_answers_at_once_and_run_dir_is_a_path(tmp_path, make_daemon, monkeypatch, workdir,
                                                                    capfd):
    d, hold = held_daemon(make_daemon, tmp_path, fail=True)
    to(monkeypatch, d)
    t0 = time.monotonic()
    run = tw.init(project="p")
    assert run.name is None                      # W&B offline's, once the daemon says it has no run
    # The sink's "no run" (open_error) ends the wait: not RUN_INFO_WAIT_S (a bound that only a hang passes).
    assert time.monotonic() - t0 < 10
    assert (hold / "inits").read_text().splitlines() == ["inits"]
    path = run.dir
    assert path == fallback_files_dir(str(workdir), run.id) and os.path.isdir(path)
    Path(path, "model.txt").write_text("weights")
    err = capfd.readouterr().err
    assert "W&B could not make the run in the telemetry daemon" in err and "not uploaded" in err, err
    tw.finish()
    assert d.stop(timeout_s=120) == 0, d.output()[-3000:]


def test_wandb_off_in_the_daemon_gives_a_path_and_says_its_files_stay(make_daemon, monkeypatch, workdir, capfd):
    d = make_daemon(wandb="disabled")
    to(monkeypatch, d)
    t0 = time.monotonic()
    run = tw.init(project="p")
    path = run.dir
    assert time.monotonic() - t0 < 10
    assert path == fallback_files_dir(str(workdir), run.id) and os.path.isdir(path)
    Path(path, "model.txt").write_text("weights")
    assert run.dir == path
    err = capfd.readouterr().err
    assert err.count("W&B is off in the telemetry daemon: its files are not uploaded") == 1, err
    assert run.dir == path and "not uploaded" not in capfd.readouterr().err      # said once
    tw.finish()
    assert d.stop(timeout_s=60) == 0


def test_run_dir_where_no_directory_can_be_made_says_each_why(make_daemon, monkeypatch, tmp_path, workdir):
    """The first place failing, the warning names the place used instead; both failing, the error
    names both and why (the warning said "using the system's temporary directory" when that was
    the place that had failed, then raised with no reason)."""
    import tempfile

    d = make_daemon(wandb="disabled")
    to(monkeypatch, d)
    (workdir / "wandb").write_text("")           # a file where wandb/ would be made
    run = tw.init(project="p")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp))
    with pytest.warns(RuntimeWarning, match=f"using {tmp}/wandb/telemetry-{run.id}/files"):
        assert run.dir == fallback_files_dir(str(tmp), run.id) and os.path.isdir(run.dir)
    tw.finish()

    run = tw.init(project="p")
    (tmp_path / "tmp-file").write_text("")
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path / "tmp-file"))
    with pytest.warns(RuntimeWarning), pytest.raises(OSError) as raised:
        run.dir
    said = str(raised.value)
    assert str(workdir / "wandb" / f"telemetry-{run.id}") in said and str(tmp_path / "tmp-file" / "wandb") in said, said
    assert said.count("Not a directory") == 2, said
    tw.finish()
    assert d.stop(timeout_s=60) == 0


def test_a_disabled_run_dir_is_wandbs_path(monkeypatch, tmp_path, workdir):
    # W&B 0.31's disabled run: `<tmp>/wandb/run-<time>-<id>/files`, not made (and `dir=` not used).
    import wandb

    real = wandb.init(mode="disabled", id="realdis1", dir=str(tmp_path / "given"))
    try:
        real_dir = real.dir
    finally:
        real.finish()
    ours = tw.init(mode="disabled", id="ourdis01", dir=str(tmp_path / "given"))
    assert isinstance(ours.dir, str)
    for got, run_id in ((real_dir, "realdis1"), (ours.dir, "ourdis01")):
        parent = Path(got).parent
        assert Path(got).name == "files" and parent.parent == Path(real_dir).parent.parent
        assert parent.name.startswith("run-") and parent.name.endswith("-" + run_id)
    assert not os.path.exists(ours.dir)


def test_telemetry_run_as_wandb_script_writes_to_run_dir_during_a_slow_start(tmp_path):
    # The user's path, as the bug was found: `telemetry run --as-wandb` of a classic W&B script
    # that writes into wandb.run.dir while the daemon's W&B start is held.
    import subprocess
    import sys

    from test_wandb_slow_start import HOLD_WANDB_INIT

    root = Path(__file__).resolve().parent.parent
    hold = tmp_path / "hold"
    hold.mkdir()
    (hold / "sitecustomize.py").write_text(HOLD_WANDB_INIT)
    (tmp_path / "s.py").write_text(
        "import os, time, wandb\n"
        "import telemetry.integrations.wandb_run as wr\n"
        "wr.RUN_INFO_WAIT_S = 0.5      # the script's wait, shorter than the held start\n"
        "wandb.init(project='p')\n"
        "d = wandb.run.dir\n"
        "with open(os.path.join(d, 'model.txt'), 'w') as f:\n"
        "    f.write('weights')\n"
        "open('early.txt', 'w').write(d)\n"
        "deadline = time.monotonic() + 120\n"
        "while wandb.run.dir == d and time.monotonic() < deadline:\n"
        "    time.sleep(0.2)\n"
        "open('later.txt', 'w').write(wandb.run.dir)\n"
        "wandb.log({'loss': 1.0})\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRY_", "WANDB_"))}
    env.update({"PYTHONPATH": os.pathsep.join((str(hold), str(root))), "HOLD_DIR": str(hold),
                "TELEMETRY_RUNTIME_DIR": str(tmp_path / "rt"), "WANDB_SILENT": "true"})
    p = subprocess.Popen([sys.executable, "-m", "telemetry", "run", "--as-wandb", "--wandb", "offline",
                          "--run-dir", "r", "--", "s.py"], cwd=tmp_path, env=env,
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "early.txt").exists() and p.poll() is None:   # the script wrote to run.dir, or died
            assert time.monotonic() < deadline, "the script never wrote to run.dir"
            time.sleep(0.05)
        (hold / "go").touch()
        out, _ = p.communicate(timeout=240)
    finally:
        release(hold, p)
    assert p.returncode == 0 and (tmp_path / "early.txt").exists(), out[-3000:]
    early, later = (tmp_path / "early.txt").read_text(), (tmp_path / "later.txt").read_text()
    assert Path(early).parent.parent == tmp_path / "wandb" and Path(early).parent.name.startswith("telemetry-")
    assert later.startswith(str(tmp_path / "r" / "wandb" / "offline-run-")), later
    (run_file,) = [wait_finished(f) for f in glob.glob(str(tmp_path / "r" / "wandb" / "offline-run-*" / "run-*.wandb"))]
    assert Path(later, "model.txt").read_text() == "weights"
    assert "model.txt" in {f.path for r in read_records(run_file) if r.WhichOneof("record_type") == "files"
                           for f in r.files.files}


def test_a_strangers_run_dir_made_first_is_neither_written_nor_saved(tmp_path, make_daemon, monkeypatch):
    # run.dir under a shared directory (the script's `dir` in a sticky /tmp-like place): another
    # user who made wandb/telemetry-<id>/files there first would read what the script writes, and
    # have their own files saved into the user's W&B run.
    import shutil
    import subprocess
    import tempfile

    from other_user import OTHER_UID, SYSTEM_PYTHON, can_act_as_other_user

    if not can_act_as_other_user():
        pytest.skip("needs root to act as another user")
    shared = Path(tempfile.mkdtemp(prefix="tsh-", dir="/tmp"))
    shared.chmod(0o1777)
    run_id = "stranger" + os.urandom(3).hex()
    theirs = Path(fallback_files_dir(str(shared), run_id))
    ours = Path(fallback_files_dir(tempfile.gettempdir(), run_id))
    try:
        subprocess.run([SYSTEM_PYTHON, "-I", "-c", f"import os; os.makedirs({str(theirs)!r}, 0o777); "
                        f"open(os.path.join({str(theirs)!r}, 'evil.txt'), 'w').write('planted')"],
                       user=OTHER_UID, group=OTHER_UID, cwd="/", check=True, timeout=60)
        d, hold = held_daemon(make_daemon, tmp_path)
        to(monkeypatch, d)
        monkeypatch.setattr(wandb_run, "RUN_INFO_WAIT_S", 0.5)
        run = tw.init(project="p", id=run_id, dir=str(shared))
        wait_for(hold / "inits")
        path = run.dir
        assert path == str(ours), path               # not the stranger's
        Path(path, "model.txt").write_text("weights")
        (hold / "go").touch()
        tw.finish()
        assert d.stop(timeout_s=120) == 0, d.output()[-3000:]
        # W&B's files under the script's `dir`, as W&B puts them.
        (run_file,) = [wait_finished(f) for f in glob.glob(str(shared / "wandb" / "offline-run-*" / "run-*.wandb"))]
        saved = {f.path for r in read_records(run_file) if r.WhichOneof("record_type") == "files"
                 for f in r.files.files}
        assert "model.txt" in saved and "evil.txt" not in saved, saved
        assert f"{theirs} is not saved to the W&B run" in d.output()
        assert sorted(os.listdir(theirs)) == ["evil.txt"]       # theirs, untouched
    finally:
        (hold / "go").touch() if "hold" in locals() else None
        shutil.rmtree(shared, ignore_errors=True)
        shutil.rmtree(ours.parent, ignore_errors=True)


def test_run_dir_files_on_another_host_are_said_not_saved(tmp_path, caplog):
    """A script on another host than the daemon's (a node's rank, the head's W&B run): the files it
    wrote to its own run.dir cannot be seen here; said, by the host name its hello gave, never
    silently missing. A script on this host whose run.dir was never made: nothing to say."""
    import logging
    import socket

    from telemetry.daemon.sinks.wandb_sink import WandbSink

    sink = WandbSink("offline", tmp_path, run_name="elsewhere")
    sink.run_id = "abc123"
    gone = str(tmp_path / "not-here")
    with caplog.at_level(logging.WARNING, logger="telemetry.daemon.sinks.wandb"):
        sink._init = {"dir": gone, "meta": {"host": "some-other-node", "cwd": gone}}
        sink._save_fallback_files()
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 1 and "on host some-other-node" in said[0] and "cannot be seen" in said[0], said
        assert fallback_files_dir(gone, "abc123") in said[0], said
        caplog.clear()
        sink._init = {"dir": gone, "meta": {"host": socket.gethostname(), "cwd": gone}}
        sink._save_fallback_files()
        assert not caplog.records, [r.getMessage() for r in caplog.records]
