"""The W&B run a user gets through the sidecar is the one W&B would have made (issue 30 items 3
and 4). Scripts written the way outside projects write them, each run twice: with the real
wandb (offline) and unmodified under `telemetry run --as-wandb` (zero changed lines); both runs
are read back with W&B's own protobuf schema (tests/wandb_offline.py) and compared: the whole
history by `_step`, the summary, the config, the run's project/name/group/tags, the console.

Values that depend on timing (HF's train_runtime and its rates) and a table's artifact paths (a
random id per log call, different between two real runs too) are left out of the comparison,
named here; so is what the sidecar redacts on purpose (a config key that looks like a secret).

A script's run, real or under the sidecar, is made once per test session (shared_run) and read by
every test that needs it: this file's, and the same script's run in tests/test_integration_*.py
and tests/test_telemetry_run.py.
"""
from __future__ import annotations

import fcntl
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wandb_offline import config, console, run_info, user_history, user_summary, wait_finished

pytest.importorskip("wandb")
pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "dropin_scripts"
# Values that differ between any two runs of the same script, with or without the sidecar:
# timings, and a logged table's artifact paths (a random client id per log call).
TIMING = re.compile(r"(runtime|per_second|artifact_path)$")


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRY_", "WANDB_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update({"PYTHONPATH": str(ROOT), "WANDB_SILENT": "true", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false", **extra})
    return env


def _one_file(pattern: str) -> str:
    files = [f for f in glob.glob(pattern, recursive=True) if "latest-run" not in f]
    assert len(files) == 1, files
    return wait_finished(files[0])


def real_run(script: Path, nproc: int, work: Path, env: dict) -> tuple[str, str]:
    work.mkdir()
    cmd = [sys.executable, str(script)] if nproc == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), str(script)]
    p = subprocess.run(cmd, cwd=work, env=_env(WANDB_DIR=str(work), WANDB_MODE="offline", **env),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    return _one_file(f"{work}/**/run-*.wandb"), p.stdout


def sidecar_run(script: Path, nproc: int, work: Path, env: dict) -> tuple[str, str]:
    work.mkdir()
    p = subprocess.run([sys.executable, "-m", "telemetry", "run", "--as-wandb", "--quiet", "--wandb", "offline",
                        "--nproc", str(nproc), "--run-dir", str(work / "r"), "--", str(script)],
                       cwd=work, env=_env(WANDB_DIR=str(work), **env), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    # W&B's files where the script's $WANDB_DIR says, as W&B puts them (<dir>/wandb/offline-run-*).
    return _one_file(f"{work}/wandb/**/run-*.wandb"), p.stdout


def shared_run(tmp_path_factory, launch, script: Path, nproc: int, env: dict) -> tuple[str, str, Path]:
    """launch(script, nproc, work, env) (real_run or sidecar_run) once per test session: the first
    test to ask runs it, the others read the same run, which no test changes; its wandb file,
    stdout and work directory. A launch is 10-25 CPU-s (each trainer process ~4.5 CPU-s of imports
    alone, torchrun's parent, the daemon); a module-scoped fixture would not share it between files,
    nor between xdist workers, which share the session's base directory (a lock file: a test that
    asks while another worker runs it waits for it, idle, no longer than it took to run it itself)."""
    base = tmp_path_factory.getbasetemp()
    uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    root = base.parent / f"shared-runs-{uid}" if uid else base / "shared-runs"
    root.mkdir(exist_ok=True)
    key = re.sub(r"[^\w.=-]", "_", "-".join([launch.__name__, script.stem, str(nproc),
                                               *(f"{k}={v}" for k, v in sorted(env.items()))]))
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)            # released when the file closes
        done = root / f"{key}.json"
        if not done.exists():
            work = root / key
            shutil.rmtree(work, ignore_errors=True)     # a failed attempt's: this one starts afresh
            done.write_text(json.dumps([*launch(script, nproc, work, env), str(work)]))
        path, out, work = json.loads(done.read_text())
    return path, out, Path(work)


def _untimed(d: dict) -> dict:
    return {k: v for k, v in d.items() if not TIMING.search(k)}


def _close(a, b) -> bool:
    """Equal, floats to 1e-6 relative (a mean over ranks may round differently), recursively."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and a == pytest.approx(b, rel=1e-6)
    return a == b


def assert_same_run(real: str, ours: str) -> None:
    hr, ho = user_history(real), user_history(ours)
    assert sorted(ho) == sorted(hr), "the _steps"
    for step in hr:
        assert _close(_untimed(ho[step]), _untimed(hr[step])), (f"the row at _step {step}", ho[step], hr[step])
    assert _close(_untimed(user_summary(ours)), _untimed(user_summary(real))), \
        ("the summary", user_summary(ours), user_summary(real))
    cr, co = config(real), config(ours)
    assert co.keys() == cr.keys(), "the config's keys"
    for k in cr:
        if co[k] != cr[k]:
            assert "token" in k and co[k] == "<redacted>", (k, cr[k], co[k])    # redacted by the sidecar
    ir, io = run_info(real), run_info(ours)
    assert {k: io[k] for k in ("project", "name", "group", "tags")} == {k: ir[k] for k in ("project", "name", "group", "tags")}


def test_a_plain_wandb_script_text_prints_define_metric_summary(tmp_path):
    script = SCRIPTS / "wandb_features.py"
    real, real_out = real_run(script, 1, tmp_path / "real", {"ID_FILE": str(tmp_path / "real_id")})
    ours, our_out = sidecar_run(script, 1, tmp_path / "ours", {"ID_FILE": str(tmp_path / "our_id")})
    # The script's run.id is the W&B run's; run.path and run.url as W&B offline gives them.
    real_id, real_path, real_url = (tmp_path / "real_id").read_text().split()
    our_id, our_path, our_url = (tmp_path / "our_id").read_text().split()
    assert run_info(real)["id"] == real_id and run_info(ours)["id"] == our_id
    assert (real_path, real_url) == (f"parity/{real_id}", "None") and (our_path, our_url) == (f"parity/{our_id}", "None")
    assert_same_run(real, ours)
    assert user_history(ours)[0]["phase"] == "warmup"                          # text, as W&B keeps it
    assert console(ours) == console(real) and "epoch 1 done" in console(ours)["stdout"]    # W&B's Logs
    # run.name and the path's project as W&B gives them (then `telemetry run`'s closing summary)
    assert our_out.split("=" * 72)[0] == real_out


@pytest.mark.slow
@pytest.mark.parametrize("script, nproc, env", [
    ("nanogpt_wandb.py", 2, {"LOG_ON": "rank0"}),                   # 2 ranks, nanoGPT's master_process guard
    ("accelerate_ddp.py", 2, {"TRACKER": "wandb"}),                 # Accelerate's log_with="wandb", 2 processes
    ("lightning_ddp.py", 1, {"LOGGER": "wandb"}),                   # Lightning's WandbLogger, 2 devices
    # HF Trainer, report_to="wandb"; 8 steps: the run tests/test_telemetry_run.py reads too
    ("hf_report_to_wandb.py", 1, {"STEPS": "8"}),
])
@pytest.mark.slow
def test_outside_scripts_make_the_run_w_and_b_makes(tmp_path_factory, script, nproc, env):
    pytest.importorskip({"accelerate_ddp.py": "accelerate", "lightning_ddp.py": "lightning",
                         "hf_report_to_wandb.py": "transformers"}.get(script, "torch"))
    path = SCRIPTS / script
    env = {"STEPS": "6", **env}
    real, _, _ = shared_run(tmp_path_factory, real_run, path, nproc, env)
    ours, _, _ = shared_run(tmp_path_factory, sidecar_run, path, nproc, env)
    assert_same_run(real, ours)
    assert len(user_history(ours)) >= 6


# -- a run's identity and its end (each scenario's real and sidecar runs are its test's own) ------
def _exit_code(path: str) -> int | None:
    """The exit code W&B recorded for the run (its exit record), None when it wrote none."""
    from wandb_offline import read_records

    codes = [r.exit.exit_code for r in read_records(path) if r.WhichOneof("record_type") == "exit"]
    return codes[-1] if codes else None


def _runs_by_name(work: Path) -> dict[str, str]:
    """Every finished W&B run under `work`, by its name; the run `telemetry run`'s own daemon makes
    when the script's main process makes none (a sweep driver, a parent that forks: project
    "telemetry", the daemon's host series only) is left out: see the README's differences."""
    out = {}
    for f in glob.glob(f"{work}/**/run-*.wandb", recursive=True):
        if "latest-run" in f:
            continue
        info = run_info(wait_finished(f))
        if info["project"] == "telemetry":
            continue
        assert info["name"] not in out, (info, f, out)
        out[info["name"]] = f
    return out


# The daemons' drain deadline in these launches: several daemons drain at once (a sweep's trials,
# forked children), each finishing its W&B run; under a loaded box W&B's start and finish alone
# can pass the default 12 s, and a W&B sink still busy then is abandoned (no exit record). Every
# daemon of the launch reads it (`--daemon-config` reaches the script's other runs' daemons).
DRAIN_CONFIG = "drain_timeout_s: 120\n"


def _launch_both(script: Path, tmp_path: Path, env: dict, rc: int = 0, nproc: int = 1) -> tuple[dict, dict]:
    """The script with the real wandb (offline) and under `telemetry run --as-wandb`, each ending
    with exit code `rc` (`nproc` > 1: under torchrun, and `--nproc`); the runs each made, by name."""
    made = []
    (tmp_path / "daemon.yaml").write_text(DRAIN_CONFIG)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
    for how in ("real", "ours"):
        work = tmp_path / how
        work.mkdir()
        cmd = [*(torchrun if nproc > 1 else [sys.executable]), str(script)] if how == "real" else \
            [sys.executable, "-m", "telemetry", "run", "--as-wandb", "--quiet", "--wandb", "offline",
             "--daemon-config", str(tmp_path / "daemon.yaml"), "--run-dir", str(work / "r"),
             *(["--nproc", str(nproc)] if nproc > 1 else []), "--", str(script)]
        extra = {"WANDB_MODE": "offline"} if how == "real" else {}
        p = subprocess.run(cmd, cwd=work, env=_env(WANDB_DIR=str(work), **extra, **env), capture_output=True,
                           text=True, timeout=600)
        assert p.returncode == rc, (how, p.returncode, p.stderr[-4000:])
        made.append(_runs_by_name(work))
    return made[0], made[1]


def _assert_same_runs(real: dict, ours: dict) -> None:
    assert sorted(ours) == sorted(real), "the runs"
    assert len({run_info(f)["id"] for f in ours.values()}) == len(ours), "a run id each"
    for name in real:
        assert_same_run(real[name], ours[name])
        assert _exit_code(ours[name]) == _exit_code(real[name]), (name, "the exit code")


@pytest.mark.slow
def test_a_sweeps_trials_started_at_once_are_each_a_run_of_their_own(tmp_path):
    """Four trials on one node, each `wandb.init(id=...)` in a process of its own: each its own
    run, with its own rows, config and id (before: every trial's rows in one trial's run)."""
    real, ours = _launch_both(SCRIPTS / "sweep_trials.py", tmp_path, {"TRIALS": "4"})
    assert sorted(real) == [f"trial-{i}" for i in range(4)]
    _assert_same_runs(real, ours)
    assert {run_info(f)["id"] for f in ours.values()} == {f"trial-{i}" for i in range(4)}
    for i in range(4):
        assert {row["trial"] for row in user_history(ours[f"trial-{i}"]).values()} == {i}


@pytest.mark.slow
@pytest.mark.parametrize("how", ["arg", "env"])
def test_a_run_the_script_names_is_the_launchers_run(tmp_path, how):
    """`wandb.init(id=..., resume="allow")` (or $WANDB_RUN_ID), the one run of the script: it is
    the run `telemetry run` drains and summarises, with the script's id (before: a second daemon
    and run directory for it, and the launcher's run empty: "steps logged 0")."""
    env = {"HOW": how, **({"WANDB_RUN_ID": "fixed-run-1"} if how == "env" else {})}
    real, ours = _launch_both(SCRIPTS / "fixed_id.py", tmp_path, env)
    _assert_same_runs(real, ours)
    assert run_info(ours["named"])["id"] == "fixed-run-1"
    drains = sorted(tmp_path.joinpath("ours").rglob("drain.json"))
    assert drains == [tmp_path / "ours" / "r" / "drain.json"], drains
    final = json.loads(drains[0].read_text())
    assert final["records_lost"] == 0 and final["run"]["steps_out"] == 5, final


@pytest.mark.slow
def test_an_earlier_launchs_claim_in_a_reused_runtime_dir_is_not_this_launchs(tmp_path):
    """$TELEMETRY_RUNTIME_DIR reused across launches: the claim an earlier launch left there
    (another id, its process gone) must not turn this launch's run away to a daemon of its own."""
    import tempfile

    rt = Path(tempfile.mkdtemp(prefix="tmclaim-", dir="/tmp"))
    try:
        (rt / "wandb_run.id").write_text("stale-run\n1 1\n")
        work = tmp_path / "ours"
        work.mkdir()
        p = subprocess.run([sys.executable, "-m", "telemetry", "run", "--as-wandb", "--quiet", "--wandb", "offline",
                            "--run-dir", str(work / "r"), "--", str(SCRIPTS / "fixed_id.py")], cwd=work,
                           env=_env(WANDB_DIR=str(work), HOW="arg", TELEMETRY_RUNTIME_DIR=str(rt)),
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-4000:]
        assert sorted(work.rglob("drain.json")) == [work / "r" / "drain.json"]
        assert json.loads((work / "r" / "drain.json").read_text())["run"]["steps_out"] == 5
        assert not (rt / "wandb_run.id").exists()     # this launch's claim goes with it
    finally:
        shutil.rmtree(rt, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["child_then_parent", "noid_child_then_parent", "retry", "retry_beside_driver",
                                 "rank_named"])
def test_runs_of_other_ids_beside_the_launchs_keep_their_own_rows(tmp_path, how):
    """The launch's run is the first a process of the script names (the test above); the others
    stay runs of their own: a run without an id made after a subprocess claimed the launch (with
    an id or without), a retry of the same id after the first attempt ended or from the claimant's
    own rank while it runs, a rank without an id beside a rank that named its run (before: merged
    into the claimant's W&B run, rows lost, drain.json 0 lost)."""
    real, ours = _launch_both(SCRIPTS / "launch_claims.py", tmp_path, {"HOW": how},
                              nproc=2 if how == "rank_named" else 1)
    assert sorted(ours) == sorted(real) and len(real) == 2, (sorted(real), sorted(ours))
    for name in real:
        assert_same_run(real[name], ours[name])
    if how.startswith("retry"):
        assert {run_info(f)["id"] for f in ours.values()} == {"same"}
    else:
        assert len({run_info(f)["id"] for f in ours.values()}) == 2
    for final in (json.loads(f.read_text()) for f in tmp_path.joinpath("ours").rglob("drain.json")):
        assert final["records_lost"] == 0, final


@pytest.mark.slow
@pytest.mark.parametrize("reinit", ["finish", "create_new"])
def test_a_k_fold_loop_makes_a_run_per_fold(tmp_path, reinit):
    """init, log, finish twice in one process, or two runs open at once (reinit="create_new"),
    each logged through its own run object: two runs (before: one run with both folds' rows and
    the second fold's config, and logging to the first then raised)."""
    real, ours = _launch_both(SCRIPTS / "kfold.py", tmp_path, {"REINIT": reinit} if reinit == "create_new" else {})
    assert sorted(real) == ["fold-0", "fold-1"]
    _assert_same_runs(real, ours)
    assert len({run_info(f)["id"] for f in ours.values()}) == 2


@pytest.mark.slow
def test_runs_left_open_at_exit_finish_before_their_daemons_drain(tmp_path):
    """Two runs open at once (reinit="create_new"), neither finished, and the script exits with
    sys.exit(3): each run finishes with the script's exit code before its daemon drains. The
    second run's daemon is started by the script after the first run's exit hook was registered
    (before: its drain ran first, so the run never said its end, its client was still open at the
    drain, and its finish then waited up to 15 s for a daemon that was gone)."""
    script = tmp_path / "open_at_exit.py"
    script.write_text("import sys\nimport wandb\n"
                      "runs = [wandb.init(project='open', name=f'open-{k}', reinit='create_new') for k in range(2)]\n"
                      "for k, run in enumerate(runs):\n    run.log({'loss': 1.0 + k})\nsys.exit(3)\n")
    work = tmp_path / "ours"
    work.mkdir()
    p = subprocess.run([sys.executable, "-m", "telemetry", "run", "--as-wandb", "--quiet", "--wandb", "offline",
                        "--run-dir", str(work / "r"), "--", str(script)],
                       cwd=work, env=_env(WANDB_DIR=str(work)), capture_output=True, text=True, timeout=600)
    assert p.returncode == 3, p.stderr[-4000:]
    runs = _runs_by_name(work)
    assert sorted(runs) == ["open-0", "open-1"]
    for name, path in runs.items():
        assert _exit_code(path) == 3, name
        assert user_history(path) == {0: {"loss": 1.0 + int(name[-1])}}, name
    drains = [json.loads(f.read_text()) for f in work.rglob("drain.json")]
    assert len(drains) == 2 and all(d["sources_open_at_drain"] == 0 for d in drains), drains
    ends = [json.loads(line)["data"] for f in work.rglob("metrics.jsonl") for line in f.read_text().splitlines()
            if '"train_end"' in line]
    assert sorted(e["exit_code"] for e in ends) == [3, 3], ends


@pytest.mark.slow
def test_forked_children_each_make_a_run_of_their_own(tmp_path):
    """A parent that imported wandb forks; each child inits, logs and finishes: one run per child,
    every row in its child's run (before: the children's rows in one run, or nowhere)."""
    real, ours = _launch_both(SCRIPTS / "forked_children.py", tmp_path, {"CHILDREN": "3"})
    assert sorted(real) == [f"child-{i}" for i in range(3)]
    _assert_same_runs(real, ours)


@pytest.mark.slow
@pytest.mark.parametrize("how, rc", [("crash", 1), ("exit3", 3), ("finish3", 0)])
def test_a_run_that_fails_records_the_exit_code_w_and_b_records(tmp_path, how, rc):
    """An uncaught exception, sys.exit(3), wandb.finish(exit_code=3): W&B records 1, 3, 3
    (before: 0 every time); `telemetry run` exits as the script does."""
    real, ours = _launch_both(SCRIPTS / "exit_codes.py", tmp_path, {"HOW": how}, rc=rc)
    _assert_same_runs(real, ours)
    assert _exit_code(ours[f"ends-{how}"]) == {"crash": 1, "exit3": 3, "finish3": 3}[how]


@pytest.mark.slow
def test_a_sigtermed_run_records_the_exit_code_telemetry_run_exits_with(tmp_path):
    """SIGTERM (a scheduler's preemption) ends Python without its exit hooks. W&B offline (0.31)
    then writes nothing of the run: no rows, no exit record. Under `telemetry run` the rows are
    kept and the run's exit code is the one `telemetry run` exits with (143: 128 + SIGTERM), from
    its drain request (before: 0). The difference is in the README."""
    from daemon_util import step_values

    codes, files = {}, {}
    for how in ("real", "ours"):
        work = tmp_path / how
        work.mkdir()
        cmd = [sys.executable, str(SCRIPTS / "exit_codes.py")] if how == "real" else \
            [sys.executable, "-m", "telemetry", "run", "--as-wandb", "--quiet", "--wandb", "offline",
             "--run-dir", str(work / "r"), "--", str(SCRIPTS / "exit_codes.py")]
        extra = {"WANDB_MODE": "offline"} if how == "real" else {}
        p = subprocess.Popen(cmd, cwd=work, env=_env(WANDB_DIR=str(work), HOW="sigterm", **extra),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline().strip() == "logged"
            if how == "ours":            # the rows are on their way: wait for them (W&B's are in its process)
                deadline = time.monotonic() + 120
                while not (work / "r" / "metrics.jsonl").exists() or len(step_values(work / "r")) < 3:
                    assert time.monotonic() < deadline and p.poll() is None
                    time.sleep(0.1)
            p.send_signal(signal.SIGTERM)      # `telemetry run` passes it on to the script
            codes[how] = p.wait(300)
        finally:
            if p.poll() is None:
                p.kill()
        files[how] = [f for f in glob.glob(f"{work}/**/run-*.wandb", recursive=True) if "latest-run" not in f]
    assert codes == {"real": -signal.SIGTERM, "ours": 128 + signal.SIGTERM}
    (real,) = files["real"]
    (ours,) = files["ours"]
    ours = wait_finished(ours)
    assert _exit_code(ours) == 128 + signal.SIGTERM
    assert user_history(ours) == {s: {"loss": 1.0 / (s + 1)} for s in range(3)}
    assert run_info(ours)["name"] == "ends-sigterm"
    if _exit_code(real) is not None:           # a W&B that records the run: the same run
        assert_same_run(real, ours)


def test_tensor_rows_and_float_rows_all_land_at_their_steps(tmp_path_factory):
    """A 0-dim tensor row is read on the client's sender thread, a float row goes out at once:
    every row of the two kinds is in the run, at its step, as W&B keeps them (the float row
    logged after a tensor row used to overtake it, and the W&B sink dropped the tensor row as a
    step going backwards)."""
    path = SCRIPTS / "tensor_loss_loop.py"
    real, _, _ = shared_run(tmp_path_factory, real_run, path, 1, {})
    ours, _, _ = shared_run(tmp_path_factory, sidecar_run, path, 1, {})
    assert_same_run(real, ours)
    assert len(user_history(ours)) == 60 + 6 + 80



def _environment(path: str) -> dict:
    """The run's metadata as W&B records it (its environment record: wandb-metadata.json)."""
    from wandb_offline import read_records

    for r in read_records(path):
        if r.WhichOneof("record_type") == "environment" and r.environment.program:
            e = r.environment
            return {"program": e.program, "code_path": e.code_path, "root": e.root, "host": e.host,
                    "python": e.python, "executable": e.executable, "os": e.os, "args": list(e.args)}
    return {}


def test_the_runs_metadata_and_files_are_the_scripts(tmp_path):
    """The W&B run's metadata is the script's process's (program, code path from the git root,
    args, host, python), not the daemon's; its files are under the script's `dir=`, in W&B's
    layout; its `_runtime` is bounded by the script's run's lifetime (a hang detector: it used to
    run from the daemon's start to its drain)."""
    from wandb_offline import summary

    got = {}
    for how in ("real", "ours"):
        work = tmp_path / how
        (work / "src").mkdir(parents=True)
        subprocess.run(["git", "init", "-q", str(work)], check=True)
        shutil.copy(SCRIPTS / "meta_and_dir.py", work / "src" / "meta_and_dir.py")
        files = work / "files"
        args = ["src/meta_and_dir.py", "--lr", "0.1", "--files", str(files)]
        cmd = [sys.executable, *args] if how == "real" else \
            [sys.executable, "-m", "telemetry", "run", "--as-wandb", "--quiet", "--wandb", "offline",
             "--run-dir", str(work / "r"), "--", *args]
        p = subprocess.run(cmd, cwd=work, env=_env(**({"WANDB_MODE": "offline"} if how == "real" else {})),
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, (how, p.stderr[-4000:])
        lifetime = float(re.search(r"LIFETIME (\S+)", p.stdout).group(1))
        path = _one_file(f"{files}/wandb/offline-run-*/run-*.wandb")
        env = _environment(path)
        assert env.pop("program") == str(work / "src" / "meta_and_dir.py"), how
        assert env.pop("args") == ["--lr", "0.1", "--files", str(files)], how
        assert env.pop("root") == str(files), how
        got[how] = (env, summary(path)["_runtime"], lifetime, path)
    (real_env, _, _, real), (our_env, runtime, lifetime, ours) = got["real"], got["ours"]
    assert our_env == real_env and our_env["code_path"] == "src/meta_and_dir.py"
    assert 0 < runtime <= lifetime + 2.0, (runtime, lifetime)
    assert_same_run(real, ours)


def test_summary_edits_make_the_summary_w_and_b_makes(tmp_path_factory):
    """`run.summary` edited the ways W&B allows: a nested value edited through what reading it
    gives (W&B's SummarySubDict; a copy before, so the edit was lost), keys deleted (raised
    AttributeError before: the script died), a deleted key logged again. The summary W&B's server
    builds from the file (updates and removals, nested keys) and what the script read back are
    W&B's; the summary change waits for the rows logged before it (a row the daemon's run
    committed after it would overwrite it)."""
    from wandb_offline import summary_tree

    path = SCRIPTS / "summary_edits.py"
    real, out_real, _ = shared_run(tmp_path_factory, real_run, path, 1, {})
    ours, out_ours, _ = shared_run(tmp_path_factory, sidecar_run, path, 1, {})
    lines = [ln for ln in out_real.splitlines() if ln.startswith("{")]
    assert len(lines) == 2 and [ln for ln in out_ours.splitlines() if ln.startswith("{")] == lines, out_ours
    assert summary_tree(ours) == summary_tree(real), (summary_tree(ours), summary_tree(real))
    assert summary_tree(ours)["m"] == {"a": 100, "b": 4} and "best" not in summary_tree(ours)
    assert user_history(ours) == user_history(real)


def test_empty_rows_bools_and_late_define_metric_are_w_and_bs(tmp_path_factory):
    """`wandb.log({})` is a row of W&B's history (it was not written); numpy and tensor bools are
    W&B's true/false (they were 1/0); a define_metric made after rows applies from there, as
    W&B's: the daemon's run defined it before those rows reached it, so its summary took values
    W&B's never does; `define_metric` returns W&B's Metric (it returned None)."""
    from wandb_offline import summary_tree

    path = SCRIPTS / "define_and_bools.py"
    real, out_real, _ = shared_run(tmp_path_factory, real_run, path, 1, {})
    ours, out_ours, _ = shared_run(tmp_path_factory, sidecar_run, path, 1, {})
    lines = [ln for ln in out_real.splitlines() if ln.startswith("{")]
    assert len(lines) == 1 and [ln for ln in out_ours.splitlines() if ln.startswith("{")] == lines, out_ours
    assert user_history(ours) == user_history(real)
    assert user_history(ours)[1] == {} and user_history(ours)[2]["nb"] is False
    assert summary_tree(ours) == summary_tree(real), (summary_tree(ours), summary_tree(real))


def test_config_values_w_and_b_turns_into_json_are_the_runs(tmp_path_factory):
    """A config of values W&B's config turns into JSON by its rules (ints beyond 64 bits, bytes,
    an Enum, dates, a set, a slice, a dataclass, a function, NaN, numpy arrays, tensors): the run
    is the script's, its config W&B's, and the script reads the config back as W&B's. An int
    beyond 64 bits made the run's hello unsendable: the W&B run lost its config, project and
    id, and took the daemon's own series into its history; bytes and Enums were other text."""
    path = SCRIPTS / "config_values.py"
    real, out_real, _ = shared_run(tmp_path_factory, real_run, path, 1, {})
    ours, out_ours, _ = shared_run(tmp_path_factory, sidecar_run, path, 1, {})
    lines = [json.loads(ln) for ln in out_real.splitlines() if ln.startswith("{")]
    # Compared as values: W&B's init reads its config back through JSON (a tensor's 1.0 as 1).
    assert len(lines) == 1 and [json.loads(ln) for ln in out_ours.splitlines() if ln.startswith("{")] == lines, out_ours
    assert_same_run(real, ours)
    assert run_info(ours)["project"] == "config-values"
    cfg = config(ours)
    assert cfg["seed"] == 2**64 and cfg["later"] == 2**65 and cfg["raw"] == "ab" and cfg["color"] == "RED", cfg
    assert sorted(user_history(ours)) == [0, 1, 2, 3]


def test_values_and_calls_w_and_b_takes_or_refuses_in_its_own_ways(tmp_path_factory):
    """numpy's str_ is text in W&B's run (it was sent as a number and refused by the daemon:
    missing from the W&B run, while the script's summary read it); a bool step, a Histogram in a
    list and a log after finish raise what W&B raises (they were taken, stored as junk, or raised
    another error class)."""
    path = SCRIPTS / "odd_values.py"
    real, out_real, _ = shared_run(tmp_path_factory, real_run, path, 1, {})
    ours, out_ours, _ = shared_run(tmp_path_factory, sidecar_run, path, 1, {})
    lines = [json.loads(ln) for ln in out_real.splitlines() if ln.startswith("{")]
    assert len(lines) == 1 and [json.loads(ln) for ln in out_ours.splitlines() if ln.startswith("{")] == lines, out_ours
    assert all(v is not None for v in lines[0].values()), lines
    assert_same_run(real, ours)
    assert user_history(ours)[0]["npstr"] == "hi"


def test_a_histogram_set_on_the_summary_is_in_the_w_and_b_runs_summary(tmp_path_factory):
    """`run.summary[k] = wandb.Histogram(...)`: W&B's summary holds the histogram's JSON; the
    drop-in's event could not carry the object, and the key was missing from the W&B run with
    nothing said (an outside tester's find)."""
    path = SCRIPTS / "summary_media.py"
    real, _, _ = shared_run(tmp_path_factory, real_run, path, 1, {})
    ours, _, _ = shared_run(tmp_path_factory, sidecar_run, path, 1, {})
    assert user_summary(ours)["s_hist"]["_type"] == "histogram"
    assert_same_run(real, ours)


def test_a_flat_key_and_a_nested_one_of_the_same_name_are_two_keys_as_in_w_and_b(tmp_path_factory):
    """A flat "a/b" and a nested {"a": {"b": v}} are two keys in W&B's run (its history and
    summary keep the path ("a", "b") beside the key "a/b"; so a flat "d.e.f" beside d -> e -> f):
    the drop-in flattened both to "a/b", so one value of the row was lost, the summary held one of
    them nested, and define_metric of "m.x" (W&B's name of the nested key) read back as the plain
    value. The history by path, the summary W&B's server builds, what the script read back and
    metrics.jsonl (every number of each W&B row, none lost to another of its name) are W&B's."""
    from collections import Counter

    from wandb_offline import summary_tree, user_history_paths

    path = SCRIPTS / "flat_and_nested.py"
    real, out_real, _ = shared_run(tmp_path_factory, real_run, path, 1, {})
    ours, out_ours, work = shared_run(tmp_path_factory, sidecar_run, path, 1, {})
    hr, ho = user_history_paths(real), user_history_paths(ours)
    assert sorted(ho) == sorted(hr), "the _steps"
    for step in hr:
        assert _close(ho[step], hr[step]), (f"the row at _step {step}", ho[step], hr[step])
    assert hr[0] == {("a/b",): 1, ("a", "b"): 2}
    assert summary_tree(ours) == summary_tree(real), (summary_tree(ours), summary_tree(real))
    lines = [json.loads(ln) for ln in out_real.splitlines() if ln.startswith("{")]
    assert len(lines) == 1 and [json.loads(ln) for ln in out_ours.splitlines() if ln.startswith("{")] == lines, out_ours
    assert lines[0]["a/b"] == 1 and lines[0]["a"] == {"b": 20} and lines[0]["m"] == {"x": {"max": 62}}
    jsonl: dict[int, Counter] = {}
    with open(work / "r" / "metrics.jsonl") as f:
        for rec in map(json.loads, f):
            if rec["kind"] == "metrics" and "rank" not in rec:
                jsonl.setdefault(rec["step"], Counter()).update(rec["values"].values())
    for step, row in hr.items():
        numbers = Counter(v for v in row.values() if isinstance(v, (int, float)) and not isinstance(v, bool))
        assert not numbers - jsonl.get(step, Counter()), (f"metrics.jsonl at step {step}", jsonl.get(step), row)


def test_summary_keys_read_set_and_deleted_as_attributes_as_in_w_and_b(tmp_path_factory):
    """`run.summary.best_acc = 0.9`, `wandb.summary.note = ...`, `run.summary.eval.loss = ...`
    (nested), `del run.summary.gone`, and reads as attributes: W&B's summary takes them all
    (before: a set was kept on the object and never reached the W&B run; a read raised
    AttributeError). The W&B run's summary and what the script read back are W&B's."""
    from wandb_offline import summary_tree

    path = SCRIPTS / "summary_attrs.py"
    real, out_real, _ = shared_run(tmp_path_factory, real_run, path, 1, {})
    ours, out_ours, _ = shared_run(tmp_path_factory, sidecar_run, path, 1, {})
    lines = [json.loads(ln) for ln in out_real.splitlines() if ln.startswith("{")]
    assert len(lines) == 1 and [json.loads(ln) for ln in out_ours.splitlines() if ln.startswith("{")] == lines, out_ours
    assert lines[0]["acc"] == 0.5 and lines[0]["missing"] == ["KeyError", "'nope'"], lines
    assert summary_tree(ours) == summary_tree(real), (summary_tree(ours), summary_tree(real))
    assert summary_tree(ours)["best_acc"] == 0.75 and summary_tree(ours)["note"] == "ok"
    assert user_history(ours) == user_history(real)


def test_nested_keys_that_are_not_text_sets_and_bytes_are_logged_as_w_and_b_logs_them(tmp_path_factory):
    """A nested dict keyed by ints (per-class accuracy), floats, bools, None, tuples, an Enum,
    numpy scalars or a date: W&B names each nested key by its own rules (`acc_per_class/0`,
    `by/0.5`, `by/true`, `by/None`, `by/1,2`); a set is a list, bytes are text (before: the
    first crashed the script with W&B's top-level TypeError, the others were warned and
    dropped). What W&B refuses (a top-level key that is not text, bytes that are not UTF-8, an
    object as a key) raises what W&B raises, and the row is not logged. The history by path,
    the summary W&B's server builds and what the script read back are W&B's."""
    from wandb_offline import summary_tree, user_history_paths

    path = SCRIPTS / "keys_and_values.py"
    real, out_real, _ = shared_run(tmp_path_factory, real_run, path, 1, {})
    ours, out_ours, _ = shared_run(tmp_path_factory, sidecar_run, path, 1, {})
    lines = [json.loads(ln) for ln in out_real.splitlines() if ln.startswith("{")]
    assert len(lines) == 1 and [json.loads(ln) for ln in out_ours.splitlines() if ln.startswith("{")] == lines, out_ours
    assert lines[0]["bad_bytes"][0] == "UnicodeDecodeError" and lines[0]["per_class"] == {"0": 0.9, "1": 0.8}, lines
    hr, ho = user_history_paths(real), user_history_paths(ours)
    assert ho == hr, (ho, hr)
    assert hr[0][("acc_per_class", "0")] == 0.9 and hr[1][("by", "1,2")] == 8 and hr[2][("seen",)] == [1, 2, 3]
    assert summary_tree(ours) == summary_tree(real), (summary_tree(ours), summary_tree(real))


def test_config_defaults_yaml_is_in_the_scripts_config_as_in_w_and_b(tmp_path_factory):
    """W&B's init loads `config-defaults.yaml` from the working directory into run.config, under
    the config given: the script reads it back (before: `wandb.config.epochs` raised
    AttributeError, though the daemon's W&B run had it), and the run's config is W&B's."""
    path = SCRIPTS / "config_defaults.py"
    real, out_real, _ = shared_run(tmp_path_factory, real_run, path, 1, {})
    ours, out_ours, work = shared_run(tmp_path_factory, sidecar_run, path, 1, {})
    lines = [json.loads(ln) for ln in out_real.splitlines() if ln.startswith("{")]
    assert len(lines) == 1 and [json.loads(ln) for ln in out_ours.splitlines() if ln.startswith("{")] == lines, out_ours
    assert lines[0]["epochs"] == 3 and lines[0]["batch_size"] == 64, lines
    with open(work / "r" / "metrics.jsonl") as f:         # the run's hello (what the daemon's sinks read)
        hellos = [rec["info"] for rec in map(json.loads, f) if rec["kind"] == "hello"]
    assert [h["config"] for h in hellos if "config" in h][-1] == lines[0]
    assert_same_run(real, ours)
    assert config(ours)["opt"] == {"name": "adam", "betas": [0.9, 0.99]} and len(user_history(ours)) == 3


def test_names_the_daemon_derives_too_stay_what_the_script_logged(tmp_path_factory):
    """A script that logs perf/step_time (a common name) had the daemon's derivations written into
    its rows: its own perf/steps_per_second (7) replaced by 1/step_time (2), and perf/step_time_max,
    _min, perf/slowest_rank, perf/samples_per_second added to every row and the summary (an outside
    tester's find). Compared exactly here: the parity tests leave rates out as timings."""
    path = SCRIPTS / "perf_keys.py"
    real, _, _ = shared_run(tmp_path_factory, real_run, path, 1, {})
    ours, _, _ = shared_run(tmp_path_factory, sidecar_run, path, 1, {})
    assert user_history(ours) == user_history(real), (user_history(ours), user_history(real))
    assert user_history(ours)[0]["perf/steps_per_second"] == 7.0
    assert user_summary(ours) == user_summary(real), (user_summary(ours), user_summary(real))


def test_a_config_file_and_no_project_are_w_and_bs(tmp_path_factory):
    """`wandb.init(config="file.yaml")` and `config.update(path)` read W&B's config file (they
    raised TypeError: the script died); a run that names no project is W&B's "uncategorized"
    (it was filed under the daemon's own project "telemetry", and run.project was None)."""
    path = SCRIPTS / "config_file_no_project.py"
    real, out_real, _ = shared_run(tmp_path_factory, real_run, path, 1, {})
    ours, out_ours, _ = shared_run(tmp_path_factory, sidecar_run, path, 1, {})
    said = [ln for ln in out_real.splitlines() if ln.startswith(("PROJECT", "MISSING"))]
    assert said == ["PROJECT uncategorized uncategorized", "MISSING ConfigError"], out_real
    assert [ln for ln in out_ours.splitlines() if ln.startswith(("PROJECT", "MISSING"))] == said, out_ours
    assert config(ours) == config(real) == {"_wandb": {}, "lr": 0.01, "batch": 32, "dropout": 0.1}, \
        (config(ours), config(real))
    assert run_info(ours)["project"] == run_info(real)["project"] == "uncategorized"


def test_values_w_and_b_keeps_as_text_or_their_value_are_logged_as_w_and_b_logs_them(tmp_path_factory):
    """A datetime, date, Decimal, Fraction or Enum in a row was refused (one warning a key, the
    value not in the run), where W&B logs its ISO text, its text or its value (an outside
    tester's find)."""
    path = SCRIPTS / "text_like_values.py"
    real, _, _ = shared_run(tmp_path_factory, real_run, path, 1, {})
    ours, _, _ = shared_run(tmp_path_factory, sidecar_run, path, 1, {})
    assert user_history(ours) == user_history(real), (user_history(ours), user_history(real))
    assert user_history(ours)[0]["eval_time"] == "2020-01-02T03:04:05" and user_history(ours)[0]["split"] == 1
