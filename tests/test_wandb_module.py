"""telemetry.wandb, one process: the module's state, W&B's step and commit rules (checked against
the real wandb in offline mode), what is refused or unsupported and how it says so."""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import telemetry.wandb as tw
from daemon_util import script_values
from wandb_offline import config, history_key_paths, history_rows, user_history, user_summary, wait_finished

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _no_run_left():
    yield
    tw.finish()


@pytest.fixture
def w_and_b_speaking(monkeypatch):
    """Real W&B with $WANDB_SILENT unset, as read now: W&B reads its environment once per
    process (wandb.setup's singleton), so a test before in this worker that ran it silent would
    leave it silent; it is torn down so that the next init reads the environment again."""
    wandb = pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_SILENT", raising=False)
    wandb.teardown()
    yield wandb
    wandb.teardown()


def calls(wandb) -> None:
    """One sequence of log calls that exercises every step and commit rule."""
    wandb.log({"a": 1})
    wandb.log({"b": 2}, commit=False)
    wandb.log({"c": 3})
    wandb.log({"d": 4}, step=5)
    wandb.log({"e": 5})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wandb.log({"f": 6}, step=3)            # below the current step: dropped
    wandb.log({"g": 7}, step=10, commit=True)
    wandb.log({"h": {"x": 1, "y": {"z": 2}}, "note": "text, as W&B keeps it"})
    wandb.log({"i": 1}, step=12)
    wandb.log({"j": 1}, step=12)
    wandb.log({"k": 1}, step=13, commit=False)
    wandb.log({"l": 1}, commit=True)
    wandb.log({"m": 1}, commit=False)          # pending at finish: W&B writes it then


def test_step_and_commit_rules_match_real_wandb(tmp_path, make_daemon, monkeypatch):
    wandb = pytest.importorskip("wandb")
    run = wandb.init(mode="offline", project="p", dir=str(tmp_path),
                     settings=wandb.Settings(silent=True, console="off", x_disable_stats=True))
    calls(wandb)
    real_step = run.step
    run.finish()
    (real_file,) = [wait_finished(f) for f in glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))]
    expected = {r["_step"]: {k: v for k, v in r.items() if not k.startswith("_")} for r in history_rows(real_file)}

    d = make_daemon(wandb="offline")
    monkeypatch.setenv("TELEMETRY_ENDPOINT", d.ingest)
    ours = tw.init(project="p", config={"x": 1})
    calls(tw)
    assert ours.step == real_step
    tw.finish()
    assert d.stop(timeout_s=60) == 0
    (our_file,) = [wait_finished(f) for f in glob.glob(str(d.log_dir / "wandb" / "offline-run-*" / "run-*.wandb"))]
    keys = set().union(*expected.values())
    # The same rows at the same _step, and nothing else in the history; the same summary.
    assert user_history(our_file) == expected
    assert user_summary(our_file) == user_summary(real_file)
    # Nested dicts are stored nested, as W&B stores them (its UI shows "h.y.z"), not as "h/y/z".
    user_paths = {p for p in history_key_paths(real_file) if "/".join(p) in keys}
    assert ("h", "y", "z") in user_paths
    assert {p for p in history_key_paths(our_file) if "/".join(p) in keys} == user_paths


def test_run_config_summary_follow_init_and_finish(daemon, monkeypatch):
    monkeypatch.setenv("TELEMETRY_ENDPOINT", daemon.ingest)
    assert tw.run is None
    with pytest.raises(tw.Error, match=r"wandb.init\(\) before wandb.log"):
        tw.log({"a": 1})
    with pytest.raises(tw.Error, match=r"before wandb.config.update"):
        tw.config.update({"a": 1})
    with pytest.raises(tw.Error, match=r"before wandb.summary\['x'\]"):
        tw.summary["x"] = 1
    first = tw.init(project="p", config={"lr": 0.1})
    assert tw.run is first and tw.config is first.config and tw.summary is first.summary
    assert tw.config.lr == 0.1 and tw.config["lr"] == 0.1
    with pytest.raises(tw.Error, match="allow_val_change"):
        tw.config.update({"lr": 0.2})
    tw.config.update({"lr": 0.2}, allow_val_change=True)
    assert tw.init(project="p") is first     # as W&B: a run is active, init returns it
    second = tw.init(project="p", reinit="finish_previous")
    assert tw.run is second and first._finished
    assert tw.init(reinit="return_previous") is second
    beside = tw.init(project="p", reinit="create_new")      # another run, not wandb.run
    assert tw.run is second and not beside._finished and beside.id != second.id
    beside.finish()
    second.finish()
    assert tw.run is None
    with tw.init(project="p") as third:      # the run as a context manager
        third.log({"x": 1.0})
    assert tw.run is None


def media_calls(wandb, wav: Path) -> None:
    import numpy as np
    import torch

    rng = np.random.default_rng(0)
    wandb.log({"loss": 1.0})
    # Values W&B keeps in its history as they are (None, lists, numpy arrays by its size rule), and
    # Html and Audio: each as W&B stores it.
    wandb.log({"none": None, "nums": [1, 2.5, 3], "words": ("a", "b"), "long": [float(i) for i in range(300)],
               "arr": np.arange(5, dtype=np.float32), "one": np.array([[7]]), "big": rng.normal(size=100),
               "page": wandb.Html("<p>hello</p>"), "clip": wandb.Audio(str(wav), caption="beep")})
    # wandb.plot's charts: W&B logs each chart's table as "<key>_table" and its spec in the config.
    squares = wandb.Table(columns=["x", "y"], data=[[i, i * i] for i in range(5)])
    wandb.log({"line": wandb.plot.line(squares, "x", "y", title="squares"),
               "cm": wandb.plot.confusion_matrix(y_true=[0, 1, 1, 0, 2], preds=[0, 1, 0, 0, 2],
                                                 class_names=["a", "b", "c"])})
    wandb.log({"samples": wandb.Image(rng.integers(0, 255, (8, 6, 3), dtype=np.uint8), caption="hwc")},
              commit=False)
    preds = wandb.Table(columns=["x", "y"], data=[[1, "a"], [2, "b"], [3, "c"]])
    wandb.log({"weights": wandb.Histogram(rng.normal(size=500), num_bins=16), "preds": preds})
    wandb.log({"chw": wandb.Image(torch.rand(3, 5, 7)), "hist2": wandb.Histogram(np_histogram=np.histogram(
        rng.normal(size=100), bins=8))}, step=4)
    wandb.log({"loss": 2.0})
    # The same table again after a row was added: W&B's default log_mode ("IMMUTABLE") logs it as
    # it was first logged.
    preds.add_data(4, "d")
    wandb.log({"preds": preds})


MEDIA_KEYS = ("samples", "weights", "preds", "chw", "hist2", "big", "page", "clip", "line_table", "cm_table")
VALUE_KEYS = ("none", "nums", "words", "long", "arr", "one")


def a_wav(path: Path) -> Path:
    import struct
    import wave

    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"".join(struct.pack("<h", (i * 37) % 2000) for i in range(800)))
    return path


def media_values(path: str, step_key: str) -> dict:
    """(step, key) -> what each media value in the run's history says of itself (W&B stores its
    fields as nested keys, "samples/_type"; its file's hash differs between runs, not the step
    in its name, `media/table/preds_<step>_<hash>.table.json`: kept as "file_step")."""
    keep = ("_type", "width", "height", "format", "caption", "ncols", "nrows", "values", "bins", "sha256",
            "size", "sample_rate")
    out: dict = {}
    for r in history_rows(path):
        for key in MEDIA_KEYS:
            fields = {k[len(key) + 1:]: v for k, v in r.items() if k.startswith(key + "/")}
            if fields:
                out[(r[step_key], key)] = {k: fields[k] for k in keep if k in fields and
                                           (k != "sha256" or key in ("page", "clip", "line_table", "cm_table",
                                                                     "preds"))}
                if "path" in fields:
                    out[(r[step_key], key)]["file_step"] = fields["path"].rsplit("/", 1)[-1].split("_")[-2]
        for key in VALUE_KEYS:
            if key in r:
                out[(r[step_key], key)] = r[key]
    return out


