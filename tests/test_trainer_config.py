"""Config loading: defaults, overrides, and clear errors for bad input."""
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.config import DEFAULT_CONFIG, load_config

ROOT = Path(__file__).resolve().parent.parent


def test_default_config_loads_and_overrides_apply():
    cfg = load_config(None, ["steps=7", "run_dir=/tmp/x", "optim.lr=1e-4", "engine.zero_stage=1",
                             "model.hf_config.hidden_size=32"])
    assert DEFAULT_CONFIG.is_file()
    assert (cfg.steps, cfg.run_dir, cfg.optim.lr, cfg.engine.zero_stage) == (7, "/tmp/x", 1e-4, 1)
    assert cfg.model.hf_config["hidden_size"] == 32 and cfg.model.hf_config["num_hidden_layers"] == 2
    assert [d.name for d in cfg.data.datasets] == ["copy", "reverse", "sort", "add"]
    assert isinstance(cfg.optim.lr, float)


@pytest.mark.parametrize("override, needle", [
    (["optim.lrr=1"], "unknown config key 'optim.lrr'"),
    (["nope=1"], "unknown config key 'nope'"),
    (["steps=abc"], "config key 'steps' must be int"),
    (["steps=1.5"], "config key 'steps' must be int"),
    (["model.gradient_checkpointing=3"], "'model.gradient_checkpointing' must be bool"),
    (["engine.zero_stage=5"], "engine.zero_stage must be 0, 1, 2 or 3"),
    (["engine.backend=ddp", "engine.zero_stage=2"], "engine.backend=ddp cannot shard"),
    (["data.seq_len=4096"], "exceeds model.hf_config.max_position_embeddings"),
    (["data.datasets=[{name: a, kind: nonsense}]"], "kind must be one of"),
    (["data.datasets=[{name: a, kind: copy}, {name: a, kind: sort}]"], "duplicate names"),
    (["data.datasets=[{name: a, kind: jsonl}]"], "kind jsonl needs a path"),
    (["data.datasets=[{name: a, kind: copy, weight: 0}]"], "weight must be > 0"),
    (["nonfinite_action=explode"], "nonfinite_action must be skip or stop"),
    (["steps"], "is not key=value"),
])
def test_config_errors_name_the_problem(override, needle):
    with pytest.raises(ValueError) as e:
        load_config(None, override)
    assert needle in str(e.value)


def test_flash_attention_refused_when_not_installed():
    pytest.importorskip("torch")
    import importlib.util
    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash_attn is installed here")
    with pytest.raises(ValueError, match="flash_attn is not installed"):
        load_config(None, ["model.attn_implementation=flash_attention_2"])


def test_cli_reports_config_error_without_traceback(tmp_path):
    p = subprocess.run([sys.executable, "-m", "trainer.train", "optim.bogus=1", f"run_dir={tmp_path}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "unknown config key 'optim.bogus'" in p.stderr
    assert "Traceback" not in p.stderr


def test_every_shipped_config_is_valid():
    for path in sorted((ROOT / "launch" / "configs").glob("*.yaml")):
        try:
            load_config(path)
        except ValueError as e:
            if "flash_attn is not installed" not in str(e) and "deepspeed is not installed" not in str(e):
                raise


def test_the_deepspeed_launchers_local_rank_argument_is_accepted(monkeypatch):
    """`deepspeed --num_gpus N --module trainer.train` passes --local_rank=N before the config."""
    from trainer.train import parse_args

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    args = parse_args(["--local_rank=1", "--config", "launch/configs/tiny.yaml", "steps=3"])
    assert args.overrides == ["steps=3"]
    import os

    assert os.environ["LOCAL_RANK"] == "1"


def test_check_config_flag_validates_without_training(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "trainer.train", "--check-config", f"run_dir={tmp_path}/run"],
                        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert not (tmp_path / "run").exists()
    bad = subprocess.run([sys.executable, "-m", "trainer.train", "--check-config", "debug.slow_phase=lunch"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "debug.slow_phase must be one of" in bad.stderr


def test_run_sh_keeps_exit_code_2_for_a_config_error(tmp_path):
    """torchrun would turn the trainer's 2 into 1: run.sh checks the config before launching anything."""
    import os
    env = {**os.environ, "TELEMETRY_WANDB": "disabled"}
    env.pop("TELEMETRY_RUNTIME_DIR", None)
    p = subprocess.run([str(ROOT / "launch/run.sh"), "--run-dir", str(tmp_path / "run"), "--steps", "2",
                        "--", "optim.bogus=1"], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
    assert "unknown config key 'optim.bogus'" in p.stderr
    assert "Traceback" not in p.stderr + p.stdout
    assert not (tmp_path / "run" / "telemetry" / "daemon.out").exists()  # no daemon was started


def test_every_dtype_the_config_doc_lists_is_accepted():
    import re
    doc = (ROOT / "docs" / "config.md").read_text()
    listed = re.search(r"`dtype` \(([^)]*)\)", doc).group(1)
    dtypes = [d.strip().split(";")[0] for d in listed.split("|")]
    assert dtypes and "bf16" in dtypes and "fp32" in dtypes
    for dtype in dtypes:
        assert load_config(None, [f"model.dtype={dtype}"]).model.dtype == dtype
    with pytest.raises(ValueError, match="fp16 would need loss scaling"):
        load_config(None, ["model.dtype=fp16"])
