"""Bad config, run for real: both programs exit with 2 and a line that names the key, never a traceback.

`telemetry daemon --config FILE` and `python -m trainer.train --config FILE` share one loader
(telemetry.shared.config); these run each program as a process on files a user could write.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", "WANDB_MODE": "disabled"}


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    # A config that is not refused starts a daemon that never exits: the timeout fails the test.
    return subprocess.run([sys.executable, *args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=120)


def _assert_refused(p: subprocess.CompletedProcess, needle: str) -> None:
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert needle in p.stderr, p.stderr[-2000:]
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout, p.stderr[-2000:]


def _daemon(tmp_path: Path, config: Path | str) -> subprocess.CompletedProcess:
    return _run(["-m", "telemetry", "daemon", "--config", str(config), "--log-dir", str(tmp_path / "tm"),
                 "--wandb", "disabled"], tmp_path)


def _write(tmp_path: Path, text: str | bytes) -> Path:
    p = tmp_path / "cfg.yaml"
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    return p


# -- files that are not a config ------------------------------------------------------------------
FILE_CASES = [
    ("a directory", None, "is a directory"),
    ("missing", "", "not found"),
    ("not YAML", "a: [1, 2\nb: {", "not valid YAML"),
    ("binary", b"\xff\xfe\x00\x01garbage", "not YAML"),
    ("a list", "[1, 2]", "top level must be a mapping"),
    ("a string", "just words", "top level must be a mapping"),
]


@pytest.mark.parametrize("what, text, needle", FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_daemon_refuses_a_config_file_that_is_not_one(tmp_path, what, text, needle):
    path = tmp_path if text is None else (tmp_path / "nope.yaml" if text == "" else _write(tmp_path, text))
    _assert_refused(_daemon(tmp_path, path), needle)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads any file")
def test_daemon_refuses_an_unreadable_config(tmp_path):
    p = _write(tmp_path, "rcvhwm: 10\n")
    p.chmod(0)
    _assert_refused(_daemon(tmp_path, p), "cannot read it")


# -- values, types and keys anywhere in the tree ----------------------------------------------------
DAEMON_CASES = [
    ("rcvhwm: -1", "rcvhwm"),
    ("rcvhwm: lots", "'rcvhwm' must be int"),
    ("drain_timeout_s: [1]", "'drain_timeout_s' must be float"),
    ("wandb: {modee: offline}", "'wandb.modee'"),
    ("wandb: [offline]", "'wandb' must be a mapping"),
    ("jsonl: {rotate_mb: big}", "'jsonl.rotate_mb' must be float"),
    ("aggregator: {reductions: {train/loss: median}}", "aggregator.reductions"),
    ("aggregator: {window_reductions: {train/loss: median}}", "aggregator.window_reductions"),
    ("aggregator: {world_size: -3}", "aggregator.world_size"),
    ("aggregator: {first_rank: -1}", "aggregator.first_rank"),
    ("mfu: {dtype: int3}", "mfu.dtype"),
    ("pollers: {nvml_gpus: [a]}", "'pollers.nvml_gpus[0]' must be int"),
    ("pollers: {nvml_intervl_s: 1}", "'pollers.nvml_intervl_s'"),
    ("pollers: {host_per_core: maybe}", "'pollers.host_per_core' must be bool"),
    ("diagnosis: {warmup_steps: x}", "'diagnosis.warmup_steps' must be int"),
    ("diagnosis: {disabled_rules: [nope]}", "diagnosis.disabled_rules"),
    ("diagnosis: {thresholds: {}}", "'diagnosis.thresholds'"),
    ("security: {curve_loopback: 3}", "'security.curve_loopback' must be bool"),
    ("security: {server_secret_key: /no/such.key_secret, allowed_clients_dir: /no/dir}", "security.server_secret_key"),
    ("security: {typo: 1}", "'security.typo'"),
    ("forward: {endpoint: 'tcp://127.0.0.1:5', kinds: metrics}", "'forward.kinds' must be a list"),
    ("forward: {endpoint: 'tcp://127.0.0.1:5', bogus: 1}", "'forward.bogus'"),
    ("forward: {endpoint: 'ipc:///tmp/x'}", "forward.endpoint"),
    ("forward: {endpoint: 'tcp://127.0.0.1:5', max_buffered: 100000000000}", "forward.max_buffered must be 1.."),
    ("forward: {endpoint: 'tcp://127.0.0.1:5', server_public_key: /no/such.key, client_secret_key: /no/such.key_secret}",
     "forward.client_secret_key: cannot read CURVE key /no/such.key_secret"),
    ("metrics: {train/loss: {wandb_summary: best}}", "wandb_summary 'best'"),
    ("metrics: {'*/ppl': {wandb_summary: min}}", "wandb_summary needs an exact name"),
    ("metrics: {'my/*': {wandb_summary: max}}", "wandb_summary needs an exact name"),
    ("custom_sinks: {class: 'a:B'}", "'custom_sinks' must be a list"),
    ("custom_sinks: [{class: 'daemon_sinks:SleepySink', optionz: {}}]", "'custom_sinks[0].optionz'"),
    ("custom_sinks: [{class: 'daemon_sinks:SleepySink'}, {class: nocolon}]", "custom_sinks[1]"),
    ("custom_sinks: [{class: 'no_such_module:Sink'}]", "custom_sinks[0]: cannot build custom sink"),
    ("custom_sinks: [{class: 'daemon_sinks:SleepySink', options: {nope: 1}}]", "custom_sinks[0]: cannot build"),
    # Accepted before, each impossible (an outside tester's finds): an OTLP URL with no host or a
    # port beyond 65535 failed every export at run time; a record every 0.1 ms filled
    # metrics.jsonl with the daemon's own records; an empty pattern; a key given twice (the last won).
    ("otlp: {enabled: true, endpoint: 'http://'}", "otlp.endpoint 'http://': no host"),
    ("otlp: {enabled: true, endpoint: 'http://127.0.0.1:99999/v1/metrics'}", "otlp.endpoint"),
    ("daemon_record_interval_s: 0.0001", "daemon_record_interval_s must be at least 0.1 s"),
    ("aggregator: {reductions: {'': mean}}", "aggregator.reductions['']: a metric name or prefix* is needed"),
    ("aggregator: {step_timeout_s: 10, step_timeout_s: 20}", "the key 'step_timeout_s' is given twice"),
]


@pytest.mark.parametrize("text, needle", DAEMON_CASES, ids=[c[0][:40] for c in DAEMON_CASES])
def test_daemon_refuses_bad_config_by_key_with_exit_2(tmp_path, text, needle):
    _assert_refused(_daemon(tmp_path, _write(tmp_path, text)), needle)


def test_daemon_flags_are_checked_like_the_file(tmp_path):
    """--node-rank without --forward: the forward section has no endpoint."""
    p = _run(["-m", "telemetry", "daemon", "--log-dir", str(tmp_path / "tm"), "--node-rank", "1"], tmp_path)
    _assert_refused(p, "forward.endpoint")
    p = _run(["-m", "telemetry", "daemon", "--log-dir", str(tmp_path / "tm"), "--world-size", "-3"], tmp_path)
    _assert_refused(p, "aggregator.world_size (--world-size)")


def test_daemon_refuses_a_log_dir_that_is_a_file(tmp_path):
    (tmp_path / "tm").write_text("a file")
    p = _run(["-m", "telemetry", "daemon", "--log-dir", str(tmp_path / "tm")], tmp_path)
    _assert_refused(p, "log_dir")


# -- the trainer ------------------------------------------------------------------------------------
def _trainer(tmp_path: Path, config: Path | None, *overrides: str) -> subprocess.CompletedProcess:
    args = ["-m", "trainer.train"] + (["--config", str(config)] if config is not None else [])
    return _run([*args, f"run_dir={tmp_path / 'run'}", "telemetry_endpoint=", *overrides], ROOT)


TRAINER_CASES = [
    ("a directory", "DIR", (), "is a directory"),
    ("not YAML", "steps: [1\n", (), "not valid YAML"),
    ("a list", "- 1\n- 2\n", (), "top level must be a mapping"),
    ("wrong type", "optim: {lr: fast}\n", (), "'optim.lr' must be float"),
    ("unknown key in a dataset", "data:\n  datasets:\n    - {name: a, kind: copy}\n    - {name: b, kind: copy, wieght: 2}\n",
     (), "'data.datasets[1].wieght'"),
    ("dataset without a kind", "data: {datasets: [{name: a}]}\n", (), "'data.datasets[0].kind' is required"),
    ("bad override value", None, ("steps=[1",), "override 'steps=[1'"),
    ("override into a value", None, ("steps.x=1",), "'steps' must be a mapping (to set 'steps.x')"),
    ("hf_config nonsense", None, ("model.hf_config.max_position_embeddings=abc",),
     "model.hf_config.max_position_embeddings must be int"),
]


@pytest.mark.parametrize("what, text, overrides, needle", TRAINER_CASES, ids=[c[0] for c in TRAINER_CASES])
def test_trainer_refuses_bad_config_by_key_with_exit_2(tmp_path, what, text, overrides, needle):
    config = None if text is None else (tmp_path if text == "DIR" else _write(tmp_path, text))
    _assert_refused(_trainer(tmp_path, config, *overrides), needle)


@pytest.mark.parametrize("override, needle", [
    ("telemetry_endpoint=garbage", "telemetry_endpoint"),
    ("telemetry_endpoint=tcp://127.0.0.1:99999", "0 to 65535"),
    ("run_dir=/proc/telemetry-run", "run_dir"),
    ("run_dir={file}/run", "not a directory"),
])
def test_trainer_refuses_a_bad_endpoint_or_run_dir_before_training(tmp_path, override, needle):
    (tmp_path / "file").write_text("x")
    p = _trainer(tmp_path, None, override.format(file=tmp_path / "file"), "steps=1")
    _assert_refused(p, needle)
    p = _trainer(tmp_path, None, override.format(file=tmp_path / "file"), "--check-config")
    _assert_refused(p, needle)                    # run.sh's pre-check sees it too