def test_media_pass_through_as_real_wandb_logs_them(tmp_path, make_daemon, monkeypatch):
    wandb = pytest.importorskip("wandb")
    pytest.importorskip("numpy")
    run = wandb.init(mode="offline", project="p", dir=str(tmp_path),
                     settings=wandb.Settings(silent=True, console="off", x_disable_stats=True))
    wav = a_wav(tmp_path / "clip.wav")
    media_calls(wandb, wav)
    run.finish()
    (real_file,) = [wait_finished(f) for f in glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))]
    expected = media_values(real_file, "_step")
    assert len(expected) == len(MEDIA_KEYS + VALUE_KEYS) + 1            # preds twice

    monkeypatch.setenv("TELEMETRY_MEDIA_DIR", str(tmp_path / "media"))
    # A drain deadline well past what W&B offline takes to open, log and finish on a loaded box
    # (the default 12 s abandoned the W&B sink mid-media beside a busy suite): this test is about
    # what W&B gets, the deadline's own tests are test_fault_drain.py's.
    d = make_daemon(wandb="offline", env={"TELEMETRY_MEDIA_DIR": str(tmp_path / "media")},
                    config={"drain_timeout_s": 120})
    monkeypatch.setenv("TELEMETRY_ENDPOINT", d.ingest)
    tw.init(project="p")
    with warnings.catch_warnings():
        warnings.simplefilter("error")                # nothing refused
        media_calls(tw, wav)
    tw.finish()
    final = d.drain(timeout_s=180)
    assert final["drained"], final["unfinished_sinks"]
    # Files: the five media above, the html, the audio, the long list, the big array, two charts,
    # the table logged again.
    assert (final["sinks"]["wandb"]["media_logged"], final["sinks"]["wandb"]["media_failed"]) == (12, 0)
    (our_file,) = [wait_finished(f) for f in glob.glob(str(d.log_dir / "wandb" / "offline-run-*" / "run-*.wandb"))]
    got = media_values(our_file, "_step")
    # The table logged again: its content is W&B's (sha256); W&B's record of it names the file it
    # wrote at the first log, and counts the rows the object has now (nrows: 4, for a file of 3),
    # ours a file of this step with the rows it holds (docs/dropin-wandb.md, differences).
    (again,) = [k for k in expected if k[1] == "preds" and k[0] == max(s for s, key in expected if key == "preds")]
    for k in ("file_step", "nrows"):
        expected[again].pop(k), got[again].pop(k)
    assert got == expected
    charts = {k: v for k, v in config(real_file).items() if k.startswith("_wandb/visualize/")}
    assert set(charts) == {"_wandb/visualize/line", "_wandb/visualize/cm"}
    assert {k: v for k, v in config(our_file).items() if k.startswith("_wandb/visualize/")} == charts
    assert list((tmp_path / "media").iterdir()) == []            # each file deleted once logged


def test_media_that_cannot_be_written_is_warned_and_counted(tmp_path, make_daemon, monkeypatch):
    """A wandb.Image of something the writer cannot turn into an image: a warning in the rank,
    a count in the daemon's sink, and the sink does not wait for a file that will never come."""
    monkeypatch.setenv("TELEMETRY_MEDIA_DIR", str(tmp_path / "media"))
    # A deadline no load reaches: under a load of 15 the W&B sink was still starting W&B at the
    # default 12 s, was abandoned, and never saw the event (media_failed 0). The count is the
    # point here, not the deadline (test_fault_drain.py judges those).
    d = make_daemon(wandb="offline", config={"drain_timeout_s": 300},
                    env={"TELEMETRY_MEDIA_DIR": str(tmp_path / "media")})
    monkeypatch.setenv("TELEMETRY_ENDPOINT", d.ingest)
    run = tw.init(project="p")
    with pytest.warns(RuntimeWarning, match="wandb.Image could not be written"):
        run.log({"img": tw.Image(object()), "loss": 1.0})
        run.finish()
    final = d.drain(timeout_s=320)
    assert final["drained"], final["unfinished_sinks"]
    assert (final["sinks"]["wandb"]["media_logged"], final["sinks"]["wandb"]["media_failed"]) == (0, 1)
    # It took the rank's word (its .failed marker), not the end of its 10 s wait for a file.
    d._pump.join(30)
    assert "the rank could not write it" in d.output() and "did not appear within" not in d.output(), \
        d.output()[-3000:]
    assert list((tmp_path / "media").iterdir()) == []


def test_media_refused_by_name_once_counted_and_reported(daemon, monkeypatch):
    monkeypatch.setenv("TELEMETRY_ENDPOINT", daemon.ingest)
    run = tw.init(project="p")
    with pytest.warns(RuntimeWarning, match=r"wandb\.Video at key 'clip'"):
        run.log({"clip": tw.Video("clip.mp4"), "loss": 1.0})
    with warnings.catch_warnings():
        warnings.simplefilter("error")           # the second one is counted, not warned again
        run.log({"clip": tw.Video("clip.mp4"), "loss": 2.0})
    with pytest.warns(RuntimeWarning, match="object at key 'note'"):
        run.log({"note": object()})
    assert run.num_refused == {"wandb.Video": 2, "object": 1}
    run.finish()
    # The first of each why as it came, and the totals at the run's end (the summary says them:
    # "not logged to W&B  2 wandb.Video"; the second Video was in no counter outside the script).
    events = daemon.wait_for(lambda rs: sum(r.get("name") == "wandb/refused" for r in rs) >= 3, kind="event")
    refused = [r["data"] for r in events if r.get("name") == "wandb/refused"]
    assert {e["type"] for e in refused} == {"wandb.Video", "object"}
    assert {(e["type"], e["count"]) for e in refused} == {("wandb.Video", 1), ("object", 1), ("wandb.Video", 2)}
    steps = daemon.wait_for(lambda rs: len(rs) >= 2, kind="metrics")
    assert [script_values(r["values"]) for r in steps[:2]] == [{"loss": 1.0}, {"loss": 2.0}]
    from telemetry.consumers.summary import summarize

    assert summarize(daemon.log_dir)["wandb_refused"] == {"wandb.Video": 2, "object": 1}


def test_raw_audio_needs_soundfile_as_in_wandb():
    """W&B writes raw samples with soundfile: without it (or without sample_rate), its errors at
    construction, whichever module is `wandb`."""
    import importlib.util

    wandb = pytest.importorskip("wandb")
    for w in (wandb, tw):
        with pytest.raises(ValueError, match="sample_rate"):
            w.Audio([0.0, 0.1])
        if importlib.util.find_spec("soundfile") is None:
            with pytest.raises(Exception, match="soundfile") as got:
                w.Audio([0.0, 0.1], sample_rate=8000)
            assert got.type.__name__ == "Error"


