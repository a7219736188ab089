"""W&B's API beyond log, config and summary, real W&B (offline) against the drop-in under
`telemetry run --as-wandb`, both read back with W&B's own protobufs (tests/wandb_offline.py):
artifacts, log_model, save, log_code, alert, mark_preempting, use_artifact offline, the run's
attributes set after init (tests/dropin_scripts/wandb_api_calls.py); HF's `WANDB_LOG_MODEL=end`
(the model artifact transformers logs at the end of training); W&B's own Lightning Fabric logger.
The calls' records are compared as W&B wrote them: an artifact's type, name, description,
metadata, aliases and manifest (each file's path, digest and size); saved files; alerts.
"""
from __future__ import annotations

import glob
import json
import re
import subprocess
import sys

import pytest

from test_wandb_parity import ROOT, SCRIPTS, TIMING, _env, assert_same_run, real_run, shared_run, sidecar_run
from wandb_offline import read_records

pytest.importorskip("wandb")


def calls(path: str, run_id: str | None = None) -> list[tuple]:
    """The records of the calls, in order; the run's id, where a name holds it, as "<id>"."""
    out = []
    for rec in read_records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "artifact":
            a = rec.artifact
            meta = {k: v for k, v in json.loads(a.metadata or "{}").items() if not TIMING.search(k)}
            out.append(("artifact", a.type, a.name.replace(run_id or "\0", "<id>"), a.description, meta,
                        tuple(sorted(a.aliases)),
                        tuple(sorted((c.path, c.digest, c.size) for c in a.manifest.contents))))
        elif kind == "files":
            out.append(("files", tuple((f.path, f.policy) for f in rec.files.files)))
        elif kind == "alert":
            out.append(("alert", rec.alert.title, rec.alert.text, rec.alert.level, rec.alert.wait_duration))
        elif kind == "preempting":
            out.append(("preempting",))
        elif kind == "run":
            out.append(("run", rec.run.display_name, tuple(rec.run.tags), rec.run.notes))
    return out


def _seen(stdout: str) -> dict:
    return json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])


def test_every_call_beyond_log_is_made_as_wandb_makes_it(tmp_path):
    script = SCRIPTS / "wandb_api_calls.py"
    real, real_out = real_run(script, 1, tmp_path / "real", {})
    ours, our_out = sidecar_run(script, 1, tmp_path / "ours", {})
    # What the script reads back: summary.get after a log, use_artifact offline (W&B's own
    # TypeError), run.resumed / start_time / project_url, login() offline, AlertLevel, and
    # $WANDB_MODE ("offline": `telemetry run` leaves the script the mode its W&B run has).
    assert _seen(our_out) == _seen(real_out)
    assert _seen(our_out)["summary_get"] == 1.5
    got, want = calls(ours), calls(real)
    assert got == want
    assert [c[2] for c in want if c[0] == "artifact"] == ["my-data", "raw-weights", "my-model", "source-code"]
    assert ("run", "api-calls-renamed", ("a", "b"), "second") in want     # set after init, applied
    assert_same_run(real, ours)


def test_hf_trainer_with_wandb_log_model_end_logs_the_model(tmp_path_factory):
    pytest.importorskip("transformers")
    env = {"WANDB_LOG_MODEL": "end", "STEPS": "2"}
    script = SCRIPTS / "hf_report_to_wandb.py"
    real, _, _ = shared_run(tmp_path_factory, real_run, script, 1, env)
    ours, _, _ = shared_run(tmp_path_factory, sidecar_run, script, 1, env)
    want = [c for c in calls(real) if c[0] == "artifact"]
    got = [c for c in calls(ours) if c[0] == "artifact"]
    assert got == want
    # transformers logs the model at the start ("base_model") and the trained one at the end
    # ("final_model": its weights, config and architecture), both named after the run.
    models = {c[5]: c for c in want if c[1] == "model" and c[2] == "model-hf-as-wandb"}
    assert set(models) == {("base_model", "latest"), ("final_model", "latest")}    # (sorted aliases)
    assert any(re.search(r"\.safetensors$", p) for p, _, _ in models[("final_model", "latest")][6])
    assert_same_run(real, ours)


def test_wandbs_own_lightning_fabric_logger(tmp_path):
    pytest.importorskip("lightning")
    script = SCRIPTS / "fabric_wandb_logger.py"
    real, _ = real_run(script, 1, tmp_path / "real", {})
    ours, _ = sidecar_run(script, 1, tmp_path / "ours", {})
    assert_same_run(real, ours)


def test_without_wandb_mode_or_a_key_the_run_is_offline_and_says_how_to_sync(tmp_path):
    """As W&B: no $WANDB_MODE and no API key: offline, said, and at finish the `wandb sync`
    command for the run's directory (the daemon's W&B run's)."""
    script = tmp_path / "plain.py"
    script.write_text("import telemetry.wandb as wandb\nrun = wandb.init(project='p')\nrun.log({'x': 1.0})\n"
                      "run.finish()\n")
    env = _env(HOME=str(tmp_path), TELEMETRY_RUNTIME_DIR=str(tmp_path / "rt"), TELEMETRY_DIR=str(tmp_path / "t"))
    env.pop("WANDB_SILENT")
    p = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "no W&B API key configured" in p.stderr
    synced = re.findall(r"wandb: wandb sync (\S+)", p.stderr)
    assert len(synced) == 1, p.stderr[-3000:]
    assert glob.glob(f"{synced[0]}/run-*.wandb") and "offline-run-" in synced[0]


def test_staged_files_never_outlive_their_call(tmp_path, monkeypatch):
    """A disabled run stages nothing it keeps; a staging directory whose writer died is swept by
    the next W&B sink to start, a live writer's is left alone."""
    import os
    import time

    import telemetry.wandb as tw
    from telemetry.integrations import wandb_calls

    monkeypatch.setenv("TELEMETRY_MEDIA_DIR", str(tmp_path / "media"))
    (tmp_path / "w.bin").write_bytes(b"w")
    run = tw.init(mode="disabled")
    art = tw.Artifact("a", type="dataset")
    art.add_file(str(tmp_path / "w.bin"))
    run.log_artifact(art)
    run.log_model(str(tmp_path / "w.bin"))
    run.finish()
    assert os.listdir(wandb_calls.staged_root()) == []
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    for pid in (dead, str(os.getpid())):
        d = wandb_calls.staged_root() / f"{pid}-0123abcd-0"
        d.mkdir()
        os.utime(d, (time.time() - 3600, time.time() - 3600))
    assert wandb_calls.delete_stale_stages() == 1
    assert os.listdir(wandb_calls.staged_root()) == [f"{os.getpid()}-0123abcd-0"]


def test_watch_logs_wandbs_histograms_computed_off_the_training_thread(tmp_path):
    pytest.importorskip("torch")
    script = SCRIPTS / "wandb_watch.py"
    real, _ = real_run(script, 1, tmp_path / "real", {})
    ours, _ = sidecar_run(script, 1, tmp_path / "ours", {})
    from wandb_offline import user_history

    rows = user_history(real)
    assert {k.rsplit("/", 1)[0] for r in rows.values() for k in r if k.startswith(("gradients/", "parameters/"))} >= {
        "parameters/0.weight", "gradients/2.bias", "gradients/graph_1weight"}
    assert_same_run(real, ours)