def test_unsupported_api_raises_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TELEMETRY_MEDIA_DIR", str(tmp_path / "media"))
    with pytest.raises(NotImplementedError, match="wandb.restore"):
        tw.restore("model.h5")
    with pytest.raises(NotImplementedError, match=r"wandb.plot.plot_table"):
        tw.plot.plot_table("wandb/line/v0", None, {})
    assert hasattr(tw, "Api") and hasattr(tw, "config")     # harmless to probe, as with wandb
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        tw.nonsense
    with pytest.raises(NotImplementedError, match=r"sync_tensorboard"):
        tw.init(sync_tensorboard=True)
    with pytest.raises(NotImplementedError, match=r"wandb.Table\(log_mode='INCREMENTAL'\)"):
        tw.Table(columns=["a"], log_mode="INCREMENTAL")
    mutable = tw.Table(columns=["a"], data=[[1]], log_mode="MUTABLE")     # logged as it is at each log
    mutable.snapshot()
    mutable.add_data(2)
    assert mutable.snapshot().data == [[1], [2]]
    with pytest.raises(ValueError, match="mode"):
        tw.init(mode="sometimes")
    run = tw.init(mode="disabled")
    with pytest.raises(NotImplementedError, match="run.use_model"):
        run.use_model("x")
    with pytest.raises(TypeError, match="torch.nn.Module"):       # as W&B's watch
        tw.watch(object())
    run.log({"a": 1, "img": tw.Image(tmp_path)})   # disabled: accepted, sent nowhere, no file left
    assert run.step == 0 and not (tmp_path / "media").exists()     # W&B's disabled run's step stays 0


def test_a_run_has_the_attributes_w_and_bs_run_has(tmp_path, monkeypatch):
    """A script probing a run (`hasattr(run, "get_url")`, `run.files_dir`) finds what W&B's run
    has: names W&B 0.31's run lacks raise AttributeError, as W&B's (they were stand-ins whose use
    raised TypeError: `os.path.join(run.files_dir, ...)`)."""
    import wandb

    monkeypatch.chdir(tmp_path)
    real = wandb.init(mode="disabled")
    try:
        ours = tw.init(mode="disabled")
        older = ["log_dir", "files_dir", "get_url", "get_project_url", "get_sweep_url", "project_name", "plot_table"]
        for name in older + ["dir", "url", "project_url", "path", "to_html", "display", "restore", "link_artifact"]:
            assert hasattr(ours, name) == hasattr(real, name), name
        with pytest.raises(AttributeError, match="files_dir"):
            ours.files_dir
    finally:
        real.finish()


@pytest.mark.parametrize("run_id", ["a:b", "", " ab", "../x", "it's", "a b", "..", "ok-1"])
def test_a_run_id_is_refused_where_w_and_b_refuses_it(run_id, monkeypatch):
    """An id W&B refuses (its settings' rule) raises W&B's UsageError at init, with W&B's words,
    by `id=` or $WANDB_RUN_ID (before: accepted, and the daemon's W&B run was never made: the
    rows reached no W&B run, said only in the daemon's log)."""
    import wandb

    try:
        wandb.Settings(run_id=run_id)
        refused = None
    except wandb.errors.UsageError as exc:
        refused = str(exc)
    monkeypatch.setenv("TELEMETRY_AUTOSTART", "0")
    for how in ("arg", "env"):
        kwargs = {"id": run_id} if how == "arg" else {}
        if how == "env":
            monkeypatch.setenv("WANDB_RUN_ID", run_id)
        if refused is None:
            run = tw.init(mode="disabled", **kwargs)
            assert run.id == run_id
            run.finish()
        else:
            with pytest.raises(tw.UsageError) as got:
                tw.init(mode="disabled", **kwargs)
            assert str(got.value) == refused and isinstance(got.value, tw.Error)


@pytest.mark.filterwarnings("ignore:telemetry. no daemon serves:RuntimeWarning")
def test_a_second_open_run_of_one_id_is_refused_as_w_and_b_refuses_it(tmp_path, monkeypatch):
    """`wandb.init(id=X, reinit="create_new")` while a run of id X is open in the process: W&B's
    service refuses it (ServerResponseError, "run ID X is in use"); ours made a second run of
    that id. Once the first is finished, the id can be used again."""
    import wandb

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    first = wandb.init(mode="offline", project="p", id="dup-a", reinit="create_new")
    try:
        with pytest.raises(Exception) as real:
            wandb.init(mode="offline", project="p", id="dup-a", reinit="create_new")
    finally:
        first.finish()
    monkeypatch.setenv("TELEMETRY_AUTOSTART", "0")
    monkeypatch.setenv("TELEMETRY_DIR", str(tmp_path / "runs"))
    ours = tw.init(mode="offline", project="p", id="dup-a", reinit="create_new")
    try:
        with pytest.raises(Exception) as got:
            tw.init(mode="offline", project="p", id="dup-a", reinit="create_new")
        assert (type(got.value).__name__, str(got.value)) == (type(real.value).__name__, str(real.value))
        assert not isinstance(got.value, tw.Error)
    finally:
        ours.finish()
    again = tw.init(mode="offline", project="p", id="dup-a", reinit="create_new")
    again.finish()


def test_the_launchs_claim_takes_its_ranks_and_their_elastic_restarts(tmp_path):
    """Which first runs of processes `telemetry run`'s daemon serves (telemetry.wandb._launch_takes),
    each process its own: the claimant; another rank; a rank restarted by torchrun's elastic agent
    (a later $TORCHELASTIC_RESTART_COUNT: it was turned away, its rows in a run of its own); not
    the claimant's rank again in the same attempt (a retry), nor another id."""
    rt = tmp_path / "rt"
    rt.mkdir(mode=0o700)
    code = "import sys, telemetry.wandb as w; print(w._launch_takes(sys.argv[1], int(sys.argv[2])))"

    def takes(run_id: str, rank: int, attempt: int) -> bool:
        env = {**os.environ, "TELEMETRY_RUNTIME_DIR": str(rt), "TELEMETRY_RUN_ID": "launch1",
               "TORCHELASTIC_RESTART_COUNT": str(attempt)}
        out = subprocess.run([sys.executable, "-c", code, run_id, str(rank)], cwd=ROOT, env=env,
                             capture_output=True, text=True, check=True).stdout.strip()
        return out == "True"

    assert [takes("launch1", 0, 0), takes("launch1", 1, 0)] == [True, True]
    assert [takes("launch1", 0, 1), takes("launch1", 1, 1)] == [True, True]
    assert takes("launch1", 0, 0) is False and takes("other", 1, 1) is False


def test_import_is_cheap():
    code = ("import sys, time; t = time.perf_counter(); import telemetry.wandb; "
            "print(time.perf_counter() - t, 'torch' in sys.modules, 'wandb' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    _, torch_loaded, wandb_loaded = out.split()
    assert (torch_loaded, wandb_loaded) == ("False", "False")


HOST_READS = ("item", "__bool__", "__float__", "__int__", "cpu", "tolist", "numpy")


@pytest.fixture
def host_read_guard(monkeypatch):
    """Any read of a tensor's value on the main thread (on a GPU: a host-device sync) is recorded
    and raises; other threads (the client's sender) may read."""
    import threading

    torch = pytest.importorskip("torch")
    reads: list[str] = []

    def guard(name):
        orig = getattr(torch.Tensor, name)

        def wrapped(self, *a, **k):
            if threading.current_thread() is threading.main_thread():
                reads.append(name)
                raise RuntimeError(f"host read Tensor.{name} on the training thread")
            return orig(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, wrapped)

    for n in HOST_READS:
        guard(n)
    return reads


def test_log_reads_no_tensor_on_the_calling_thread(daemon, monkeypatch, host_read_guard):
    import torch

    monkeypatch.setenv("TELEMETRY_ENDPOINT", daemon.ingest)
    loss, grad_norm = torch.tensor(2.5), torch.tensor(0.75)
    tw.init(project="p")
    tw.log({"train/loss": loss, "nested": {"grad_norm": grad_norm}}, commit=False)
    tw.log({"lr": 0.1})
    tw.log({"train/loss": loss * 2}, step=5)
    tw.finish()
    assert host_read_guard == []
    steps = daemon.wait_for(lambda rs: len(rs) >= 2, kind="metrics")
    assert [(r["step"], script_values(r["values"])) for r in steps] == [
        (0, {"train/loss": 2.5, "nested/grad_norm": 0.75, "lr": 0.1}), (5, {"train/loss": 5.0})]


def test_the_guard_catches_real_wandb_reading_tensors(tmp_path, host_read_guard):
    """The same guard around the real wandb.log: it reads every tensor on the caller's thread."""
    import torch

    wandb = pytest.importorskip("wandb")
    run = wandb.init(mode="offline", project="p", dir=str(tmp_path),
                     settings=wandb.Settings(silent=True, console="off", x_disable_stats=True))
    try:
        with pytest.raises(RuntimeError, match="host read"):
            run.log({"train/loss": torch.tensor(2.5)})
    finally:
        host_read_guard.clear()
        run.finish()


def test_console_capture_buffers_writes_and_sends_them_from_the_training_thread(monkeypatch, capsys):
    """W&B's console capture without its cost: a write appends; one event per run of writes to
    a stream goes out at a flush, on the thread that made the run (never another thread's)."""
    import io
    import threading

    from telemetry.integrations.wandb_run import ConsoleCapture

    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.setattr("sys.stderr", err)
    sent = []
    cap = ConsoleCapture(lambda stream, text: sent.append((stream, text, threading.get_ident())))
    print("step 1")
    print("step 2")
    print("oops", file=sys.stderr)
    t = threading.Thread(target=lambda: print("from a loader thread"))
    t.start()
    t.join()
    assert sent == [] and out.getvalue() == "step 1\nstep 2\nfrom a loader thread\n"     # written, not sent yet
    cap.flush_due()
    assert sent == []                                   # within FLUSH_S of the start: not due
    cap._last_flush -= ConsoleCapture.FLUSH_S
    cap.flush_due()
    me = threading.get_ident()
    assert sent == [("stdout", "step 1\nstep 2\n", me), ("stderr", "oops\n", me),
                    ("stdout", "from a loader thread\n", me)]
    print("last")
    cap.stop()                                          # what is left goes, the streams are as before
    assert sent[-1][:2] == ("stdout", "last\n") and "write" not in vars(out)
    print("after")
    assert sent[-1][:2] == ("stdout", "last\n") and out.getvalue().endswith("after\n")


def test_console_capture_bounds_what_it_holds_and_each_event(monkeypatch):
    """One write of 200k characters goes as events of at most MAX_EVENT_CHARS (a frame stays far
    below the daemon's 1 MiB); what other threads write while nothing flushes is held up to
    MAX_HELD, the rest counted and said."""
    import io
    import threading

    from telemetry.integrations.wandb_run import ConsoleCapture

    monkeypatch.setattr("sys.stdout", io.StringIO())
    monkeypatch.setattr("sys.stderr", io.StringIO())
    monkeypatch.setattr(ConsoleCapture, "MAX_HELD", 100_000)
    sent = []
    cap = ConsoleCapture(lambda stream, text: sent.append((stream, text)))
    print("x" * 200_000, end="")                 # over MAX_BUFFER on the sending thread: flushed at once
    assert "".join(t for _, t in sent) == "x" * 200_000
    assert max(len(t) for _, t in sent) <= ConsoleCapture.MAX_EVENT_CHARS
    sent.clear()
    t = threading.Thread(target=lambda: [print("y" * 999) for _ in range(200)])   # 200k from a thread
    t.start()
    t.join()
    assert sent == [] and cap.num_dropped_chars == 200 * 1000 - 100 * 1000
    cap.stop()
    text = "".join(t for s, t in sent if s == "stdout")
    assert len(text) == 100 * 1000 and sent[-1] == ("stderr", "[telemetry: 100000 characters of console output "
                                                               "not kept (written faster than sent)]\n")


def test_a_dir_that_cannot_be_made_is_said_once_and_left_to_the_default(tmp_path):
    """wandb.init(dir=) that cannot be created: W&B's warning, and the daemon's run directory holds
    W&B's files (W&B: the system's temporary directory); one that can is made and named to the
    daemon, as W&B's root_dir."""
    (tmp_path / "a_file").write_text("")
    with pytest.warns(RuntimeWarning, match="Unable to create root directory .*a_file/sub"):
        run = tw.init(mode="disabled", dir=str(tmp_path / "a_file" / "sub"))
    assert run._files_root is None
    run.finish()
    run = tw.init(mode="disabled", dir=str(tmp_path / "made" / "here"))
    assert run._files_root == str(tmp_path / "made" / "here") and (tmp_path / "made" / "here").is_dir()


def test_init_with_a_run_active_says_what_w_and_b_says(tmp_path, capsys, w_and_b_speaking):
    """A second wandb.init() in a script (reinit unset, or True) returns, or finishes, the run
    that is active, and says so in W&B's words."""
    wandb = w_and_b_speaking

    def said(w, **kw) -> list[str]:
        capsys.readouterr()
        first = w.init(**kw)
        assert w.init(**kw) is first
        w.init(reinit=True, **kw)
        w.finish()
        return [line for line in capsys.readouterr().err.splitlines() if "reinit is set to" in line]

    real = said(wandb, mode="offline", project="p", dir=str(tmp_path),
                settings=wandb.Settings(console="off", x_disable_stats=True))
    assert len(real) == 2
    assert said(tw, mode="disabled") == real


def test_a_step_below_the_current_one_is_said_as_w_and_b_says_it(tmp_path, capsys, monkeypatch, w_and_b_speaking):
    """W&B prints its own line for each row logged at a step below the current one (and drops
    it); not a Python warning, and nothing with $WANDB_SILENT."""
    wandb = w_and_b_speaking

    def said(w, **kw) -> list[str]:
        capsys.readouterr()
        run = w.init(**kw)
        run.log({"a": 1}, step=10)
        for step in (2, 3):
            run.log({"b": step}, step=step)
        run.finish()
        return [line for line in capsys.readouterr().err.splitlines() if "Tried to log" in line]

    real = said(wandb, mode="offline", project="p", dir=str(tmp_path),
                settings=wandb.Settings(console="off", x_disable_stats=True))
    assert len(real) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert said(tw, mode="disabled") == real
    monkeypatch.setenv("WANDB_SILENT", "true")
    assert said(tw, mode="disabled") == []


def test_summary_of_a_define_metric_reads_tensors_when_read(monkeypatch):
    """run.summary of a key whose define_metric asks for min/mean: its tensors are read when the
    summary is, not at log; past the bound they are left out, counted and warned once."""
    torch = pytest.importorskip("torch")
    from telemetry.integrations import wandb_objects

    monkeypatch.setattr(wandb_objects, "MAX_HELD_TENSORS", 3)
    run = tw.init(mode="disabled")
    run.define_metric("loss", summary="min,mean")
    losses = [3.0, 1.0, 2.0]
    for x in losses:
        run.log({"loss": torch.tensor(x)})
    assert run.summary["loss"] == {"min": min(losses), "mean": sum(losses) / len(losses)}
    with pytest.warns(RuntimeWarning, match="holds at most 3 tensors"):
        for x in (5.0, 6.0, 7.0, 0.5):
            run.log({"loss": torch.tensor(x)})
    assert run.summary.num_not_aggregated == 1
    assert run.summary["loss"]["min"] == 1.0 and run.summary["loss"]["mean"] == (6.0 + 5.0 + 6.0 + 7.0) / 6


def test_a_config_of_tensors_and_numpy_and_a_tensor_step_as_w_and_b_takes_them(tmp_path, daemon, monkeypatch):
    """An outside test beside real W&B: a tensor in the config made the drop-in's hello
    unsendable (dropped, warned without a key), so the script's run never had its config, and a
    later update with one lost every later update; W&B keeps such values as numbers and lists.
    A step given as a tensor raised a private exception at the next log (W&B takes it), and a
    float step lost its row without a word (W&B raises TypeError)."""
    wandb = pytest.importorskip("wandb")
    torch = pytest.importorskip("torch")
    import numpy as np

    def script(w, **kw) -> dict:
        run = w.init(config={"lr": 0.1, "scale": torch.tensor(2.0), "arr": np.arange(3), "tup": (1, 2),
                             "flag": np.bool_(True), "nested": {"t": torch.tensor([1, 2])}}, **kw)
        run.config.update({"later": torch.tensor(3)})
        run.config.update({"after": 7})
        run.log({"a": 1.0}, step=torch.tensor(3))
        run.log({"a": 2.0}, step=np.int64(5))
        with pytest.raises(TypeError) as bad:
            run.log({"a": 3.0}, step=4.0)
        seen = {"config": {k: run.config[k] for k in ("lr", "scale", "arr", "tup", "flag", "nested", "later", "after")},
                "step": run.step, "error": str(bad.value),
                "run": (run.sweep_id, run.group, run.job_type)}    # none given: None, "", "" in W&B
        run.finish()
        return seen

    real = script(wandb, mode="offline", project="p", dir=str(tmp_path),
                  settings=wandb.Settings(console="off", x_disable_stats=True))
    monkeypatch.setenv("TELEMETRY_ENDPOINT", daemon.ingest)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                  # no dropped hello, no other warning
        ours = script(tw, project="p", mode="offline")
    assert ours == real, (ours, real)
    hellos = daemon.wait_for(lambda recs: any(r["info"].get("config", {}).get("after") == 7 for r in recs),
                             kind="hello", timeout_s=60)
    config = [r["info"]["config"] for r in hellos if r["info"].get("config", {}).get("after") == 7][-1]
    assert config["scale"] == 2.0 and config["arr"] == [0, 1, 2] and config["later"] == 3, config


@pytest.mark.filterwarnings("ignore:telemetry. no daemon serves:RuntimeWarning")
def test_summary_update_takes_what_w_and_bs_takes(tmp_path, monkeypatch):
    """`run.summary.update` takes one dict, as W&B's: keywords, or nothing, raise TypeError as
    there (ours took keywords: a script that worked here failed under real W&B)."""
    import wandb

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    calls = [((), {"m": 1}), ((), {}), (({"a": 1},), {"m": 2}), (({"a": 1},), {})]

    def said(run):
        out = []
        for args, kwargs in calls:
            try:
                run.summary.update(*args, **kwargs)
                out.append(None)
            except Exception as exc:
                out.append(type(exc).__name__)
        return out, {k: run.summary.get(k) for k in ("a", "m")}

    real_run = wandb.init(mode="offline", project="p")
    try:
        real = said(real_run)
    finally:
        real_run.finish()
    monkeypatch.setenv("TELEMETRY_AUTOSTART", "0")
    ours_run = tw.init(mode="disabled")
    try:
        assert said(ours_run) == real == (["TypeError", "TypeError", "TypeError", None], {"a": 1, "m": None}), real
    finally:
        ours_run.finish()


@pytest.mark.filterwarnings("ignore:telemetry. no daemon serves:RuntimeWarning")
def test_summary_reads_back_lists_arrays_and_tensors_as_w_and_b_does(tmp_path, monkeypatch):
    """`run.summary` read back, beside real W&B: a logged list of numpy scalars (short or long:
    the long one goes as a file) reads as a list of numbers (it was missing); an array or a
    tensor set on the summary, or nested in a dict set there, reads as a list (it read back as
    the array or tensor set)."""
    import numpy as np
    import torch
    import wandb

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")

    def script(mod, **init):
        run = mod.init(**init)
        try:
            run.log({"l": [np.float32(1.5), np.int64(2)], "long": [np.float32(i) for i in range(300)],
                     "t": (1, 2), "mixed": [1, "a", None]})
            run.summary["sa"] = np.arange(4)
            run.summary["st"] = torch.tensor([1.0, 2.0])
            run.summary["sd"] = {"x": np.float32(1.0), "y": np.arange(2)}
            run.summary.update({"su": [np.int32(3), torch.tensor(4)]})
            out = {}
            for k in ("l", "long", "t", "mixed", "sa", "st", "sd", "su"):
                v = run.summary[k]
                out[k] = {kk: v[kk] for kk in v.keys()} if hasattr(v, "keys") else v
            return out
        finally:
            run.finish()

    real = script(wandb, mode="offline", project="p")
    monkeypatch.setenv("TELEMETRY_AUTOSTART", "0")
    ours = script(tw, mode="disabled")
    assert ours == real, (ours, real)
    assert all(type(v) is list for k, v in ours.items() if k != "sd"), ours


# wandb.init arguments (and W&B environment variables) W&B's Settings refuse, by the field each
# reaches; each pair is (init's keyword arguments, environment).
INIT_REFUSED = [
    ({"project": "a/b"}, {}), ({"project": "p" * 129}, {}), ({"project": 5}, {}), ({"project": "x#y"}, {}),
    ({"tags": ["x" * 65]}, {}), ({"tags": [""]}, {}), ({"tags": ["", "y" * 70]}, {}), ({"tags": [5]}, {}),
    ({"name": 5}, {}), ({"group": 5}, {}), ({"notes": 5}, {}), ({"job_type": 5}, {}), ({"entity": 5}, {}),
    ({"mode": "foo"}, {}), ({"resume": "yes"}, {}), ({"reinit": "foo"}, {}), ({"id": "a/b"}, {}), ({"id": 5}, {}),
    ({"dir": 5}, {}), ({"settings": {"console": "foo"}}, {}), ({"project": "ok"}, {"WANDB_PROJECT": "a/b"}),
    ({}, {"WANDB_TAGS": "a,,b"}), ({}, {"WANDB_TAGS": "t" * 70}), ({}, {"WANDB_MODE": "foo"}),
    ({}, {"WANDB_RESUME": "true"}), ({}, {"WANDB_RUN_ID": "a/b"}),
]


def _refusal(make) -> tuple[str, str] | None:
    """What make() raised (its type's name, its words); None when it returned (a run: finished)."""
    try:
        made = make()
    except Exception as exc:
        return type(exc).__name__, str(exc)
    getattr(made, "finish", lambda: None)()
    return None


@pytest.mark.parametrize("kwargs, env", INIT_REFUSED)
def test_init_refuses_what_w_and_bs_init_refuses(kwargs, env, tmp_path, monkeypatch):
    """An init argument W&B refuses (a project name with "/" or past 128 characters, a tag past
    64, a mode, resume or reinit it does not know, a name that is not text, ...) raises at the
    drop-in's init what W&B's init raises: its type (UsageError, pydantic's ValidationError) and
    its words (before: init returned a run, the daemon's W&B sink failed, no W&B run existed,
    and the script and `telemetry run` exited 0)."""
    import wandb

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("TELEMETRY_AUTOSTART", "0")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    settings = kwargs.get("settings")
    if settings is None:
        wandb.teardown()         # W&B reads its environment once per process (its setup): read it now
        try:
            real = _refusal(lambda: wandb.init(**kwargs))
        finally:
            wandb.teardown()
        ours = _refusal(lambda: tw.init(**kwargs))
    else:
        real, ours = _refusal(lambda: wandb.Settings(**settings)), _refusal(lambda: tw.Settings(**settings))
    assert real is not None, "W&B takes it: not a case for this test"
    assert ours == real


@pytest.mark.parametrize("kwargs", [{"project": "p" * 128}, {"tags": "abc"}, {"save_code": "yes"}, {"reinit": 1},
                                    {"name": ""}, {"resume": True}, {"tags": ("a", "a", "b")}])
def test_init_takes_what_w_and_bs_init_takes(kwargs, monkeypatch):
    """The edges W&B's Settings let through are taken here too (its lax bool, text as tags)."""
    import wandb

    field = {"project": "project", "tags": "run_tags", "save_code": "save_code", "reinit": "reinit",
             "name": "run_name", "resume": "resume"}
    (key, value), = kwargs.items()
    wandb.Settings(**{field[key]: tuple(value) if key == "tags" else value})      # W&B takes it
    monkeypatch.setenv("TELEMETRY_AUTOSTART", "0")
    tw.init(mode="disabled", **kwargs).finish()


@pytest.mark.filterwarnings("ignore:telemetry. no daemon serves:RuntimeWarning")
def test_summary_takes_sets_and_bytes_and_refuses_keys_that_are_not_text_as_w_and_b(tmp_path, monkeypatch):
    """A dict set on `run.summary` with a key that is not text raises W&B's TypeError (its
    summary, unlike its log, takes text keys alone); a set or bytes set there reads back as
    W&B's (a list, text)."""
    import wandb

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")

    def script(mod, **init):
        run = mod.init(**init)
        try:
            refused = _refusal(lambda: run.summary.update({"per_class": {0: 0.5}}))
            run.summary["labels"] = {3}
            run.summary["raw"] = b"ok"
            return refused, run.summary["labels"], run.summary["raw"]
        finally:
            run.finish()

    real = script(wandb, mode="offline", project="p")
    monkeypatch.setenv("TELEMETRY_AUTOSTART", "0")
    assert script(tw, mode="disabled") == real == (("TypeError", 'can only concatenate str (not "int") to str'),
                                                   [3], "ok")


def test_config_paths_in_the_environment_are_refused_as_w_and_b_0_31_refuses_them(tmp_path, monkeypatch):
    """$WANDB_CONFIG_PATHS: W&B 0.31 reads it as one text where its settings want a list, and
    its init raises pydantic's ValidationError; so does the drop-in's (the daemon's W&B run,
    which reads the same environment, could not be made either)."""
    import wandb

    (tmp_path / "extra.yaml").write_text("lr:\n  value: 0.5\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_CONFIG_PATHS", "extra.yaml")
    monkeypatch.setenv("TELEMETRY_AUTOSTART", "0")
    wandb.teardown()
    try:
        real = _refusal(lambda: wandb.init(project="p"))
    finally:
        wandb.teardown()
    assert real is not None and real[0] == "ValidationError" and "config_paths" in real[1]
    assert _refusal(lambda: tw.init(project="p")) == real


@pytest.mark.filterwarnings("ignore:telemetry. no daemon serves:RuntimeWarning")
def test_a_finished_run_refuses_changes_as_w_and_bs_does(tmp_path, monkeypatch):
    """After `run.finish()`, W&B refuses what would change the run (`config.update`, a summary
    set or delete, `define_metric`, a new name, tags or notes, `alert`, `save`) with its
    UsageError, and its summary reads as empty; the drop-in took them all and lost them."""
    import wandb

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "f.txt").write_text("x")

    def script(mod, **init):
        run = mod.init(config={"c": 1}, **init)
        run.log({"a": 1.5})
        run.finish()
        calls = {"config_update": lambda: run.config.update({"d": 2}), "config_item": lambda: run.config.__setitem__("e", 3),
                 "summary_set": lambda: run.summary.__setitem__("z", 1), "summary_attr": lambda: setattr(run.summary, "y", 2),
                 "summary_del": lambda: run.summary.__delitem__("a"), "summary_update": lambda: run.summary.update({"x": 1}),
                 "define_metric": lambda: run.define_metric("a", summary="max"), "name": lambda: setattr(run, "name", "n"),
                 "tags": lambda: setattr(run, "tags", ["t"]), "notes": lambda: setattr(run, "notes", "n"),
                 "alert": lambda: run.alert("t", "x"), "save": lambda: run.save(str(tmp_path / "f.txt")),
                 "summary_get": lambda: run.summary.get("a"), "config_read": lambda: run.config.c}
        said = {}
        for name, call in calls.items():
            got = _refusal(call)
            said[name] = got if got is None else (got[0], got[1].replace(run.id, "ID"))
        return said

    real = script(wandb, mode="offline", project="p")
    monkeypatch.setenv("TELEMETRY_AUTOSTART", "0")
    ours = script(tw, mode="disabled")
    assert ours == real, (ours, real)
    assert real["config_update"] == ("UsageError", "Run (ID) is finished. The call to `_config_callback` will be "
                                                   "ignored. Please make sure that you are using an active run.")


def test_setup_prepares_as_w_and_b_documents_it(tmp_path, monkeypatch):
    """`wandb.setup()` (W&B's advice before starting child processes) returns the one setup
    object, and its settings apply to later inits as W&B's global settings: the project, and
    `config_paths` read into the config (over the init's, as W&B 0.31 reads them); an init's own
    project wins; settings W&B refuses raise as W&B's, and so does a dict of settings (W&B 0.31's
    AttributeError). It raised NotImplementedError, so a script that called it died."""
    import wandb

    (tmp_path / "extra.yaml").write_text("lr:\n  value: 0.5\nepochs:\n  value: 2\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")

    def script(mod, **init):
        mod.teardown()
        try:
            ready = mod.setup() is mod.setup()
            refused = [_refusal(lambda: mod.setup(settings=mod.Settings(console="foo"))),
                       _refusal(lambda: mod.setup(settings={"project": "p"}))]
            mod.setup(settings=mod.Settings(project="from-setup", config_paths=["extra.yaml"]))
            first = mod.init(config={"epochs": 3}, **init)
            seen = [first.project, dict(first.config)]
            first.finish()
            second = mod.init(project="given", **init)
            seen.append(second.project)
            second.finish()
            return ready, refused, seen
        finally:
            mod.teardown()

    real = script(wandb, mode="offline")
    monkeypatch.setenv("TELEMETRY_AUTOSTART", "0")
    assert script(tw, mode="disabled") == real
    assert real[0] and real[2] == ["from-setup", {"lr": 0.5, "epochs": 2}, "given"], real
    assert [r[0] for r in real[1]] == ["ValidationError", "AttributeError"], real


@pytest.mark.filterwarnings("ignore:telemetry. no daemon serves:RuntimeWarning")
def test_summary_reads_whole_floats_back_as_w_and_b_does(tmp_path, monkeypatch):
    """W&B's summary reads a float of a whole value back as an int below 1e6 (6.0 as 6, in
    lists, nested dicts, tensors and numpy values too) and as a float from there (1e6, 2**53);
    the drop-in read back 6.0."""
    import numpy as np
    import torch
    import wandb

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    row = {"six": 6.0, "under": 999999.0, "million": 1e6, "big": 2.0**53, "neg": -3.0, "zero": -0.0, "half": 2.5,
           "int": 7, "flag": True, "lst": [1.0, 2.5], "t": torch.tensor(4.0), "np": np.float32(8.0),
           "nest": {"x": 5.0}}

    def script(mod, **init):
        run = mod.init(**init)
        try:
            run.log(row)
            run.summary["set"] = 9.0
            got = {k: run.summary[k] for k in [*row, "set"] if k != "nest"}
            got["nest"] = run.summary["nest"]["x"]
            return {k: (type(v).__name__, v) for k, v in got.items()}
        finally:
            run.finish()

    real = script(wandb, mode="offline", project="p")
    monkeypatch.setenv("TELEMETRY_AUTOSTART", "0")
    ours = script(tw, mode="disabled")
    assert ours == real, (ours, real)
    assert real["six"] == ("int", 6) and real["million"] == ("float", 1e6), real


def test_wandbs_shared_mode_starts_an_online_daemon(tmp_path, monkeypatch):
    # W&B's "shared" (several processes writing one online run) passed init's check, but the
    # daemon started for it was given no mode: the daemon's default, not online.
    from telemetry.client import autostart

    asked = []
    monkeypatch.setattr(autostart, "ensure_daemon", lambda prog, **kw: asked.append(kw.get("wandb_mode")) if prog == "telemetry.wandb" else None)
    monkeypatch.setenv("TELEMETRY_RUNTIME_DIR", str(tmp_path / "rt"))
    for k in ("TELEMETRY_ENDPOINT", "TELEMETRY_RUN_ID", autostart.ENV_WANDB_MODE):
        monkeypatch.delenv(k, raising=False)
    tw.init(project="p", mode="shared").finish()
    tw.init(project="p", mode="offline").finish()
    assert asked == ["online", "offline"]


def test_absl_flags_are_the_config_as_w_and_b_takes_them(tmp_path, monkeypatch):
    """`wandb.init(config=flags.FLAGS)`, `config.update(flags.FLAGS)` and `config.update(flags)`
    (absl's module) record each flag's value, as W&B's config reads them (the drop-in recorded
    none: absl's FlagValues keeps its flags out of `__dict__`)."""
    flags = pytest.importorskip("absl.flags")
    own = flags.FlagValues()
    flags.DEFINE_integer("batch_size", 32, "", flag_values=own)
    flags.DEFINE_string("optimizer", "adam", "", flag_values=own)
    flags.DEFINE_list("layers", ["a", "b"], "", flag_values=own)
    own(["prog", "--batch_size=64"])
    if "telemetry_test_flag" not in flags.FLAGS:
        flags.DEFINE_float("telemetry_test_flag", 0.5, "")
    flags.FLAGS.mark_as_parsed()

    def script(mod, **init):
        run = mod.init(config=own, **init)
        try:
            first = dict(run.config)
            run.config.update(flags)
            return first, dict(run.config)
        finally:
            run.finish()

    real = _real_and_ours(script, tmp_path, monkeypatch, ours_mode="disabled")
    assert real[0] == {"batch_size": 64, "optimizer": "adam", "layers": ["a", "b"]}, real
    assert real[1]["telemetry_test_flag"] == 0.5, real


def _real_and_ours(script, tmp_path, monkeypatch, ours_mode: str = "offline"):
    """What `script(wandb_module, **init)` returns with real W&B offline and with the drop-in (no
    daemon; `ours_mode` offline or disabled), both in `tmp_path`: asserted equal, and W&B's
    returned."""
    import wandb

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    real = script(wandb, mode="offline", project="p", settings=wandb.Settings(console="off", x_disable_stats=True))
    monkeypatch.setenv("TELEMETRY_AUTOSTART", "0")
    ours = script(tw, mode=ours_mode, project="p")
    assert ours == real, (ours, real)
    return real


@pytest.mark.filterwarnings("ignore:telemetry. no daemon serves:RuntimeWarning")
def test_a_step_beyond_w_and_bs_int64_raises_as_w_and_bs_log_does(tmp_path, monkeypatch):
    """`log(..., step=2**63)` raises W&B's ValueError and changes nothing (the next row goes on
    at the current step); 2**63 - 1 is taken. The drop-in took the step: run.step became it and
    every later row was dropped by the client."""
    def script(mod, **init):
        run = mod.init(**init)
        out = []
        try:
            run.log({"a": 1.0})
            for step in (10**20, 1 << 63):
                try:
                    run.log({"b": 2.0}, step=step)
                    out.append(None)
                except Exception as exc:
                    out.append((type(exc).__name__, str(exc)))
            out.append(run.step)
            run.log({"c": 3.0}, step=(1 << 63) - 1)
            out.append(run.step)
            return out
        finally:
            run.finish()

    real = _real_and_ours(script, tmp_path, monkeypatch)
    assert real[:3] == [("ValueError", f"Value out of range: {10**20}"), ("ValueError", f"Value out of range: {1 << 63}"),
                        1], real


@pytest.mark.filterwarnings("ignore:telemetry. no daemon serves:RuntimeWarning")
def test_a_nan_makes_define_metric_min_and_max_nan_as_in_w_and_b(tmp_path, monkeypatch):
    """A NaN logged to a key whose define_metric summary is min or max makes it NaN from then on,
    before or after other values, as W&B's summary reads (the drop-in passed it over: {"min": 0.5})."""
    import torch

    nan = float("nan")

    def script(mod, **init):
        run = mod.init(**init)
        try:
            for name, ops in (("lo", "min"), ("hi", "max"), ("both", "min,max,first,last"), ("t", "min,max")):
                mod.define_metric(name, summary=ops)
            for row in ({"lo": 1.0, "hi": 1.0, "both": nan, "t": torch.tensor(1.0)},
                        {"lo": nan, "hi": nan, "both": 3.0, "t": torch.tensor(nan)},
                        {"lo": 0.5, "hi": 2.0, "both": 0.5, "t": torch.tensor(0.0)}):
                run.log(row)
            return repr({k: {op: run.summary[k][op] for op in sorted(run.summary[k].keys())}
                         for k in ("lo", "hi", "both", "t")})
        finally:
            run.finish()

    real = _real_and_ours(script, tmp_path, monkeypatch)
    assert real == repr({"lo": {"min": nan}, "hi": {"max": nan}, "both": {"first": nan, "last": 0.5, "max": nan,
                                                                          "min": nan},
                         "t": {"max": nan, "min": nan}}), real


@pytest.mark.filterwarnings("ignore:telemetry. no daemon serves:RuntimeWarning")
def test_starting_step_is_w_and_bs(tmp_path, monkeypatch):
    """`run.starting_step`, as W&B's run has it (the drop-in's raised AttributeError): 0 offline and
    disabled, as W&B's; online, the daemon's W&B run's (a resumed run's, from W&B's server)."""
    import types

    import wandb
    from telemetry.daemon.sinks.wandb_sink import WandbSink
    from telemetry.integrations import wandb_run

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    real = {}
    for mode in ("offline", "disabled"):
        run = wandb.init(mode=mode, project="p", settings=wandb.Settings(console="off", x_disable_stats=True))
        real[mode] = run.starting_step
        run.finish()
    monkeypatch.setenv("TELEMETRY_AUTOSTART", "0")
    ours = {}
    for mode in ("offline", "disabled"):
        with tw.init(mode=mode, project="p") as run:
            ours[mode] = run.starting_step
    assert ours == real == {"offline": 0, "disabled": 0}, (ours, real)
    # Online: what the daemon's W&B sink gives of its run (run_info: what `telemetry status` says).
    sink = WandbSink("online", tmp_path, run_name="r")
    sink.run = types.SimpleNamespace(starting_step=500)
    assert sink.run_info()["starting_step"] == 500
    monkeypatch.setattr(wandb_run, "daemon_run_info", lambda run_id, wait_s, control=None: ({"starting_step": 500}, ""))
    with tw.init(mode="online", project="p") as run:
        assert run.starting_step == 500


def _summary_now(run) -> list:
    """run.summary as a script reads it: its keys (W&B's own left out), nested values as dicts."""
    def read(v):
        return {k: read(v[k]) for k in v.keys()} if hasattr(v, "keys") else v

    return sorted((k, read(run.summary[k])) for k in run.summary.keys() if not k.startswith("_"))


@pytest.mark.filterwarnings("ignore:telemetry. no daemon serves:RuntimeWarning")
def test_a_none_logged_or_set_is_no_key_of_the_summary_as_in_w_and_b(tmp_path, monkeypatch):
    """A key logged as None (or set to None on run.summary) is not in run.summary, as W&B's reads
    (its history keeps the null; a None inside a dict set there is kept), and a nested dict
    left with no key is gone; a None logged after a
    value in one row (commit=False) replaces it there. The drop-in kept each as None, and the
    row's number beside it."""
    def script(mod, **init):
        run = mod.init(**init)
        out = []
        try:
            run.log({"a": 1, "b": None, "m": {"x": 1, "y": None}})
            out.append(_summary_now(run))
            run.log({"a": None, "m": {"x": None}})
            out.append(_summary_now(run))
            run.summary["c"] = None
            run.summary["d"] = 5
            run.summary.update({"d": None, "e": {"f": None, "g": 1}})
            out.append(_summary_now(run))
            run.log({"a": 1})
            run.log({"a": 2}, commit=False)
            run.log({"a": None})
            run.log({"h": None}, commit=False)
            run.log({"h": 3})
            out.append(_summary_now(run))
            try:
                out.append(run.summary["b"])
            except KeyError as exc:
                out.append(repr(exc))
            return out
        finally:
            run.finish()

    real = _real_and_ours(script, tmp_path, monkeypatch)
    # A None inside a dict set on the summary is kept, as W&B keeps the dict it set.
    assert real == [[("a", 1), ("m", {"x": 1})], [], [("e", {"f": None, "g": 1})],
                    [("e", {"f": None, "g": 1}), ("h", 3)], "KeyError('b')"], real


@pytest.mark.filterwarnings("ignore:telemetry. no daemon serves:RuntimeWarning")
def test_a_key_flipping_between_a_value_and_a_dict_reads_as_in_w_and_b(tmp_path, monkeypatch):
    """A key logged or set as a value, then as a dict (or the reverse), at the top or nested, in
    rows of their own or in one row: run.summary reads the last, as W&B's (the drop-in read the
    dict under a value logged again over it at a nested key: {"b": {"c": 2}} after {"b": 3}, and
    at the top level after the fast path took the value: {"b": 2} after 3)."""
    def script(mod, **init):
        run = mod.init(**init)
        out = []
        try:
            for rows in ([{"a": 1.0}, {"a": {"b": 2.0}}, {"a": 3.0}],               # the fast path's value last
                         [{"n": {"b": 1.0}}, {"n": {"b": {"c": 2.0}}}, {"n": {"b": 3.0}}],
                         [{"w": {"b": 2.0}}, {"w": 1.0}]):
                for row in rows:
                    run.log(row)
                    out.append(_summary_now(run))
            run.log({"f": 1}, commit=False)
            run.log({"f": {"g": 2}})
            run.log({"h": {"g": 2}}, commit=False)
            run.log({"h": 1})
            out.append(_summary_now(run))
            run.log({"t": 1.0})
            run.summary["t"] = {"u": 1}
            out.append(_summary_now(run))
            run.log({"t": 2.0})
            run.summary["s"] = {"b": 1}
            run.summary["s"]["b"] = {"c": 2}
            out.append(_summary_now(run))
            run.summary["s"]["b"] = 4
            out.append(_summary_now(run))
            return out
        finally:
            run.finish()

    real = _real_and_ours(script, tmp_path, monkeypatch)
    assert real[2] == [("a", 3)] and real[5] == [("a", 3), ("n", {"b": 3})], real


def test_a_text_of_any_length_is_logged_as_w_and_b_logs_it(tmp_path, make_daemon, monkeypatch):
    """Text past what a row's event carries (a value over 1 MiB, or several large ones in a row,
    a list of long text) reaches the W&B run's history and summary whole, as W&B keeps it; the
    drop-in's client dropped the row's text event, with a warning naming no key."""
    wandb = pytest.importorskip("wandb")
    big = "é" * ((1 << 20) + 5)          # over 2 MiB in UTF-8

    def calls(mod) -> None:
        mod.log({"loss": 1.0, "big": big, "small": "s"})
        mod.log({"many": ["x" * 300_000, "y"], "t2": "z" * 200_000, "t3": "w" * 200_000})
        mod.log({"loss": 0.5})

    run = wandb.init(mode="offline", project="p", dir=str(tmp_path),
                     settings=wandb.Settings(silent=True, console="off", x_disable_stats=True))
    calls(wandb)
    run.finish()
    (real,) = [wait_finished(f) for f in glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))]

    d = make_daemon(wandb="offline")
    monkeypatch.setenv("TELEMETRY_ENDPOINT", d.ingest)
    ours_run = tw.init(project="p")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        calls(tw)
    assert len(ours_run.summary["big"]) == len(big) and len(ours_run.summary["many"][0]) == 300_000
    tw.finish()
    assert d.stop(timeout_s=60) == 0
    (ours,) = [wait_finished(f) for f in glob.glob(str(d.log_dir / "wandb" / "offline-run-*" / "run-*.wandb"))]
    assert user_history(ours) == user_history(real)
    assert user_history(real)[0]["big"] == big
    assert user_summary(ours) == user_summary(real)


def test_text_sent_as_a_file_is_redacted_as_the_rows_text_is(tmp_path, make_daemon, monkeypatch):
    """A token in text past what the row's event carries (it goes as a file) is redacted in the
    W&B run as the same token in a short text is (docs/trust.md, "Secrets")."""
    pytest.importorskip("wandb")
    token = "hf_SeCrEtToKeNvAlUe12345"
    d = make_daemon(wandb="offline")
    monkeypatch.setenv("TELEMETRY_ENDPOINT", d.ingest)
    tw.init(project="p")
    tw.log({"short": f"see {token}", "long": "x" * (1 << 18) + f" {token}", "listed": ["y" * (1 << 18), token]})
    tw.finish()
    assert d.stop(timeout_s=60) == 0
    (ours,) = [wait_finished(f) for f in glob.glob(str(d.log_dir / "wandb" / "offline-run-*" / "run-*.wandb"))]
    row = user_history(ours)[0]
    assert row["short"] == "see <redacted>" and row["long"].endswith(" <redacted>") and row["listed"][1] == "<redacted>"
    assert token not in repr(user_history(ours)) and token not in repr(user_summary(ours))


@pytest.mark.parametrize("given", [{}, {"project": "proj", "name": "nm", "entity": "ent"}])
def test_a_disabled_run_says_what_w_and_bs_disabled_run_says(tmp_path, monkeypatch, given):
    """`wandb.init(mode="disabled")`: the run's name, entity, path, offline, step (W&B's stays 0),
    starting_step, sync_dir and sweep_url are W&B's disabled run's, and its use_artifact gives None
    (the drop-in's entity was "", its name None, its path without the entity, offline True, its
    step counted the rows, starting_step, sync_dir and sweep_url were missing, and use_artifact
    raised W&B's offline TypeError)."""
    import wandb

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("TELEMETRY_AUTOSTART", "0")
    attrs = ("name", "entity", "project", "path", "offline", "disabled", "url", "project_url", "sweep_url", "group",
             "tags", "notes", "job_type", "resumed", "starting_step", "sweep_id", "step")

    def script(mod):
        run = mod.init(mode="disabled", **given)
        try:
            got = {"start": {k: getattr(run, k) for k in attrs}}
            run.log({"a": 1.0})
            run.log({"b": 2.0}, step=5)
            run.log({"c": 3.0}, commit=False)
            got["step"] = run.step
            got["sync_dir is dir's parent"] = run.sync_dir == os.path.dirname(run.dir)
            got["use_artifact"] = run.use_artifact("ent/proj/art:v0")
            return run.id, got
        finally:
            run.finish()

    real_id, real = script(wandb)
    our_id, ours = script(tw)
    swap = lambda d: {k: v.replace(our_id, real_id) if isinstance(v, str) else v for k, v in d.items()}
    assert {**ours, "start": swap(ours["start"])} == real, (ours, real)
    assert real["step"] == 0 and real["start"]["entity"] == given.get("entity", "dummy"), real
